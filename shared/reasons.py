"""Condition types, condition reasons and Event reasons, each declared once with what it means.

Decides: the records the hosters' guide (``docs/hosters/conditions.md``, written by ``python -m
hack.docgen``) is made of: for a condition type, what True means; for a reason, the condition and
status it is given with, what it means, what to do and who does it; for an Event reason, its type,
when it is posted and what to do. A kind's ``reasons`` module declares each through its ``Guide``,
whose methods return the plain ``str`` the code uses and keep the record, so a new reason is one
declaration in one file.

Does not: decide when any of them applies, or render anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

# What the guide says when there is nothing to do.
NOTHING: Final = "Nothing."
# Whom a reason's remedy is addressed to.
HOSTER: Final = "hoster"
TENANT: Final = "tenant"


@dataclass(frozen=True)
class ConditionType:
    kind: str
    type: str
    true_means: str


@dataclass(frozen=True)
class Reason:
    """One (status, reason) a kind's condition can take; ``remedy`` is addressed to ``who``."""

    kind: str
    condition: str
    status: str
    name: str
    meaning: str
    remedy: str
    who: str = HOSTER


@dataclass(frozen=True)
class EventReason:
    kind: str
    type: str  # Normal | Warning
    name: str
    meaning: str
    remedy: str


@dataclass
class Guide:
    """The records of one kind, in the order they are declared (the order the guide lists them)."""

    kind: str
    condition_types: list[ConditionType] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)
    events: list[EventReason] = field(default_factory=list)

    def condition(self, name: str, *, true_means: str) -> str:
        self.condition_types.append(ConditionType(self.kind, name, true_means))
        return name

    def reason(
        self, name: str, *, condition: str, status: str, meaning: str, remedy: str, who: str = HOSTER
    ) -> str:
        self.reasons.append(Reason(self.kind, condition, status, name, meaning, remedy, who))
        return name

    def event(self, name: str, *, type: str, meaning: str, remedy: str) -> str:
        self.events.append(EventReason(self.kind, type, name, meaning, remedy))
        return name

    def reasons_of(self, condition: str) -> frozenset[str]:
        """Every reason declared for ``condition``."""
        return frozenset(r.name for r in self.reasons if r.condition == condition)
