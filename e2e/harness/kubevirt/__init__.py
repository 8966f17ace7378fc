"""Stand-ins for KubeVirt, which does not run here, and the scenes built on them.

KubeVirt's controllers are not run by these tests: what they would write is written on their
behalf, each function named for the component it stands in for (`kubevirt_creates_claim`: the
IPAMClaim ipam-extensions' VMI controller makes; `kubevirt_starts_launcher`: a virt-launcher Pod
as virt-controller makes it and ipam-extensions' webhook leaves it; `kubevirt_marks_target_ready`:
virt-controller's ready timestamp on a migration target; `kubevirt_deletes_claim`;
`kubelet_reports_succeeded`: the phase kubelet writes for a Pod whose containers exited, proven
against a real kubelet by `e2e/test_node_kubevirt.py`).

- `standins`: those writes;
- `scene`: a VM network on one node (`Scene`, `vm_scene`) and one Pod's ADD/DEL (`Launcher`);
- `moves`: a VM whose claim follows it across galactic sites in a `scope: cluster` pool (`Move`);
- `migration`: live migrations between two galactic sites (`Migration`, `vm_pod`).
"""
