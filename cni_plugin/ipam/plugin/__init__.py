"""`vpc-attach-ipam`: the IPAM plugin for vpc-attach, compatible with galactic-ipam (SPEC §4).

Modules: `config` (the ipam block), `pool` (block arithmetic), `store` (on-disk state of one
pool), `allocator` (allocate/release across pools), `verbs`; the executable is
`cni_plugin/ipam_cli.py`.
Keys and decisions are documented in README.md next to this file.
"""
