"""Attachments in the kernel (SPEC §5): veth and tap, built from the kernel primitives.

One module per job, imported by the verbs directly: `ref` (`AttachmentRef`, which attachment a
step works on), `node` (the host netlink socket, the host and VPC locks, the VPC's table or
VRF, node set-up, releasing an unused VPC), `create` (`open_links` → `VethLinks` (`veth`) or
`TapLinks` (`tap`), whose `create` returns the `CreatedVeth`/`CreatedTap` that alone has
`configure`), `new_links` (what the links of both kinds are made with and in: `LinkOptions`, the
VPC's table, the MTU), `host_side` (what both make on the host side), `sid` (answering the VPC's
SID: the kernel's End.DT46 or galactic's datapath), `segmentation` (a registered veth's Pod side
without segmentation offloads: `galacticOffloads`), `detach` (DEL), `check` (CHECK's
differences).
"""
