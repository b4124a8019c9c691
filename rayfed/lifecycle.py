"""One object for the life of a run's members: their states, restarts and the loss log.

Every member (the coordinator, each party, each cohort, and any other role group) moves through

::

    pending --started--> running --answered--> running
                         running --died--> restarting --restarted--> running
                                           restarting --gave up--> dead
                                           restarting --died--> restarting   (dead again before
                                                                              it was back)

A death spends one of the member's restarts (its role's allowance, the same count Ray's
``max_restarts`` is given): while some are left the member is ``restarting`` until the backend has
it back (rebuilt in-process at once; on Ray, the restart the backend awaits before the next round
or before the member is next called, see :meth:`Lifecycle.waiting`), else it is given up and ``dead`` for the rest of the run. A dead
member that is called again fails again; that is no new death (:meth:`Lifecycle.died` says
``dead`` and logs nothing). Any other move — a dead or restarting member answering, a restart of a
running member — is a programming error (:class:`LifecycleError`).

The :class:`Federation <rayfed.federation.Federation>` feeds this object and asks it what to do;
the backends only carry out the mechanics (how to wait for a Ray restart, how to rebuild in
process). The loss log (:meth:`Lifecycle.losses`) is written by the same transitions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Lifecycle", "LifecycleError", "Member", "MemberState"]


class MemberState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    RESTARTING = "restarting"
    DEAD = "dead"


class LifecycleError(RuntimeError):
    """A transition the state machine does not have: a bug in the caller, never a user error."""


@dataclass
class Member:
    """One member's state, its deaths and restarts, and how many restarts it is allowed."""

    group: str
    role: str
    name: str
    allowance: int
    state: MemberState = MemberState.PENDING
    deaths: int = 0
    restarts: int = 0
    #: its loss-log rows (indices into Lifecycle._losses)
    rows: list[int] = field(default_factory=list)


#: the transitions by name: state(s) they leave from -> the state they reach
TRANSITIONS = {
    "started": ((MemberState.PENDING,), MemberState.RUNNING),
    "answered": ((MemberState.RUNNING,), MemberState.RUNNING),
    "died": ((MemberState.RUNNING, MemberState.RESTARTING), MemberState.RESTARTING),
    "restarted": ((MemberState.RESTARTING,), MemberState.RUNNING),
    "gave up": ((MemberState.RESTARTING,), MemberState.DEAD),
}


class Lifecycle:
    """The members of one run and their lifecycles (see the module docstring).

    ``restarts`` maps a role (``"party"``, ``"cohort"``, …) to how often each of its members may
    be restarted; a role not named gets none.
    """

    def __init__(self, restarts: dict[str, int] | None = None):
        self.restarts = {role: int(n) for role, n in (restarts or {}).items()}
        self._members: dict[str, Member] = {}
        self._losses: list[dict[str, Any]] = []
        #: every death reported, a dead member's repeated ones included
        self.deaths = 0

    # --- members -----------------------------------------------------------------------------
    def add(self, group: str, name: str, role: str | None = None) -> Member:
        """A new member of ``group`` (its role names its restart allowance; default: the group)."""
        if name in self._members:
            raise LifecycleError(f"member {name!r} is added twice")
        role = group if role is None else role
        member = Member(group, role, name, self.restarts.get(role, 0))
        self._members[name] = member
        return member

    def allowance(self, role: str) -> int:
        """How often a member of ``role`` may be restarted (Ray's ``max_restarts`` for it)."""
        return self.restarts.get(role, 0)

    def member(self, name: str) -> Member:
        try:
            return self._members[name]
        except KeyError:
            raise LifecycleError(f"no member {name!r}") from None

    def state(self, name: str) -> MemberState:
        return self.member(name).state

    def _move(self, name: str, transition: str) -> Member:
        member = self.member(name)
        sources, target = TRANSITIONS[transition]
        if member.state not in sources:
            raise LifecycleError(
                f"{member.group} member {name!r} cannot be {transition!r}: it is "
                f"{member.state.value} (allowed from {', '.join(s.value for s in sources)})"
            )
        member.state = target
        return member

    # --- transitions -------------------------------------------------------------------------
    def started(self, name: str) -> None:
        """The member exists and answered its first contact."""
        self._move(name, "started")

    def answered(self, names: list[str], round_no: int, phase: str) -> None:
        """Members answered a step of ``phase``: a restarted one that had died is back (its loss
        row says so); a restored checkpoint (phase ``restore``) is not a phase of the protocol."""
        for name in names:
            self._move(name, "answered")
        if phase == "restore":
            return
        for name in names:
            for i in self.member(name).rows:
                if self._losses[i]["fate"] == "pending":
                    self._losses[i].update(fate="resumed", back_round=round_no, back_phase=phase)

    def died(
        self,
        name: str,
        round_no: int,
        phase: str,
        *,
        resumes: bool = False,
        users: int | Callable[[], int | None] | None = None,
    ) -> MemberState:
        """The member died in ``phase``: ``restarting`` while it has restarts left, else it is
        given up (``dead``). A member already dead stays so, and its repeated death is not logged.
        ``resumes``: it has a checkpoint to be restored from; ``users``: how many it holds (or a
        function saying so, asked only when the death is logged)."""
        self.deaths += 1
        member = self.member(name)
        if member.state is MemberState.DEAD:
            return MemberState.DEAD
        self._move(name, "died")
        for i in member.rows:  # restarted, but dead again before it answered
            if self._losses[i]["fate"] == "pending":
                self._losses[i]["fate"] = "died again"
        member.deaths += 1
        comes_back = member.deaths <= member.allowance
        if callable(users):
            users = users()
        member.rows.append(len(self._losses))
        self._losses.append(
            {
                "round": round_no,
                "phase": phase,
                "role": member.role,
                "member": name,
                "users": users,
                # pending: restarted, not yet answered again (settled by answered / losses)
                "fate": "pending" if comes_back else "dropped for good",
                "restored": "checkpoint" if comes_back and resumes else None,
                "back_round": None,
                "back_phase": None,
            }
        )
        if not comes_back:
            self._move(name, "gave up")
        return member.state

    def restarted(self, name: str) -> None:
        """The backend has the member back (rebuilt, or its restart awaited and reloaded)."""
        self._move(name, "restarted").restarts += 1

    def gave_up(self, name: str) -> None:
        """The backend could not bring a restarting member back: it is dead for the rest of the
        run, and its last loss row says so."""
        member = self._move(name, "gave up")
        if member.rows:
            self._losses[member.rows[-1]].update(fate="dropped for good", restored=None)

    # --- questions ---------------------------------------------------------------------------
    def waiting(self) -> list[tuple[str, str]]:
        """(group, name) of every member still restarting, sorted: who must be waited for before
        the next round (or before a step is retried)."""
        return sorted(
            (m.group, m.name) for m in self._members.values() if m.state is MemberState.RESTARTING
        )

    def losses(self) -> list[dict[str, Any]]:
        """Every member that died, in order: round and phase of its death, role, name, its users
        (cohorts), and its fate: ``resumed`` (restarted — from its checkpoint where ``restored``
        says so — and answered again at ``back_round``/``back_phase``; a phase re-run at once is
        the same phase), ``dropped for good`` (dead for the rest of the run: its users are
        dropouts from then on), ``died again`` (restarted, and dead again before it answered: the
        next line says what then), or ``not reported`` (restarted, but the run ended before it
        was asked anything again: whatever came after its death lacks its users)."""
        return [
            {**x, "fate": "not reported" if x["fate"] == "pending" else x["fate"]}
            for x in self._losses
        ]
