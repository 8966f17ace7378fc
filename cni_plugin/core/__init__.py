"""The bottom layer above `netconf`: the request, its deadline, locks, names, rollback, logs.

`request` (Request, Invocation: what every verb receives), `deadline` (one per invocation),
`locks` (file locks with timeouts), `naming` (deterministic names), `rollback` (created-only),
`addressing` (an attachment's addresses from its IPAM result), `records` (small on-node records
written whole), `oplog` (the operator log's JSON lines), `logfile` (appending and rotating it).
Everything else in `cni_plugin` may import from here; nothing here imports from above.
"""
