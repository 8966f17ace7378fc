"""Which route targets galactic's own BGPVRFInstance CRD accepts: its CEL rule, as shipped
in datum-cloud/network's config/crd, against the route targets vpc-attach computes."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from cni_plugin.core import naming
from cni_plugin.publish.bgp.crd_fit import fits_galactic_crd
from netconf.base62 import encode_base62

# network.datumapis.com_bgpvrfinstances.yaml (galactic's pinned datum-cloud/network).
GALACTIC_RULE = re.compile(
    r"^([0-9]{1,9}[.][0-9]{1,9}[.][0-9]{1,9}[.][0-9]{1,9}|[0-9]{1,9}):[0-9]{1,9}$")


@given(st.integers(min_value=1, max_value=2**32 - 1), st.integers(min_value=0,
                                                                  max_value=2**48 - 1))
def test_a_route_target_fits_exactly_when_galactics_rule_accepts_it(asn: int, vpc: int) -> None:
    target = naming.route_target(asn, encode_base62(vpc))
    assert fits_galactic_crd(target) == bool(GALACTIC_RULE.match(target))


def test_the_first_vpc_that_does_not_fit() -> None:
    assert fits_galactic_crd(naming.route_target(65000, encode_base62(999_999_999)))
    assert not fits_galactic_crd(naming.route_target(65000, encode_base62(1_000_000_000)))
    assert not fits_galactic_crd(naming.route_target(4_200_000_000, encode_base62(62)))
