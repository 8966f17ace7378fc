"""Writes or reads on-node formats with the vpc-attach tree first on sys.path (this one, or
the previous release's): `python format_probe.py write|read DIRECTORY FORMAT...` prints what it
wrote or read of each format (in DIRECTORY/FORMAT) as one JSON line, a format that raised as
its error. tests/test_formats_across_releases.py runs it with one tree writing and the other
reading (one process per tree and step: a process per format cost CI 25 s more). Only
functions both releases have are called; the objects they take are built from plain values
(duck-typed where a release passes a large one), so nothing here depends on either tree's
internals beyond the format's own writer and reader."""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from types import SimpleNamespace
from typing import Any

CONTAINER, IFNAME, NETWORK = "c0ffee", "eth0", "net-a"


def _module(*names: str) -> Any:
    """The first of `names` the tree has (a module moved between releases)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(names[0])


def ipam(verb: str, directory: str, container: str = CONTAINER) -> dict[str, Any]:
    """vpc-attach-ipam's verb through its CNI boundary (its own process: the executable's
    entry point), pools under `directory`."""
    conf = {"cniVersion": "1.1.0", "name": NETWORK, "type": "vpc-attach",
            "ipam": {"type": "vpc-attach-ipam", "dataDir": os.path.join(directory, "ipam"),
                     "ipv4_subnet": "10.7.0.0/24", "ipv6_subnet": "fd00:7::/64"}}
    environ = {"CNI_COMMAND": verb, "CNI_CONTAINERID": container, "CNI_IFNAME": IFNAME,
               "CNI_NETNS": "/var/run/netns/probe", "CNI_PATH": "/nonexistent",
               "VPC_ATTACH_IPAM_DATA_ROOT": directory,
               "VPC_ATTACH_HOST_CONFIG": os.path.join(directory, "no-host.json")}
    import subprocess
    done = subprocess.run([sys.executable, "-c", "from cni_plugin.ipam_cli import main; main()"],
                          input=json.dumps(conf).encode(), env={**os.environ, **environ},
                          capture_output=True, timeout=60, check=False)
    answer = json.loads(done.stdout or b"null")
    return {"status": done.returncode, "ips": sorted(ip["address"] for ip in
                                                     (answer or {}).get("ips", []))
            if done.returncode == 0 else answer}


def write(kind: str, directory: str) -> Any:
    if kind == "ipam":
        return ipam("ADD", directory)
    if kind == "choice":
        choice = _module("cni_plugin.tenancy.choice")
        choice.write_record(SimpleNamespace(
            host=SimpleNamespace(lock_dir=directory),
            env=SimpleNamespace(container_id=CONTAINER, ifname=IFNAME),
            conf=SimpleNamespace(name=NETWORK, vpc="aB3", vpcattachment="7")))
        return [CONTAINER, IFNAME, "aB3", "7"]
    if kind == "tables":
        _module("cni_plugin.kernel.tableids").keep(directory, "G0000000aBV", 17)
        return {"G0000000aBV": 17}
    if kind == "claims":
        _module("cni_plugin.ipam.plugin.claimed").note(directory, "uid-1", "/pools/net-a/p")
        return [["uid-1"], ["/pools/net-a/p"]]
    if kind == "blocks":
        store = _module("cni_plugin.ipam.plugin.store")
        with store.PoolState(os.path.join(directory, "pool"), 5.0).locked() as state:
            state.write_block(store.BlockRecord("b-1", "10.8.0.0/28", "uid-b", "held"))
        return [["b-1", "10.8.0.0/28", "uid-b", "held"]]
    if kind == "registration":
        layout = _module("cni_plugin.galactic.layout")
        row, use = (layout.MAPS[0], b"\x01\x02", b"\x03\x04"), (layout.MAPS[1], b"\x05")
        _write_registration(directory, row, use)
        return {"rows": [[row[0].name, "0102", "0304"]], "of": [[CONTAINER, IFNAME]]}
    if kind == "migration":
        migration = _module("cni_plugin.kubevirt.migration", "cni_plugin.publish.migration")
        migration.write_pending(directory, migration.PendingTarget(**_pending(migration)))
        return [[CONTAINER, "pod-t", "node-s"]]
    if kind == "host":
        hostfiles = _module("cni_plugin.install.hostfiles")
        target = hostfiles.HostSettingsFile(
            node_name="worker-1", kubeconfig="/etc/vpc-attach/kubeconfig", log_file=None,
            log_level="debug", agent_socket="/run/s.sock", namespace="bgp")
        with open(os.path.join(directory, "host.json"), "wb") as handle:
            handle.write(target.target("/etc/vpc-attach/host.json").content)
        return ["worker-1", "/etc/vpc-attach/kubeconfig", "debug", "/run/s.sock", "bgp"]
    if kind == "manifest":
        manifest = _module("cni_plugin.install.manifest")
        written = manifest.Manifest(files={"/opt/cni/bin/vpc-attach":
                                           manifest.Entry("sha256:ab")},
                                    dirs=["/etc/vpc-attach"], bundles=["/b/1"])
        with open(os.path.join(directory, "manifest.json"), "wb") as handle:
            handle.write(written.serialized())
        return [{"/opt/cni/bin/vpc-attach": "sha256:ab"}, ["/etc/vpc-attach"], ["/b/1"]]
    raise ValueError(kind)


def _write_registration(directory: str, row: tuple[Any, bytes, bytes],
                        use: tuple[Any, bytes]) -> None:
    """A registration record, by the writer's signature in each release: galactic/record.py
    takes plain values, the previous release's registration.py took a Registration."""
    try:
        record = importlib.import_module("cni_plugin.galactic.record")
    except ModuleNotFoundError:
        _module("cni_plugin.galactic.registration").write_record(directory, SimpleNamespace(
            network=NETWORK, host_link="G0000000aB007H", container_id=CONTAINER, ifname=IFNAME,
            attachment_rows=lambda: [row], shared_rows=lambda: [use]))
        return
    record.write_record(directory, CONTAINER, IFNAME, network=NETWORK,
                        host_link="G0000000aB007H", rows=[row], uses=[use])


