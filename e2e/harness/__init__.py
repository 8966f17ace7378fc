"""What the e2e tests, the demo and the bench stand on (test infrastructure, not tests). A test
module holds tests; the scenes they share live here, and no test module imports another
(`tests/test_suite_layout.py`).

The plugin and the kernel:
- `plugin`: the `vpc-attach` executable run as a runtime runs it (`Plugin`, `Answer`) and the
  network configs the tests hand it (`base_conf`, `host_local`, `with_prev`);
- `cnibin`: a CNI bin dir with the reference plugins and our executables;
- `agentproc`: the node agent as a test process;
- `kernel`: namespaces, links and a VPC's rules seen through iproute2 (`run_ip`, `links_in`);
- `packets`: real packets between namespaces (listeners, senders, ping, nft counters);
- `bpf`: a private bpffs, maps pinned in it, and what `bpftool` reads back;
- `ipam_files`: vpc-attach-ipam's state files read independently of its store;
- `tinyfs`: a tiny tmpfs filled to the last inode or page, for state that meets a full disk;
- `victims`: what a tenant's config points the plugin at, to prove it untouched;
- `malformed`: malformed input for the executable, the CNI code each must get, and how its
  answer is judged (one error object, nothing created);
- `datapath_node`: a node netns with an uplink to `ext` and the plugin inside, Pods attached to
  it, for the datapath's boundary tests;
- `standalone`, `image`: the standalone build and the DaemonSet's image, built and cached;
  `image_layout`: the image archive read from outside, its layer run in a chroot of itself.

The cluster and the nodes:
- `kube`: admin access to a control plane through the official `kubernetes` client (`Kube`);
- `wait`: waiting on a condition, never a fixed sleep (`wait_until`);
- `publishing`: BGPRouters, Pods and admission policies; `Node` (a simulated node's name,
  router and plugin);
- `nodes`: simulated nodes (a namespace each, with the API server reachable inside);
- `tenancy`: VPCBindings and tenant namespaces; `rbac`: a plugin identity with fewer rules;
- `doctor`: `vpc-attach doctor` run on a node and its report read (`doctor_on`), and a node
  made for the doctor's own tests (`doctor_node`);
- `ipamclaims`: the IPAMClaim CRD from its Go module, claims read back;
- `kubevirt/`: stand-ins for KubeVirt (claims, virt-launcher Pods, the migration timestamp
  written on its behalf), a VM network on a node, a VM moving across galactic sites, live
  migrations between two;
- `galactic/`: galactic next to vpc-attach: its builds, sites running galactic-router and a
  collector (`sites`, `collector`, `deployment`), its eBPF datapath on nodes (`datapath`,
  `vpc_nodes`);
- `report`: figures a test module reports at the end of the run;
- `cluster/`: a local Kubernetes control plane (`python -m e2e.harness.cluster`);
- `faults/`: a fault proxy in front of the API server, admission refusals;
- `sessions`: how a verb reaches the API server, counted (sessions, clients, connections,
  deadlines) through the fault proxy and the plugin's log;
- `cri/`: containerd + runc with a CRI client (`python -m e2e.harness.cri`); `cri_runtime`: that
  runtime as a node's, calling the conflists an operator writes, and what a test reads back;
- `tools/`: the Go reference plugins and cnitool, built and cached (`python -m e2e.harness.tools`);
- `vm/`: the full-kernel VM the `fullkernel` tests run in where this kernel lacks VRF.
"""
