"""What the e2e tests, the demo and the bench run on (test infrastructure, not tests).

- `plugin`: the `vpc-attach` executable run as a runtime runs it (`Plugin`, `Answer`) and the
  network configs the tests hand it (`base_conf`, `host_local`, `with_prev`);
- `kernel`: namespaces, links and a VPC's rules seen through iproute2 (`run_ip`, `links_in`);
- `kube`: admin access to a control plane through the official `kubernetes` client (`Kube`);
- `wait`: waiting on a condition, never a fixed sleep (`wait_until`);
- `cnibin`: a CNI bin dir with the reference plugins and our executables;
- `agentproc`: the node agent as a test process;
- `publishing`: BGPRouters, Pods and admission policies for publishing tests;
- `nodes`: simulated nodes (a namespace each, with the API server reachable inside);
- `rbac`: a second plugin identity, the packaged ClusterRole less some rules;
- `standalone`: the standalone build, built and staged as a node's installer stages it;
- `tinyfs`: a tiny tmpfs filled to the last inode or page, for state that meets a full disk;
- `ipam_files`: vpc-attach-ipam's state files read independently of its store;
- `cluster/`: a local Kubernetes control plane (`python -m e2e.harness.cluster`);
- `cri/`: containerd + runc with a CRI client (`python -m e2e.harness.cri`);
- `tools/`: the Go reference plugins and cnitool, built and cached (`python -m e2e.harness.tools`).
"""
