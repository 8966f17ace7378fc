"""IPAM: `delegate` (the IPAM plugin named by `ipam.type` behind one interface: exec'd from
CNI_PATH as libcni does, or vpc-attach-ipam in-process on the verb's session and deadline) and
`plugin/` (our own plugin, vpc-attach-ipam). KubeVirt's IPAMClaims are `cni_plugin/kubevirt/`'s.
"""
