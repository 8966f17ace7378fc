"""The node agent (SPEC §11): serves the verbs over a Unix socket with warm clients and caches.

`protocol` and `client` use only the standard library: the `vpc-attach` executable imports
them on its forwarding path. `server` is the agent itself.
"""
