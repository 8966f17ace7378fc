"""`python -m e2e.bench`: vpc-attach side by side with the Go reference CNI plugins (issue 5).

Modules: `suite` (the run), `subjects` (what is measured and how it is configured), `spawn`
(exec a plugin like a runtime; wall time and peak RSS), `kernel` (the run's namespaces and their
removal), `population` (objects in the control planes), `stats` (median, nearest-rank p95),
`targets` (issue 5's limits), `report` (latest.md / .json / .png). Results land in
`e2e/bench/results/` unless `--results` says otherwise.
"""