def read(kind: str, directory: str) -> Any:
    if kind == "ipam":  # the same attachment's ADD again finds its records; DEL frees them
        again = ipam("ADD", directory)
        released = ipam("DEL", directory)
        left = sorted(name for _, _, names in os.walk(os.path.join(directory, "ipam"))
                      for name in names if name[0].isdigit() or ":" in name)
        return {**again, "del": released["status"], "records left": left}
    if kind == "choice":
        return list(_module("cni_plugin.tenancy.choice").records_of(directory, NETWORK)[0])
    if kind == "tables":
        return _module("cni_plugin.kernel.tableids").kept(directory)
    if kind == "claims":
        claimed = _module("cni_plugin.ipam.plugin.claimed")
        return [claimed.uids(directory), claimed.pools_of(directory, "uid-1")]
    if kind == "blocks":
        store = _module("cni_plugin.ipam.plugin.store")
        with store.PoolState(os.path.join(directory, "pool"), 5.0).locked() as state:
            return [[b.name, b.cidr, b.uid, b.state] for b in state.blocks()]
    if kind == "registration":
        registration = _module("cni_plugin.galactic.record", "cni_plugin.galactic.registration")
        path = registration.record_path(directory, CONTAINER, IFNAME)
        rows = registration.read_record(path) or []
        return {"rows": [[m.name, k.hex(), v.hex()] for m, k, v in rows],
                "of": [list(of) for of in registration.records_of(directory, NETWORK)]}
    if kind == "migration":
        migration = _module("cni_plugin.kubevirt.migration", "cni_plugin.publish.migration")
        return [[p.container_id, p.pod_name, p.source.node]
                for p in migration.pending_targets(directory)]
    if kind == "host":
        host = _module("netconf.host")
        environ = {"VPC_ATTACH_HOST_CONFIG": os.path.join(directory, "host.json")}
        settings = host.resolve_host_settings({}, environ)
        return [settings.node_name, settings.kubeconfig, settings.log_level,
                settings.agent_socket, settings.namespace]
    if kind == "manifest":
        manifest = _module("cni_plugin.install.manifest")
        from pathlib import Path
        loaded = manifest.Manifest.load(Path(directory) / "manifest.json")
        return [{k: e.fingerprint for k, e in loaded.files.items()}, loaded.dirs,
                loaded.bundles]
    raise ValueError(kind)


def _pending(migration: Any) -> dict[str, Any]:
    return {"network": NETWORK, "container_id": CONTAINER, "ifname": IFNAME,
            "pod_namespace": "ns", "pod_name": "pod-t", "pod_uid": "u-t", "node": "node-t",
            "bgp_namespace": "galactic-system", "advertisement": "3e-7-node-t",
            "annotations": {"galactic.datum.net/netns.c0ffee": "/n"}, "spec": {"vrfID": 1},
            "owner_references": [], "created_by": f"{CONTAINER}/{IFNAME}/x",
            "slices": ["pod-t-3e-7-ipv6"],
            "source": migration.MigrationSource("ns", "pod-s", "node-s"),
            "source_advertisement": "3e-7-node-s", "source_slices": ["pod-s-3e-7-ipv6"]}


def each(action: str, where: str, kinds: list[str]) -> dict[str, Any]:
    """What `action` gave for each format, in its own directory; a traceback where it raised
    (the test of that format shows it, the others still run)."""
    done: dict[str, Any] = {}
    for kind in kinds:
        directory = os.path.join(where, kind)
        os.makedirs(directory, exist_ok=True)
        try:
            done[kind] = write(kind, directory) if action == "write" else read(kind, directory)
        except Exception:  # reported as that format's result
            done[kind] = {"error": traceback.format_exc()}
    return done


if __name__ == "__main__":
    action, where, *format_kinds = sys.argv[1:]
    print(json.dumps({"tree": os.path.dirname(_module("cni_plugin").__path__[0]),
                      "result": each(action, where, format_kinds)}))
