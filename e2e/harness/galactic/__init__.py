"""galactic next to vpc-attach: what its router reads of our objects and announces, and its
eBPF uSID datapath on simulated nodes.

``build``: galactic-router, galactic-cni and programs of ours on galactic's own code (the
slice verdict, the eBPF vrf_table sweep) from the source archives in ``../shared/peers/``,
gobgpd/gobgp from the Go module, cached outside the repository. ``fabric``: one router per
simulated node and a gobgpd collector peered with all of them. ``rib``: the collector's EVPN
routes as records. ``verdict``: what the sidecar code makes of EndpointSlices. ``datapath``:
nodes with their own bpffs running galactic-cni and galactic-router over an IPv6 underlay;
``maps``: their pinned maps and tc filters as records; ``sweep``: galactic's vrf_table GC run
once. ``sites``: simulated nodes each running galactic-router beside vpc-attach, peered with the
collector (`start_site`, the one way a test starts one); ``collector``: what the collector holds
over time (waited for, sampled, read as a timeline); ``deployment``: Pods of one attachment
spread over three sites, each behind its fault proxy. ``vpc_nodes``: vpc-attach on the datapath
nodes, Pods attached there and what galactic-router wrote for them. ``chain``: galactic's own
CNI chain (galactic-veth → galactic-bgp) on a datapath node; ``rows``: what an ADD wrote into
the pinned maps, normalised where two attachments must differ; ``transfer``: a bulk TCP
transfer with its retransmits and the underlays' drops, and a link's offloads; ``leftovers``:
what galactic's GC passes must find (a planted row, an orphaned advertisement, a tap) and what
they must keep. CLI: ``python -m
e2e.harness.galactic build``.
"""
