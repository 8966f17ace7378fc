"""CHECK: what is wrong with this container's BGP state."""

from __future__ import annotations

from cni_plugin.core.addressing import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.publish.bgp.advertisement import container_annotations, read_advertisement
from cni_plugin.publish.bgp.spec import prefixes_of, vrf_id
from cni_plugin.publish.context import PublishContext
from cni_plugin.publish.resources import NETNS_KEY, NODE_KEY, VRF_INSTANCES


def advertisement_differences(ctx: PublishContext, addressing: Addressing,
                              deadline: Deadline) -> list[str]:
    """What CHECK finds wrong with this container's BGP state."""
    ours = container_annotations(ctx, addressing)
    diffs: list[str] = []
    instance_name = ctx.instance_name
    instance = ctx.client.get(VRF_INSTANCES, instance_name, namespace=ctx.namespace,
                              deadline=deadline)
    if instance is None:
        diffs.append(f"BGPVRFInstance {instance_name!r} is missing")
    if not ours:
        return diffs
    name = ctx.advertisement_name
    adv = read_advertisement(ctx, deadline)
    if adv is None or NETNS_KEY + ctx.cid not in (adv["metadata"].get("annotations") or {}):
        # published by an earlier version, not converted yet: the shared form
        shared = read_advertisement(ctx, deadline, ctx.shared_advertisement_name)
        if shared is not None and \
                NETNS_KEY + ctx.cid in (shared["metadata"].get("annotations") or {}):
            name, adv = ctx.shared_advertisement_name, shared
    if adv is None:
        return [*diffs, f"BGPAdvertisement {name!r} is missing"]
    annotations = adv["metadata"].get("annotations") or {}
    for key, value in ours.items():
        if key.startswith(NODE_KEY):
            continue
        if annotations.get(key) != value:
            diffs.append(f"BGPAdvertisement {name!r} annotation {key} is "
                         f"{annotations.get(key)!r}, expected {value!r}")
    advertised = set(adv.get("spec", {}).get("prefixes") or [])
    for prefix in prefixes_of(ours):
        if prefix not in advertised:
            diffs.append(f"BGPAdvertisement {name!r} does not advertise {prefix}")
    if instance is not None and vrf_id(adv) != vrf_id(instance):
        diffs.append(f"BGPAdvertisement {name!r} has vrfID {vrf_id(adv)}, "
                     f"instance says {vrf_id(instance)}")
    return diffs
