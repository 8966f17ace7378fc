"""The registry of the node's own settings (SPEC §14, §15): a setting is one field of a group,
declared with `node_setting` (its host-file key, environment variable, parser and default); a
group is a frozen dataclass declared with `node_settings_group` and resolved from the
environment, else the host file, else its defaults, by `resolve_group`. The groups themselves:
`netconf.node_groups`; their parsers: `netconf.node_parsers`. Nothing here reads a file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Settings of the node alone, in groups (SPEC §14, §15): each field is declared once with
# `node_setting` (its host-file key, environment variable, parser and default), and is then
# read from the environment, else the host file, refused in a network config, and resolved
# with its group by `NodeSettings`. A new setting is one field in its group.
T = TypeVar("T")
G = TypeVar("G", bound="DataclassInstance")


@dataclass(frozen=True)
class NodeSetting(Generic[T]):
    """Where one setting of the node comes from and how its value is read."""

    key: str  # the host file's key (refused in a network config)
    env: str | None  # the environment variable; None: the host file only
    parse: Callable[[Any, NodeSetting[T]], T]  # the value as set (never None or "") -> typed
    env_form: Callable[[str], Any] | None = None  # the variable's text -> the host file's form

    def raw(self, environ: Mapping[str, str], host_file: Mapping[str, Any]) -> Any:
        """The value as set: the environment's, else the host file's; None when unset."""
        text = environ.get(self.env) if self.env else None
        if text not in (None, ""):
            assert text is not None
            return self.env_form(text) if self.env_form else text
        value = host_file.get(self.key)
        return None if value in (None, "") else value

    @property
    def named(self) -> str:
        """Where an operator sets it, for a message."""
        return f"host file key {self.key}" + (f", environment {self.env}" if self.env else "")


def node_setting(key: str, env: str | None, parse: Callable[[Any, NodeSetting[T]], T],
                 default: T, *, env_form: Callable[[str], Any] | None = None) -> T:
    """A field of a node settings group (its default when unset)."""
    source = NodeSetting(key, env, parse, env_form)
    return field(default=default, metadata={"node_setting": source})


_GROUPS: list[type[Any]] = []


def node_settings_group(group: type[G]) -> type[G]:
    """Declare a frozen dataclass of `node_setting` fields a group of the node's settings."""
    _GROUPS.append(group)
    return group


def resolve_group(group: type[G], environ: Mapping[str, str],
                  host_file: Mapping[str, Any]) -> G:
    """A group's settings, each from the environment, else the host file, else its default;
    code 7 naming the first one malformed."""
    values: dict[str, Any] = {}
    for each in fields(group):
        source: NodeSetting[Any] = each.metadata["node_setting"]
        raw = source.raw(environ, host_file)
        if raw is not None:
            values[each.name] = source.parse(raw, source)
    return group(**values)


def grouped_keys() -> dict[str, str | None]:
    """Every setting of every group declared: host file key -> environment variable."""
    return {source.key: source.env for group in _GROUPS for each in fields(group)
            for source in (each.metadata["node_setting"],)}
