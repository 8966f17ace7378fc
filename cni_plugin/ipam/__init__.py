"""IPAM: delegation to any IPAM plugin in CNI_PATH, and our own vpc-attach-ipam plugin."""
