"""Typed models of everything vpc-attach reads and writes on the CNI boundary."""
