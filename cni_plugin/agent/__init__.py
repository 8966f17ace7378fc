"""The node agent (SPEC §11): serves the verbs over a Unix socket with warm clients and caches.

`protocol` and `client` use only the standard library: the `vpc-attach` executable imports
them on its forwarding path. `server` is the agent itself; `warm` its cluster source (pooled
API clients, the watch caches); `reaper` deletes retired links after DEL answered; `events`
writes the Pod's Events after ADD answered; `metrics` and `health` are its HTTP endpoint;
`policies` keeps the node's policy rules current (SPEC §17: watches, coalesced passes, Events).
"""
