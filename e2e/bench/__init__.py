"""`python -m e2e.bench`: vpc-attach side by side with the Go reference CNI plugins (issue 5).

Modules: `suite` (the recipe of one run), `run` (what its steps share), `plan` (the subjects and
rows), `planes` (the two control planes and their Pods), `population` (objects in the control
planes), `agents` (a node agent per control plane), `rounds` (the sequential ADD/DEL and
VERSION rounds), `bursts` (32 concurrent ADDs, then DELs), `logs` (the plugin's own log lines),
`memory` (peak RSS, the agents' resident sets), `machine` (the machine and settings lines),
`subjects` (what is measured and how it is configured), `spawn` (exec a plugin like a runtime;
wall time and peak RSS), `kernel` (the run's namespaces and their removal), `stats` (median,
nearest-rank p95), `targets` (issue 5's limits), `report` (latest.md / .json / .png). Results
land in `e2e/bench/results/` unless `--results` says otherwise.
"""
