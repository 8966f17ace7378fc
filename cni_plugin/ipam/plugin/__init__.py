"""`vpc-attach-ipam`: the IPAM plugin for vpc-attach, compatible with galactic-ipam (SPEC §4).

Modules: `config` (the ipam block; the node's ipamDataRoot), `pool` (block arithmetic),
`requests` (requested addresses matched to the pools), `store` (on-disk state of one pool:
records, an IPAMClaim's records among them), `allocator` (allocate/release across pools),
`verbs` (the plugin's verbs), `caller` (what vpc-attach lends it in-process: node settings,
session, deadline). Cluster pools (`scope: cluster`): `blocks` (block geometry and IPAMBlock
names; pure), `block_claims` (allocating in, claiming and giving back the node's blocks),
`kubeblocks` (the IPAMBlock API and the node's identity). An IPAMClaim's records (SPEC §16):
`claimed` (which pools hold which claim's records, node-wide), `lending` (a claim's address in
another node's block lent to the node running the VM). The executable is
`cni_plugin/ipam_cli.py`; KubeVirt's side of the claims is `cni_plugin/kubevirt/`.
Keys and decisions are documented in README.md next to this file.
"""
