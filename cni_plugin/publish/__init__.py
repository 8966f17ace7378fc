"""Publishing an attachment to Kubernetes: BGP custom resources, then the Pod's EndpointSlice
(SPEC §6). Each verb's front door takes the verb's one session (its `VerbCluster`, opened by the
verb) and runs its API requests inside `boundary.api_boundary`, where an API refusal nobody
handled becomes a CNI error.

Front doors, one module per verb: `publisher` (ADD: `Publisher`, `Publication`), `withdraw`
(DEL: `unpublish`), `check` (CHECK: `published_differences`, `published_sid`), `status`
(STATUS: `publishing_status`, `router_has_sids`; SelfSubjectAccessReviews), `collect` (GC).
What they share: `boundary` (settings, `connected`, `api_boundary`), `context`
(`PublishContext`: the invocation, the session and the names it publishes under, computed
once), `resources` (publishing's kinds, labels, annotation keys); the objects: `bgp/` (one module
per lifecycle), `endpointslice`.
"""
