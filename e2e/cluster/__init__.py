"""The control plane harness's former module path, kept for tests outside this repository
(`python -m e2e.cluster up|down|build`); the code lives in `e2e.harness.cluster`."""
