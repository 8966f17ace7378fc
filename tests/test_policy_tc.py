"""A tap's policy as tc filters (cni_plugin/policy/tc.py) and their netlink encoding
(cni_plugin/kernel/flower.py), pure, and what the enforcer does with a kernel that refuses
some of them (netlink stood in for). The kernel's reading of them is proven with real packets
in the full-kernel VM (e2e)."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.kernel import flower
from cni_plugin.kernel.rtnl import NLA_F_NESTED, iter_attrs, parse_attrs
from cni_plugin.kernel.tc import TC_H_EGRESS_HOOK, TC_H_INGRESS_HOOK, TCA_OPTIONS, TCMSG
from cni_plugin.policy import tc
from cni_plugin.policy.compile import Allow, Compiled, Direction, PortRange

NET = ipaddress.ip_network


def test_nothing_selected_means_no_filters() -> None:
    assert tc.render(Compiled(), 7) == []


def test_an_isolated_direction_drops_new_connections_no_rule_allowed_and_commits_the_rest(
        ) -> None:
    compiled = Compiled(ingress=Direction(True, (
        Allow((NET("10.0.0.5/32"), NET("fd00::5/128")), (PortRange("TCP", 80, 80),
                                                          PortRange("UDP", 53, 60)), "ns/p"),)))
    filters = tc.render(compiled, 42)
    to_vm = [f for f in filters if f.hook == TC_H_EGRESS_HOOK]
    from_vm = [f for f in filters if f.hook == TC_H_INGRESS_HOOK]
    # Towards the VM: ND passes, every packet is looked up, allowed new ones committed with
    # the ingress bit, new ones without it dropped.
    assert {f.icmpv6_type for f in to_vm if f.verdict == "ok"} == set(tc.ND_TYPES)
    drops = [f for f in to_vm if f.verdict == "drop"]
    assert {(f.protocol, f.ct_mark) for f in drops} == {(flower.ETH_P_IP, (0, 2)),
                                                      (flower.ETH_P_IPV6, (0, 2))}
    allows = sorted((f.src, f.ip_proto, f.ports) for f in to_vm
                    if f.conntrack is not None and f.conntrack.mark_mask == 2)
    assert allows == [("10.0.0.5/32", "tcp", (80, 80)), ("10.0.0.5/32", "udp", (53, 60)),
                      ("fd00::5/128", "tcp", (80, 80)), ("fd00::5/128", "udp", (53, 60))]
    assert all(f.priority < min(d.priority for d in drops) for f in to_vm if f not in drops)
    # From the VM (not isolated): looked up and committed, never dropped.
    assert not any(f.verdict == "drop" for f in from_vm)
    assert {f.conntrack.commit for f in from_vm if f.conntrack} == {False, True}
    assert all(f.conntrack.zone == 42 for f in filters if f.conntrack)
    assert tc.rule_count(filters) == 4


def test_an_allow_of_every_peer_and_port_is_one_filter_per_family() -> None:
    compiled = Compiled(egress=Direction(True, (Allow(None, None, "ns/p"),)))
    allowing = [f for f in tc.render(compiled, 1) if f.conntrack and f.conntrack.mark_mask]
    assert sorted((f.protocol, f.dst, f.ip_proto) for f in allowing) == [
        (flower.ETH_P_IP, None, None), (flower.ETH_P_IPV6, None, None)]
    assert all(f.hook == TC_H_INGRESS_HOOK and f.conntrack and f.conntrack.mark == 1
               for f in allowing)


def test_peers_not_known_yet_allow_nothing() -> None:
    compiled = Compiled(ingress=Direction(True, (Allow((), None, "ns/p"),)))
    assert tc.rule_count(tc.render(compiled, 1)) == 0


@given(st.lists(st.tuples(st.integers(1, 254), st.integers(1, 65535)), min_size=1,
                max_size=20, unique=True))
def test_handles_name_each_filter_and_stay_put(peers: list[tuple[int, int]]) -> None:
    compiled = Compiled(ingress=Direction(True, tuple(
        Allow((NET(f"10.1.0.{host}/32"),), (PortRange("TCP", port, port),), "o")
        for host, port in peers)))
    filters = tc.render(compiled, 3)
    handles = [(f.hook, f.priority, f.protocol, f.handle) for f in filters]
    assert len(set(handles)) == len(handles)
    assert [f.handle for f in tc.render(compiled, 3)] == [f.handle for f in filters]


def test_a_filter_encodes_its_keys_and_actions() -> None:
    flt = flower.FlowerFilter(TC_H_EGRESS_HOOK, 103, flower.ETH_P_IP,
                              conntrack=flower.ConnTrack(9, True, 2, 2), ct_state=tc.NEW,
                              src="10.0.0.0/24", ip_proto="tcp", ports=(5000, 5900))
    body = flower.filter_request(5, flt)
    _, ifindex, handle, parent, info = TCMSG.unpack_from(body)
    assert (ifindex, handle, parent, info >> 16) == (5, flt.handle, TC_H_EGRESS_HOOK, 103)
    options = parse_attrs(parse_attrs(body, TCMSG.size)[TCA_OPTIONS])
    assert options[flower.TCA_FLOWER_KEY_IPV4_SRC] == bytes([10, 0, 0, 0])
    assert options[flower.TCA_FLOWER_KEY_IPV4_SRC_MASK] == bytes([255, 255, 255, 0])
    assert struct.unpack("!H", options[flower.TCA_FLOWER_KEY_PORT_DST_MIN]) == (5000,)
    assert struct.unpack("!H", options[flower.TCA_FLOWER_KEY_PORT_DST_MAX]) == (5900,)
    assert options[flower.TCA_FLOWER_KEY_IP_PROTO] == bytes([6])
    actions = [parse_attrs(payload) for _, payload in
               iter_attrs(options[flower.TCA_FLOWER_ACT])]
    assert [a[flower.TCA_ACT_KIND].rstrip(b"\0") for a in actions] == [b"ct"]
    ct = parse_attrs(actions[0][flower.TCA_ACT_OPTIONS])
    assert struct.unpack("=H", ct[flower.TCA_CT_ZONE]) == (9,)
    assert struct.unpack("=H", ct[flower.TCA_CT_ACTION]) == (flower.TCA_CT_ACT_COMMIT,)
    assert struct.unpack("=IIiii", ct[flower.TCA_CT_PARMS])[2] == flower.TC_ACT_UNSPEC
    # act_ct parses its options strictly: without the flag Debian's 6.1 refuses the filter
    # (EINVAL, "NLA_F_NESTED is missing"; found in the full-kernel VM, issue 39).
    [(_, action)] = iter_attrs(options[flower.TCA_FLOWER_ACT])
    kinds = [struct.unpack_from("=HH", action, offset)[1] for offset in _offsets(action)]
    assert flower.TCA_ACT_OPTIONS | NLA_F_NESTED in kinds


def _offsets(data: bytes) -> list[int]:
    """Where each netlink attribute of data starts (their raw types are read there)."""
    found, offset = [], 0
    while offset + 4 <= len(data):
        found.append(offset)
        offset += (struct.unpack_from("=H", data, offset)[0] + 3) & ~3
    return found


def test_a_drop_is_a_gact_shot() -> None:
    flt = flower.FlowerFilter(TC_H_INGRESS_HOOK, 105, flower.ETH_P_IPV6, "drop",
                              ct_state=tc.NEW, ct_mark=(0, 1))
    options = parse_attrs(parse_attrs(flower.filter_request(1, flt), TCMSG.size)[TCA_OPTIONS])
    actions = [parse_attrs(p) for _, p in iter_attrs(options[flower.TCA_FLOWER_ACT])]
    assert [a[flower.TCA_ACT_KIND].rstrip(b"\0") for a in actions] == [b"gact"]
    gact = parse_attrs(actions[0][flower.TCA_ACT_OPTIONS])
    assert struct.unpack("=IIiii", gact[flower.TCA_GACT_PARMS])[2] == flower.TC_ACT_SHOT
    assert struct.unpack("=I", options[flower.TCA_FLOWER_KEY_CT_MARK_MASK]) == (1,)


def test_a_tap_whose_kernel_refuses_some_filters_keeps_none_of_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The full-kernel VM's case (issue 39): the batch took the gact filters and refused the
    act_ct ones; what it took is deleted again and the tap is reported."""
    import contextlib
    import errno

    from cni_plugin.core.deadline import Deadline
    from cni_plugin.kernel import netns
    from cni_plugin.kernel import tc as kernel_tc
    from cni_plugin.kernel.rtnl import NetlinkError
    from cni_plugin.kube.networks import NetworkName
    from cni_plugin.policy import enforce
    from cni_plugin.policy.networks import PodKey
    from cni_plugin.policy.records import LocalAttachment

    class Link:
        index = 7

    class Rtnl:
        def get_link(self, *, name: str) -> Link:
            return Link()

    deleted: list[tuple[int, int, int, int]] = []

    def refuse_ct(rtnl: object, ifindex: int, filters: list[flower.FlowerFilter]) -> None:
        raise NetlinkError(errno.ENOENT)

    monkeypatch.setattr(netns, "open_netlink", lambda *a, **k: contextlib.nullcontext(Rtnl()))
    monkeypatch.setattr(kernel_tc, "ensure_clsact", lambda rtnl, ifindex: False)
    monkeypatch.setattr(flower, "dump_handles", lambda rtnl, ifindex, hook: set())
    monkeypatch.setattr(flower, "add_filters", refuse_ct)
    monkeypatch.setattr(flower, "delete_filters",
                        lambda rtnl, ifindex, handles: deleted.extend(handles))
    tap = LocalAttachment("c1", "net1", "tap", "", "G1H", "v", "1", 300, PodKey("ns", "vm", "u"),
                          NetworkName("default", "n"))
    compiled = Compiled(ingress=Direction(True, ()))
    done = enforce._apply_tap(tap, compiled, Deadline(10))
    assert done.unenforced == enforce.NO_STATEFUL_TC
    assert sorted(deleted) == sorted((f.hook, f.priority, f.protocol, f.handle)
                                     for f in tc.render(compiled, 300))
