"""Unit and property tests (no root, no network, no host state), and what the e2e tests share
with them without the e2e extra: `tests.ipam_files`, vpc-attach-ipam's state read from outside.
Nothing here imports `e2e` (`tests/test_suite_layout.py`)."""
