"""The CNI verbs as plain functions over typed inputs (SPEC §2)."""
