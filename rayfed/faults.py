"""Fault injection: ``--fail party=NAME@round=R`` and ``--fail cohort=K@phase=P``.

A fault makes the named member's actor die — really, as a Ray actor (its process exits) — at the
first step the driver sends it in round R (or in phase P). What follows is the ordinary failure
path: a dead party ends the run with PartyFailed naming it, within the phase's deadline; a dead
cohort becomes dropouts wherever the protocol tolerates them (secure aggregation), and the run
completes if enough users survive. Cohorts are named ``c0``, ``c1``, … (``cohort=K`` takes the
index or the name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rayfed.actors.base import Crash, StepContext
from rayfed.errors import ConfigError

ROLES = {"party": "parties", "cohort": "cohorts"}
MEMBER = {group: role for role, group in ROLES.items()}  # "parties" -> "party"
_SPEC = re.compile(r"^(party|cohort)=([^@=\s]+)@(round|phase)=([^@=\s]+)$")
FORMAT = "party=NAME@round=R, party=NAME@phase=P, cohort=K@phase=P or cohort=K@round=R"


#: phases any run may have: a checkpoint of the cohorts' state, a restarted member's restore
COMMON_PHASES = ("checkpoint", "restore")
#: the member phases of one secure aggregation (rayfed.secagg.secure_sum)
SECAGG_PHASES = (
    "advertise",
    "share_keys",
    "masked_input",
    "consistency",
    "unmask",
)
#: the parties' group-key agreement (rayfed.secagg.keys)
KEY_AGREEMENT_PHASES = ("key-agreement", "key-shares", "key-combine")


@dataclass(frozen=True)
class Fault:
    """The member of ``role`` ("parties" or "cohorts") that dies, and when."""

    role: str
    member: str
    round: int | None = None
    phase: str | None = None

    def matches(self, role: str, name: str, round_no: int, phase: str) -> bool:
        if (role, name) != (self.role, self.member):
            return False
        return self.round == round_no if self.round is not None else self.phase == phase


def parse(text: str) -> Fault:
    """One ``--fail`` value; a malformed one is a ConfigError with the accepted forms."""
    found = _SPEC.match(text.strip())
    if not found:
        raise ConfigError("fail", f"cannot read {text!r}", FORMAT)
    kind, member, when, value = found.groups()
    if member.isdigit() and kind == "cohort":
        member = f"c{int(member)}"
    if when == "round":
        if not value.isdigit():
            raise ConfigError("fail", f"round must be an integer >= 0 in {text!r}", FORMAT)
        return Fault(ROLES[kind], member, round=int(value))
    return Fault(ROLES[kind], member, phase=value)


def check_members(faults: list[Fault], members: dict[str, list[str]]) -> None:
    """Every fault names a member of the run (checked before any actor starts)."""
    for fault in faults:
        if fault.member not in members.get(fault.role, []):
            known = members.get(fault.role) or ["(none)"]
            raise ConfigError(
                "fail", f"this run has no {MEMBER[fault.role]} {fault.member!r}", ", ".join(known)
            )


def check_phases(faults: list[Fault], phases: tuple[str, ...] | None, protocol: str) -> None:
    """Every ``@phase=P`` names a phase the protocol's members run (checked before any actor
    starts): a misspelt phase would never fire, and the run would pass for one with a fault."""
    if phases is None:
        return
    for fault in faults:
        if fault.phase is not None and fault.phase not in phases:
            raise ConfigError(
                "fail",
                f"{protocol} has no phase {fault.phase!r} (in --fail "
                f"{MEMBER[fault.role]}={fault.member}@phase={fault.phase})",
                ", ".join(sorted(set(phases))),
            )


def die(ctx: StepContext, *args, **kwargs):
    """The step a doomed member runs instead of its own."""
    raise Crash(f"fault injection: {ctx.name} dies")


class Faults:
    """A run's injected faults.

    ``step_for`` hands a doomed member the step that kills it (once, at the round or phase its
    fault names). What becomes of a member that died — restarted or dead for good — is the run's
    :class:`~rayfed.lifecycle.Lifecycle`'s.
    """

    def __init__(self, faults: list[Fault] | None = None):
        self.pending = list(faults or [])
        self.injected = tuple(self.pending)  # as planned, for references that need them

    def step_for(self, group: str, name: str, round_no: int, phase: str, step):
        """``step``, or — once, if a fault is due for this member now — the step that kills it."""
        for fault in self.pending:
            if fault.matches(group, name, round_no, phase):
                self.pending.remove(fault)
                return die
        return step
