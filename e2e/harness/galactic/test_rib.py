"""The galactic harness's parsers: the collector's JSON RIB (as gobgp v4 prints it) and the
slice-verdict program's output, round-tripped from records through that shape."""

from __future__ import annotations

import base64
import ipaddress
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from e2e.harness.galactic.rib import EvpnRoute, parse_rib, sorted_routes
from e2e.harness.galactic.verdict import SidecarRoute, Verdict, parse_verdicts

ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
prefixes = st.one_of(
    st.builds(lambda a, n: str(ipaddress.ip_network(f"{a}/{n}", strict=False)), ipv4,
              st.integers(0, 32)),
    st.builds(lambda a, n: str(ipaddress.ip_network(f"{a}/{n}", strict=False)), ipv6,
              st.integers(0, 128)))
route_targets = st.builds(lambda asn, n: f"{asn}:{n}", st.integers(1, 65535),
                          st.integers(0, 2**32 - 1))
routes = st.builds(
    EvpnRoute, prefix=prefixes,
    rd=st.builds(lambda a, n: f"{a}:{n}", ipv4, st.integers(0, 65535)),
    route_targets=st.lists(route_targets, max_size=3, unique=True).map(lambda v: tuple(sorted(v))),
    sid=st.none() | st.ip_addresses(v=6).map(str), next_hop=ipv4 | ipv6, router=ipv4 | ipv6)


def _gobgp_path(route: EvpnRoute) -> dict[str, Any]:
    """A path as `gobgp global rib -a evpn -j` prints it (v4.8.0), with attributes the parser
    must skip: ORIGIN, LOCAL_PREF, an extended community that is not a route target."""
    admin, assigned = route.rd.rsplit(":", 1)
    nlri = {"type": 5, "value": {"rd": {"type": 1, "admin": admin, "assigned": int(assigned)},
                                 "esi": "single-homed", "etag": 0, "prefix": route.prefix,
                                 "gateway": "0.0.0.0", "label": 0}}
    communities = [{"type": 0, "subtype": 2, "value": rt} for rt in reversed(route.route_targets)]
    communities.append({"type": 6, "subtype": 0, "value": "encap type 8"})
    attrs: list[dict[str, Any]] = [
        {"type": 1, "value": 0}, {"type": 5, "value": 100},
        {"type": 16, "value": communities},
        {"type": 14, "nexthop": route.next_hop, "afi": 25, "safi": 70, "value": [{"NLRI": nlri}]},
    ]
    if route.sid is not None:
        sid = base64.b64encode(ipaddress.IPv6Address(route.sid).packed).decode()
        attrs.append({"type": 40, "flags": 192, "TLVs": [{"type": 5, "SubTLVs": [
            {"type": 1, "sid": sid, "flags": 0, "endpoint_behavior": 20}]}]})
    return {"Family": 0, "nlri": nlri, "best": True, "attrs": attrs, "stale": False,
            "peer-id": route.router, "peer-address": route.router}


@given(st.lists(routes, max_size=6))
def test_rib_json_parses_back_to_the_routes_it_was_made_of(expected: list[EvpnRoute]) -> None:
    rib: dict[str, list[dict[str, Any]]] = {}
    for route in expected:
        key = f"[type:Prefix][rd:{route.rd}][etag:0][prefix:{route.prefix}]"
        rib.setdefault(key, []).append(_gobgp_path(route))
    assert parse_rib(json.dumps(rib)) == sorted_routes(expected)


def test_an_empty_rib_is_no_routes() -> None:
    assert parse_rib("{}") == [] and parse_rib("null") == []


verdicts = st.builds(
    Verdict, namespace=st.text(min_size=1), name=st.text(min_size=1), selected=st.booleans(),
    route=st.none() | st.builds(SidecarRoute, vpc=st.text(), prefix=prefixes,
                                sid=st.ip_addresses(v=6).map(str)),
    error=st.text())


@given(st.lists(verdicts, max_size=5))
def test_verdict_output_parses_back_to_the_verdicts(expected: list[Verdict]) -> None:
    text = json.dumps([{"namespace": v.namespace, "name": v.name, "selected": v.selected,
                        "route": None if v.route is None else
                        {"vpc": v.route.vpc, "prefix": v.route.prefix, "sid": v.route.sid},
                        "error": v.error} for v in expected])
    assert parse_verdicts(text) == expected
