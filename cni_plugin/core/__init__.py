"""The bottom layer above `netconf`: the request, its deadline, locks, names, rollback, logs.

Everything else in `cni_plugin` may import from here; nothing here imports from above.
"""
