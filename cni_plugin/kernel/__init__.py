"""Kernel primitives on the standard library: network namespaces, links, addresses, routes,
isolation, sysctls.

Netlink: `rtnl` (the rtnetlink client), `netns` (sockets bound to a netns), `links`, `addresses`
(with routes and neighbours), `isolation` (a VPC's VRF or marked table), `tableids` (the table
id a VPC keeps), `srv6` (End.DT46 SIDs), `tc` (clsact and bpf filters), `flower` (stateful tc
filters), `ethtool` (offload features). Elsewhere: `sysctl` (/proc/sys), `tap` (/dev/net/tun),
`bpf` (the bpf(2) syscall on galactic's pins), `hostfilter` (the `inet vpc_attach` table),
`nftables` (libnftables in a netns, else the `nft` executable: policy's tables in Pods).
"""
