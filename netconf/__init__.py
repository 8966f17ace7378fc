"""Typed models of everything vpc-attach reads and writes on the CNI boundary.

`config` (the plugin stanza), `runtime` (CNI_* environment, CNI_ARGS), `capabilities` (the `ips`
and `mac` a runtime asks for), `host` (host settings: the node's settings, read once per verb),
`node_groups` (the node's own settings in groups: datapath, galactic, policy), `node_setting`
(how such a setting is declared and resolved), `node_parsers` (their values read, code 7),
`result` (CNI results of every version), `errors` (the error object and its codes), `versions`
(the CNI versions spoken), `base62` (VPC and attachment identifiers), `formats` (the
`formatVersion` of every on-node file: what a reader accepts, code 108 for a newer one).
"""
