"""BGP custom resources (SPEC §6), one module per lifecycle: `router` (this node's BGPRouter),
`instance` (the VPC's BGPVRFInstance: VRF ID and collisions, what uses it, undo, GC),
`advertisement` (this container's annotations merged into the attachment's BGPAdvertisement,
and their withdrawal), `check` (CHECK's differences), `crd_fit` (a route target the cluster's
BGPVRFInstance CRD refused, e.g. galactic's 9 digits a side); `spec` holds what they share. Writes
re-read on 409; created objects are recorded for rollback."""
