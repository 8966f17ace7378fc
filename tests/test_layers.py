"""The import graph of the product: layers point down only, and no module circle exists.

netconf ← cni_plugin.core ← domain (kernel, kube, ipam, publish, galactic, attachment, tenancy)
← verbs
← dispatch ← transports (cli, ipam_cli, agent, install, doctor). Every import counts, including
the ones inside functions and under TYPE_CHECKING. The kernel's steps (kernel, galactic,
attachment) never import the request: they take the facts they read. `python
tests/test_layers.py [ROOT]` prints the graph.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("netconf", "cni_plugin")
# Module prefix -> layer (0 is the bottom). The longest matching prefix decides.
LAYERS: dict[str, int] = {
    "netconf": 0,
    "cni_plugin": 1,  # the package itself; its modules are placed below
    "cni_plugin.core": 1,
    "cni_plugin.kernel": 2, "cni_plugin.kube": 2, "cni_plugin.ipam": 2, "cni_plugin.galactic": 2,
    "cni_plugin.publish": 2, "cni_plugin.attachment": 2, "cni_plugin.tenancy": 2,
    "cni_plugin.kubevirt": 2, "cni_plugin.kubevirt.doctor": 5,  # doctor's checks of the room
    "cni_plugin.policy": 2,
    "cni_plugin.verbs": 3,
    "cni_plugin.dispatch": 4,
    "cni_plugin.cli": 5, "cni_plugin.ipam_cli": 5, "cni_plugin.stdio": 5, "cni_plugin.agent": 5,
    "cni_plugin.install": 5, "cni_plugin.doctor": 5,
}
LAYER_NAMES = ("netconf", "core", "domain", "verbs", "dispatch", "transports")
# Inside the domain layer, which package may use which (none may use publish or attachment
# from below them; publishing and the kernel never meet).
DOMAIN_USES: dict[str, set[str]] = {
    "cni_plugin.kernel": set(),
    "cni_plugin.kube": set(),
    "cni_plugin.ipam": {"cni_plugin.kube"},  # cluster pools claim IPAMBlocks
    # galactic's datapath is written through the kernel's bpf(2) and TC primitives.
    "cni_plugin.galactic": {"cni_plugin.kernel"},
    "cni_plugin.attachment": {"cni_plugin.kernel", "cni_plugin.galactic"},
    "cni_plugin.publish": {"cni_plugin.kube"},
    "cni_plugin.tenancy": {"cni_plugin.kube"},
    # Policy (SPEC §17) reads the cluster (kube, publish's resources) and the Pod's network
    # selections (kube), matches labels as tenancy does, writes the kernel.
    "cni_plugin.policy": {"cni_plugin.kernel", "cni_plugin.kube", "cni_plugin.publish",
                          "cni_plugin.tenancy"},
    # A feature's room sits above the rooms it spans: KubeVirt's claims keep IPAM records and
    # its migrations change what publishing wrote; neither of those knows of it.
    "cni_plugin.kubevirt": {"cni_plugin.kube", "cni_plugin.ipam", "cni_plugin.publish"},
}
# The kernel's steps take the names, tables and paths they read, never the whole request: the
# verbs pick those out of the Invocation once (cni_plugin/verbs/facts.py).
REQUEST = "cni_plugin.core.request"
REQUEST_FREE = ("cni_plugin.kernel", "cni_plugin.galactic", "cni_plugin.attachment")


def modules(root: Path) -> dict[str, Path]:
    """Every module of the product under root, by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The product modules `name` imports, wherever in the file the import statement is."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from package import module` imports that module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph(root: Path) -> dict[str, set[str]]:
    """Module -> the product modules it imports."""
    found = modules(root)
    known = set(found)
    return {name: set(imports_of(name, path, known)) for name, path in found.items()}


def placed(name: str, table: dict[str, int] | dict[str, set[str]]) -> str | None:
    """The longest prefix of name (on dots) that table has."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in table:
            return prefix
    return None


def layer(name: str) -> int:
    """The layer of a module (a module nobody placed fails the test that lists them)."""
    prefix = placed(name, LAYERS)
    return LAYERS[prefix] if prefix is not None else -1


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Imports that point up a layer, or across the domain layer against DOMAIN_USES."""
    wrong = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if layer(target) > layer(source):
                wrong.append(f"{source} ({LAYER_NAMES[layer(source)]}) imports {target} "
                             f"({LAYER_NAMES[layer(target)]})")
            elif layer(source) == layer(target) == 2:
                mine, theirs = placed(source, DOMAIN_USES), placed(target, DOMAIN_USES)
                if mine and theirs and mine != theirs and theirs not in DOMAIN_USES[mine]:
                    wrong.append(f"{source} imports {target} (domain: {mine} may use "
                                 f"{sorted(DOMAIN_USES[mine]) or 'no other package'})")
    return wrong


def request_readers(edges: dict[str, set[str]]) -> list[str]:
    """Modules of REQUEST_FREE that import the request (and with it the Invocation)."""
    return sorted(source for source, targets in edges.items() if REQUEST in targets and
                  any(source == free or source.startswith(f"{free}.") for free in REQUEST_FREE))


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    assert [name for name in graph(REPO) if layer(name) < 0] == []


def test_no_import_points_up_a_layer() -> None:
    assert upward_imports(graph(REPO)) == []


def test_no_import_circle() -> None:
    assert circles(graph(REPO)) == []


def test_kernel_steps_never_import_the_request() -> None:
    assert request_readers(graph(REPO)) == []


def test_the_checks_catch_what_they_look_for() -> None:
    # The checks themselves, on made-up graphs: one upward import and one circle; one kernel
    # step that imports the request.
    edges = {"cni_plugin.core.request": {"cni_plugin.verbs.add"},
             "cni_plugin.verbs.add": {"cni_plugin.core.request"},
             "cni_plugin.publish.bgp": {"cni_plugin.attachment"}}
    assert circles(edges) == [["cni_plugin.core.request", "cni_plugin.verbs.add"]]
    assert len(upward_imports(edges)) == 2
    assert request_readers({"cni_plugin.attachment.node": {"cni_plugin.core.request"},
                            "cni_plugin.verbs.add": {"cni_plugin.core.request"}}) == [
        "cni_plugin.attachment.node"]


def report(root: Path) -> str:
    """Layers with their modules, then the circles and upward imports."""
    edges = graph(root)
    lines = []
    for number, title in enumerate(LAYER_NAMES):
        members = sorted(n for n in edges if layer(n) == number)
        lines.append(f"{number} {title}: {len(members)} modules")
    unplaced = sorted(n for n in edges if layer(n) < 0)
    if unplaced:
        lines.append(f"unplaced: {', '.join(unplaced)}")
    found = circles(edges)
    lines.append(f"circles: {len(found)}")
    lines.extend(f"  {' -> '.join(group)}" for group in found)
    wrong = upward_imports(edges)
    lines.append(f"upward imports: {len(wrong)}")
    lines.extend(f"  {line}" for line in wrong)
    readers = request_readers(edges)
    lines.append(f"kernel steps importing the request: {len(readers)}")
    lines.extend(f"  {reader}" for reader in readers)
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO))
