"""galactic-router next to vpc-attach: what it reads of our objects, and what it announces.

``build``: galactic-router and a slice-verdict program (galactic's own ingress-sidecar code) from
the source archives in ``../shared/peers/``, gobgpd/gobgp from the Go module, cached outside the
repository. ``fabric``: one router per simulated node and a gobgpd collector peered with all of
them. ``rib``: the collector's EVPN routes as records. ``verdict``: what the sidecar code makes of
EndpointSlices. CLI: ``python -m e2e.harness.galactic build``.
"""
