"""One pass of the agent over the node's attachments: compile each against the world the
watches hold, write what changed, and say what could not be enforced (and which policies'
parts were refused), for the Events, the gauges and `vpc-attach doctor`; then the periodic
repair of what was written, which gives way to the next change."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cni_plugin.core.deadline import Deadline
from cni_plugin.kernel.netns import NetnsGone
from cni_plugin.policy.compile import Compiler, World
from cni_plugin.policy.enforce import Enforcer
from cni_plugin.policy.records import LocalAttachment
from netconf.errors import CniError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unenforced:
    """An attachment a selecting policy cannot be enforced on, and why."""

    attachment: LocalAttachment
    reason: str
    policies: tuple[str, ...]  # "Kind namespace/name" of the policies selecting it


@dataclass
class SyncResult:
    """What one pass found."""

    rules: int = 0
    enforced: int = 0  # attachments with rules
    unenforced: list[Unenforced] = field(default_factory=list)
    failed: list[tuple[LocalAttachment, str]] = field(default_factory=list)


def sync(world: World, attachments: Sequence[LocalAttachment], enforcer: Enforcer,
         deadline: Deadline) -> SyncResult:
    """Every attachment made to enforce what the world says now."""
    result = SyncResult()
    compiler = Compiler(world)  # what the attachments share, resolved once
    for attachment in attachments:
        compiled = compiler.compile(attachment.target())
        try:
            enforced = enforcer.apply(attachment, compiled, deadline)
        except NetnsGone:
            enforcer.forget(attachment.key)  # the Pod is going: its DEL removes the record
            continue
        except CniError as exc:
            log.warning("policy of %s not written: %s", attachment.describe(), exc)
            result.failed.append((attachment, f"{exc.msg}: {exc.details}"))
            if compiled.enforced:
                result.unenforced.append(Unenforced(attachment, exc.msg, compiled.policies))
            continue
        result.rules += enforced.rules
        result.enforced += 1 if compiled.enforced else 0
        if enforced.unenforced and compiled.enforced:
            result.unenforced.append(Unenforced(attachment, enforced.unenforced,
                                                compiled.policies))
    return result


def repair(attachments: Sequence[LocalAttachment], enforcer: Enforcer, due: set[str],
           interrupted: Callable[[], bool], deadline: Deadline) -> None:
    """Rewrite whole each attachment whose key is `due` (taken out of it as it is done),
    until `interrupted()`: a change waiting is written first, the rest after its pass."""
    for attachment in attachments:
        if attachment.key not in due:
            continue
        if interrupted():
            return
        due.discard(attachment.key)
        try:
            enforcer.repair(attachment, deadline)
        except NetnsGone:
            enforcer.forget(attachment.key)  # the Pod is going: its DEL removes the record
        except CniError as exc:  # the enforcer forgot it: the next pass writes it whole
            log.warning("policy of %s not repaired: %s", attachment.describe(), exc)
