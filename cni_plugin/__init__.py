"""vpc-attach: a CNI plugin that attaches Pods and VMs to tenant VPCs.

Layers, bottom up (docs/architecture.md, "Layers"; `tests/test_layers.py` enforces them): `core`
(the request, deadline, locks, names, rollback, logs); the domain rooms `kernel`, `kube`, `ipam`,
`galactic`, `attachment`, `publish`, `tenancy`, `policy`, and the feature room `kubevirt` above
the rooms it spans; `verbs` (one recipe per CNI verb); `dispatch` (a request to a verb's
outcome); the transports `cli` (the `vpc-attach` executable), `ipam_cli` (`vpc-attach-ipam`),
`stdio`, `agent`, `install` and `doctor`.
"""
