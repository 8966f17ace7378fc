"""galactic's eBPF uSID datapath, where the node runs it (SPEC §15): its maps' layouts
(`layout`), finding and checking its pins (`pins`), the node's underlay as galactic sees it
(`underlay`), an attachment's rows written, undone and checked (`registration`), rows taken out
by DEL, GC and a VPC's release (`removal`), and the on-node record of what each attachment
registered (`record`)."""
