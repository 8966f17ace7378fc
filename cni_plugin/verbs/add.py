"""ADD: parse → delegate IPAM (undo on failure) → kernel → publish → result.

The IPAM delegate runs while the links are created; the addresses are collected when the kernel
work needs them (attachment.attach_veth / attach_tap call `addressing`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from cni_plugin import attachment
from cni_plugin.attachment import Addressing
from cni_plugin.core.deadline import Deadline
from cni_plugin.core.locks import file_lock
from cni_plugin.core.request import Invocation, Request
from cni_plugin.core.rollback import Rollback
from cni_plugin.ipam import delegate
from cni_plugin.publish import Publisher
from netconf.errors import INVALID_CONFIG, CniError
from netconf.result import Result


def add(request: Request) -> Result:
    """Attach the container and answer its result (in the 1.1.0 shape)."""
    inv = Invocation.parse(request)
    publisher = Publisher.prepare(inv)  # settings, API and router, before any change (SPEC §4)
    prev = inv.conf.prev()
    rollback = Rollback()
    try:
        allocation = _start_allocation(inv, prev, rollback)
        addressing = cache(lambda: Addressing.from_result(allocation()))
        if inv.conf.attachment == "existing":
            result = allocation()
        else:
            with file_lock(attachment.lock_path(inv, attachment.host_link_name(inv)),
                           inv.deadline.remaining()):
                attach = attachment.attach_veth if inv.conf.attachment == "veth" \
                    else attachment.attach_tap
                result = chain(prev, attach(inv, addressing, rollback))
        if publisher is not None:
            publisher.publish(addressing(), rollback)
    except BaseException:
        rollback.run()
        raise
    rollback.forget()
    return result


def _start_allocation(inv: Invocation, prev: Result | None,
                      rollback: Rollback) -> Callable[[], Result]:
    """The addresses, as a call: delegated IPAM (started now, its release recorded for
    rollback; the links are made while it runs) or prevResult."""
    if inv.conf.attachment == "existing":
        if prev is None:
            raise CniError(INVALID_CONFIG, "missing config key 'prevResult'",
                           "attachment 'existing' publishes what an earlier plugin created")
        return lambda: prev
    ipam = inv.conf.ipam
    if ipam is None:
        return Result  # a tap without ipam is L2 only
    ipam_type = str(ipam["type"])
    pending = delegate.PendingAdd(ipam_type, inv.env, inv.stdin, inv.deadline)

    def release(deadline: Deadline) -> None:
        pending.settle()
        if not pending.failed:  # an ADD it refused allocated nothing
            delegate.delete(ipam_type, inv.env, inv.stdin, deadline)

    rollback.created(f"IPAM allocation ({ipam_type})", release)
    return pending.result


def chain(prev: Result | None, ours: Result) -> Result:
    """Append our interfaces, ips and routes to prevResult's (a later plugin in a chain)."""
    if prev is None:
        return ours
    merged = prev.copy_deep()
    offset = len(merged.interfaces)
    merged.interfaces.extend(ours.interfaces)
    for ip in ours.ips:
        moved = ip.model_copy()
        if moved.interface is not None:
            moved.interface += offset
        merged.ips.append(moved)
    merged.routes.extend(ours.routes)
    return merged
