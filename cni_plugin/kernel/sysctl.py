"""Per-interface sysctls, written through /proc/sys of the calling thread's netns."""

from __future__ import annotations

from netconf.errors import KERNEL_FAILURE, CniError


def set_sysctl(key: str, value: str) -> None:
    """Write net.* sysctl `key` (dotted form; interface names may not contain dots here)."""
    path = "/proc/sys/" + key.replace(".", "/")
    try:
        with open(path, "r+", encoding="ascii") as handle:
            if handle.read().strip() == value:
                return
            handle.seek(0)
            handle.write(value)
    except OSError as exc:
        raise CniError(KERNEL_FAILURE,
                       f"failed to set sysctl {key}={value}: {exc.strerror}") from None


def get_sysctl(key: str) -> str:
    """Read a sysctl; code 100 if it does not exist."""
    path = "/proc/sys/" + key.replace(".", "/")
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise CniError(KERNEL_FAILURE, f"failed to read sysctl {key}: {exc.strerror}") from None


def host_side_sysctls(ifname: str, ipv4: bool, ipv6: bool) -> dict[str, str]:
    """What the host end of an attachment needs to route for its Pod (SPEC §5)."""
    wanted: dict[str, str] = {}
    # Like the reference ptp plugin, forwarding is also switched on host-wide per family.
    if ipv4:
        wanted["net.ipv4.ip_forward"] = "1"
        wanted[f"net.ipv4.conf.{ifname}.rp_filter"] = "0"
        wanted[f"net.ipv4.conf.{ifname}.forwarding"] = "1"
        wanted[f"net.ipv4.conf.{ifname}.proxy_arp"] = "1"
    if ipv6:
        wanted["net.ipv6.conf.all.forwarding"] = "1"
        wanted[f"net.ipv6.conf.{ifname}.forwarding"] = "1"
        wanted[f"net.ipv6.conf.{ifname}.proxy_ndp"] = "1"
    return wanted
