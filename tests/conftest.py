"""Shared test settings: no root, no network, no host state."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Other suites run on this machine at the same time; a slow first import must not fail a
# property test on its deadline.
settings.register_profile("vpc-attach", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("vpc-attach")
