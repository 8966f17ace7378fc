"""galactic's eBPF uSID datapath, where the node runs it (SPEC §15): its maps' layouts
(`layout`), finding and checking its pins (`pins`), the node's underlay as galactic sees it
(`underlay`), and an attachment's registration in it (`registration`)."""
