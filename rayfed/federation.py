"""The members of one run, how the driver talks to them, and what it records.

A :class:`Federation` holds three role groups — the coordinator, the parties and the user cohorts —
on a :mod:`backend <rayfed.backends>` (Ray actors, or plain objects in this process: the same
drivers and steps either way). A driver runs a step on a group with :meth:`Group.run` (every
member, gathered with a deadline), :meth:`Group.call` (the single member's value) or
:meth:`Group.scatter` (one message per receiver). Injected faults are the
:class:`~rayfed.faults.Faults` object's; each member's life (running, restarting, dead), its restarts
and the loss log are the :class:`~rayfed.lifecycle.Lifecycle`'s; the ledger lives on the
coordinator.

Every message a step returns is recorded in the :class:`Transcript` (round, phase, sender, receiver,
name, bytes, DP event); messages' payloads stay with the backend and travel by reference.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from dp_accounting import dp_event

from rayfed.actors.base import MessageMeta
from rayfed.actors.cohort import UserCohortActor
from rayfed.actors.coordinator import CoordinatorActor
from rayfed.actors.party import PartyActor
from rayfed.actors.shard import ServerShardActor
from rayfed.backends import (
    Backend,
    LocalBackend,
    PerMember,
    RayBackend,
    Replies,
    Single,
    Where,
)
from rayfed.errors import BelowThreshold, ConfigError, UnaccountedNoise
from rayfed.faults import MEMBER as MEMBER_ROLE
from rayfed.faults import Faults, die
from rayfed.lifecycle import Lifecycle, MemberState
from rayfed.privacy.declaration import PrivacyDeclaration
from rayfed.privacy.ledger import RUN_SCOPE, event_to_dict
from rayfed.privacy.source import RANDOMNESS

__all__ = ["Federation", "Group", "PerMember", "Replies", "Single", "Transcript"]

BACKENDS = ("ray", "local")
RESERVED = ("coordinator", "parties", "cohorts", "shards")
STARTUP_DEADLINE_S = 60.0
ACTORS = {
    "coordinator": CoordinatorActor,
    "parties": PartyActor,
    "cohorts": UserCohortActor,
    "shards": ServerShardActor,
}


@dataclass
class Transcript:
    """Every cross-role message of a run, in the order the driver received them."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def record(self, round: int, phase: str, meta: MessageMeta, receivers: list[str]) -> None:
        """One row per receiver other than the sender: a broadcast to the sender's own group
        sends it nothing (its copy never crosses a boundary)."""
        event = event_to_dict(meta.dp_event) if meta.dp_event is not None else None
        for receiver in receivers:
            if receiver == meta.sender:
                continue
            self.rows.append(
                dict(
                    round=round,
                    phase=phase,
                    sender=meta.sender,
                    receiver=receiver,
                    name=meta.name,
                    bytes=meta.nbytes,
                    dp_event=None if event is None else json.dumps(event),
                )
            )

    def to_table(self) -> pa.Table:
        types = {
            "round": pa.int64(),
            "phase": pa.string(),
            "sender": pa.string(),
            "receiver": pa.string(),
            "name": pa.string(),
            "bytes": pa.int64(),
            "dp_event": pa.string(),
        }
        return pa.Table.from_pylist(self.rows, schema=pa.schema(list(types.items())))

    def totals(self) -> dict[str, Any]:
        by_sender: dict[str, int] = {}
        for row in self.rows:
            by_sender[row["sender"]] = by_sender.get(row["sender"], 0) + row["bytes"]
        return {
            "messages": len(self.rows),
            "bytes": sum(r["bytes"] for r in self.rows),
            "dp_messages": sum(r["dp_event"] is not None for r in self.rows),
            "bytes_by_sender": dict(sorted(by_sender.items())),
        }


def check_member_names(names: list[str]) -> None:
    """Member names must be unique and must not be a role name (they address messages)."""
    for name in names:
        if name in RESERVED or names.count(name) > 1:
            raise ConfigError(
                "parties",
                f"member name {name!r} is reserved or used twice",
                f"unique names other than {', '.join(RESERVED)}",
            )


def shard_specs(server_shards: int) -> dict[str, tuple[None, dict]]:
    """The server shards' members: none for one shard (the coordinator is the whole server)."""
    if isinstance(server_shards, bool) or not isinstance(server_shards, int) or server_shards < 1:
        raise ConfigError("server_shards", f"must be an integer >= 1, got {server_shards!r}")
    if server_shards == 1:
        return {}
    return {f"shard-{i}": (None, {}) for i in range(server_shards)}


class Group:
    """The members of one role; steps run on all (or some) of them in parallel."""

    def __init__(self, fed: Federation, role: str):
        self.fed, self.role, self.handles = fed, role, {}
        #: member -> its latest checkpoint (a reply payload, left where it is), and the step that
        #: restores one into a restarted member
        self.checkpoints: dict[str, Any] = {}
        self.restore = None

    def checkpoint(self, step, restore, *, phase: str = "checkpoint") -> None:
        """Keep every live member's state: ``step(ctx)`` returns it (an Arrow table), kept where
        it is (the object store on Ray), not fetched. A member that dies and is restarted runs
        ``restore(ctx, state)`` before its next step, so it resumes from this checkpoint."""
        replies = self.run(step, phase=phase, on_failure="drop")
        self.checkpoints.update(replies.payloads)
        self.restore = restore

    @property
    def names(self) -> list[str]:
        return sorted(self.handles)

    def __len__(self) -> int:
        return len(self.handles)

    def _where(self, phase: str) -> Where:
        return Where(self.role, phase, self.fed.round_no)

    def run(
        self,
        step,
        *args,
        phase: str,
        members: list[str] | None = None,
        deadline_s: float | None = None,
        on_failure: str = "raise",
        scatter_to: list[str] | None = None,
        **kwargs,
    ) -> Replies:
        """Run ``step(ctx, *args, **kwargs)`` on every member (or ``members``) and gather replies.

        Replies from an earlier phase (or object refs) may be passed as arguments: they reach the
        members as plain payloads, without passing through the driver; ``PerMember(...)`` sends each
        member its own value. ``on_failure="drop"`` turns a member that dies or misses the deadline
        into a dropout (listed in ``Replies.failed``) instead of raising PartyFailed / RoundTimeout;
        ``"retry"`` asks a member that died once more, in the same phase, when the run restarts it
        (for steps whose lost attempt released nothing), else it is a dropout too. An exception
        raised by a step is always a PartyFailed. With ``scatter_to`` (receiver names) the step answers
        one Message per receiver and each member's payload is ``{receiver: payload}``, every one a
        separate object, so a receiver is sent only its own parts.
        """
        if on_failure == "retry":
            if scatter_to is not None:
                raise ValueError("on_failure='retry' does not take scatter_to")
            return self._run_retrying(step, args, kwargs, phase, members, deadline_s)
        names = members if members is not None else self.names
        started = time.perf_counter()
        self.fed.phase = f"{self.role}:{phase}"
        for n in names:  # one Ray is still restarting: await it (its death is spent already)
            if self.fed.lifecycle.state(n) is MemberState.RESTARTING:
                self.fed._bring_back(self, n)
        faults, round_no = self.fed.faults, self.fed.round_no
        steps = {n: faults.step_for(self.role, n, round_no, phase, step) for n in names}
        for n in names:
            if steps[n] is die:  # an injected death is reported by rayfed, not echoed by Ray
                self.fed.backend.doomed(self.handles[n], self.fed.deadline_s)
        replies = self.fed.backend.run(
            {n: self.handles[n] for n in names},
            steps,
            args,
            kwargs,
            deadline_s=self.fed.deadline_s if deadline_s is None else deadline_s,
            on_failure=on_failure,
            where=self._where(phase),
            **({} if scatter_to is None else {"scatter_to": scatter_to}),
        )
        for name in replies.died:
            self.fed._died(self, name, phase)
        self.fed.lifecycle.answered(sorted(replies.metas), self.fed.round_no, phase)
        self.fed._after_phase(self.role, phase, replies, time.perf_counter() - started)
        return replies

    def _run_retrying(self, step, args, kwargs, phase, members, deadline_s) -> Replies:
        """``run`` with on_failure="retry": the members that died and were restarted (their
        restart awaited) run the step again; the rest of the failed stay dropouts."""

        def attempt(names):
            return self.run(
                step,
                *args,
                phase=phase,
                members=names,
                deadline_s=deadline_s,
                on_failure="drop",
                **kwargs,
            )

        first = attempt(members)
        again = [n for n in first.died if self.fed.lifecycle.state(n) is not MemberState.DEAD]
        self.fed._await_restarts()
        if not again:
            return first
        second = attempt(again)
        return Replies(
            {**first.payloads, **second.payloads},
            {**first.metas, **second.metas},
            failed=[n for n in first.failed if n not in again] + second.failed,
            died=first.died + second.died,
        )

    def call(self, step, *args, phase: str, deadline_s: float | None = None, **kwargs) -> Any:
        """Run a step on one member (the group's only one, or ``members=[name]``) and return its
        value."""
        replies = self.run(step, *args, phase=phase, deadline_s=deadline_s, **kwargs)
        return self.fed.get(replies.single(), phase=f"fetch:{self.role}:{phase}")

    def scatter(
        self, step, *args, to: list[str], phase: str, deadline_s: float | None = None, **kwargs
    ) -> Replies:
        """Run on the single member of this group (e.g. the coordinator) a step that returns one
        Message per receiver in ``to``; each payload is a separate object, so passing the result as
        ``PerMember(replies)`` sends every receiver only its own message."""
        (name,) = self.names
        started = time.perf_counter()
        self.fed.phase = f"{self.role}:{phase}"
        metas, payloads = self.fed.backend.scatter(
            self.handles[name],
            name,
            step,
            list(to),
            args,
            kwargs,
            deadline_s=self.fed.deadline_s if deadline_s is None else deadline_s,
            where=self._where(phase),
        )
        replies = Replies(payloads, metas)
        self.fed._after_phase(self.role, phase, replies, time.perf_counter() - started)
        return replies

    def invoke(self, method: str, *args, deadline_s: float | None = None) -> list[Any]:
        """A built-in actor method (not a step) on every member; values in name order."""
        return self.fed.backend.invoke(
            {n: self.handles[n] for n in self.names},
            method,
            args,
            deadline_s=self.fed.deadline_s if deadline_s is None else deadline_s,
            where=Where(self.role, f"{self.role}:{method}", self.fed.round_no),
        )


def _composes(carried, event) -> bool:
    """Whether the carried event is ``event`` or composes it."""
    if carried == event:
        return True
    if isinstance(carried, dp_event.SelfComposedDpEvent):
        return _composes(carried.event, event)
    if isinstance(carried, dp_event.ComposedDpEvent):
        return any(_composes(c, event) for c in carried.events)
    return False


class Federation:
    """The members of one run: a coordinator, parties and user cohorts, and what crosses between them.

    Parameters
    ----------
    run_id:
        Names the run (and its actors' log lines).
    seed:
        The run's root seed; every actor derives its streams from it.
    parties, cohorts:
        ``{name: (table, meta)}`` — each member's Arrow partition and public facts about it.
    privacy:
        The privacy declaration (budget, accountant, relation, composition, statement,
        releases) the coordinator opens its ledger with.
    backend:
        ``"ray"`` (default) or ``"local"`` (in-process, no Ray).
    randomness:
        ``"seeded"`` (default) or ``"secure"``: where every actor's DP noise and secrets come from
        (:mod:`rayfed.privacy.source`).
    deadline_s:
        Deadline of every remote wait, in seconds.
    actor_options:
        Extra ``ray.remote`` options per role (e.g. resources for placement).
    faults, cohort_restarts:
        Injected faults (:mod:`rayfed.faults`) and how often a dead cohort is restarted.
    server_shards:
        With S >= 2, S server-shard actors (``shard-0`` …) that split the server's per-round
        work by user range (:mod:`rayfed.secagg.server`); 1: the coordinator does it all.
    """

    def __init__(
        self,
        *,
        run_id: str,
        seed: int,
        parties: Mapping[str, tuple[pa.Table, dict]] | None = None,
        cohorts: Mapping[str, tuple[pa.Table, dict]] | None = None,
        privacy: PrivacyDeclaration,
        backend: str = "ray",
        randomness: str = "seeded",
        deadline_s: float = 120.0,
        actor_options: dict[str, dict] | None = None,
        progress=None,
        faults: list | None = None,
        cohort_restarts: int = 0,
        server_shards: int = 1,
    ):
        if backend not in BACKENDS:
            raise ConfigError("backend", f"unknown backend {backend!r}", BACKENDS)
        if randomness not in RANDOMNESS:
            raise ConfigError("randomness", f"unknown randomness {randomness!r}", RANDOMNESS)
        if not deadline_s > 0:
            raise ConfigError("deadline_s", f"must be > 0 seconds, got {deadline_s!r}")
        self.run_id, self.seed, self.randomness = run_id, seed, randomness
        self.deadline_s = float(deadline_s)
        self._specs = {
            "coordinator": {"coordinator": (None, {})},
            "parties": dict(parties or {}),
            "cohorts": dict(cohorts or {}),
            "shards": shard_specs(server_shards),
        }
        check_member_names([n for g in ("parties", "cohorts", "shards") for n in self._specs[g]])
        actors = sum(len(v) for v in self._specs.values())
        self.backend: Backend = (
            LocalBackend(seed=seed, randomness=randomness)
            if backend == "local"
            else RayBackend(seed=seed, randomness=randomness, actors=actors)
        )
        self._privacy = privacy
        #: events carried by the messages of each round, and the shares drawn (part_of) in it:
        #: at the round's end each share's release must be among the carried events
        self._carried: dict[int, list] = {}
        self._shares: dict[int, list] = {}
        self._actor_options = actor_options or {}
        self.faults = Faults(faults)
        self.lifecycle = Lifecycle({"cohort": cohort_restarts})
        self.transcript = Transcript()
        self.timings: list[dict[str, Any]] = []
        self.per_round: list[dict[str, Any]] = []
        self.round_no = 0
        #: the phase last started (``role:phase``), for a run that is interrupted in it
        self.phase: str | None = None
        self.progress = progress
        self._started = False
        self.coordinator = Group(self, "coordinator")
        self.parties = Group(self, "parties")
        self.cohorts = Group(self, "cohorts")
        #: the server's shards (empty unless server_shards >= 2)
        self.shards = Group(self, "shards")

    @property
    def groups(self) -> tuple[Group, ...]:
        return self.coordinator, self.parties, self.cohorts, self.shards

    @property
    def injected_faults(self) -> tuple:
        return self.faults.injected

    @property
    def unfired_faults(self) -> list:
        """Injected faults whose member never got a step in their round or phase."""
        return list(self.faults.pending)

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Federation:
        """Create the members, load their partitions, open the ledger; wait (with deadline) for all.

        If any of this fails, the members already created are stopped before the error propagates.
        """
        self._started = True
        try:
            for group in self.groups:
                for name in self._specs[group.role]:
                    self.lifecycle.add(group.role, name, MEMBER_ROLE.get(group.role, group.role))
                    group.handles[name] = self._make(group.role, name)
            self.backend.made()
            # Starting an actor is a process spawn (about a second each here, longer under load), so
            # the first contact gets at least STARTUP_DEADLINE_S whatever the per-phase deadline is.
            for group in self.groups:
                if len(group):
                    group.invoke("ping", deadline_s=max(self.deadline_s, STARTUP_DEADLINE_S))
                for name in group.names:
                    self.lifecycle.started(name)
            self._ledger(
                "open_ledger",
                self._privacy.budget,
                randomness=self.randomness,
                **self._privacy.ledger_options(),
            )
        except BaseException:
            self.shutdown()
            raise
        return self

    def _member(self, group: str, name: str) -> tuple:
        """(name, table, meta): what a (re)started actor needs to become this member."""
        return (name, *self._specs[group][name])

    def _make(self, group: str, name: str):
        table, meta = self._specs[group][name]
        role = MEMBER_ROLE.get(group, group)
        return self.backend.make(
            ACTORS[group],
            name,
            table,
            meta,
            restarts=self.lifecycle.allowance(role),
            options=self._actor_options.get(role, {}),
        )

    def _died(self, group: Group, name: str, phase: str = "") -> None:
        """A member died during a phase: the lifecycle logs it (:meth:`losses`) and says whether
        it is restarting or dead for good. A restarting one is brought back before the next round
        (:meth:`_await_restarts`) or before a step is next sent to it (:meth:`Group.run`: a Ray
        restart still running is awaited, not counted as a second death) — at once where the backend rebuilds it in-process, or where it
        has a checkpoint: that is restored at once, as later phases of this round may call it. A
        dead one stays dead for every later call."""
        resumes = group.restore is not None and name in group.checkpoints
        users = lambda: self._users(group.role, name)  # noqa: E731
        state = self.lifecycle.died(name, self.round_no, phase, resumes=resumes, users=users)
        if state is MemberState.DEAD:
            group.handles[name] = self.backend.given_up(group.handles[name], name)
            return
        if self.backend.restarts_itself and not resumes:
            return  # Ray restarts it meanwhile; awaited before it is next called
        if self._bring_back(group, name) and resumes:
            checkpoint = Single(group.checkpoints[name])
            group.run(group.restore, checkpoint, members=[name], phase="restore")

    def _bring_back(self, group: Group, name: str) -> bool:
        """The backend's mechanics for a restarting member (rebuild it, or await Ray's restart
        and reload it); the lifecycle records whether it is back."""
        handle = self.backend.revive(
            group.handles[name],
            lambda: self._make(group.role, name),
            self._member(group.role, name),
            max(self.deadline_s, STARTUP_DEADLINE_S),  # a restart is a startup: as long a wait
        )
        if handle is None:
            self.lifecycle.gave_up(name)
            group.handles[name] = self.backend.given_up(group.handles[name], name)
            return False
        group.handles[name] = handle
        self.lifecycle.restarted(name)
        return True

    def _users(self, group_name: str, name: str) -> int | None:
        """How many users a member holds (a table with ``user_id``), else None."""
        table = self._specs.get(group_name, {}).get(name, (None, {}))[0]
        if table is not None and "user_id" in table.column_names:
            return len(np.unique(table.column("user_id").to_numpy()))
        return None

    def losses(self) -> list[dict[str, Any]]:
        """Every member that died, in order, and its fate: see :meth:`Lifecycle.losses
        <rayfed.lifecycle.Lifecycle.losses>`."""
        return self.lifecycle.losses()

    def _await_restarts(self) -> None:
        """Before a new round (or a retry), bring back every member still restarting."""
        groups = {g.role: g for g in self.groups}
        for group_name, name in self.lifecycle.waiting():
            self._bring_back(groups[group_name], name)

    def shutdown(self) -> None:
        """Stop every member of this run (idempotent). Ray itself keeps running for the next run."""
        if not self._started:
            return
        self._started = False
        handles = [h for group in self.groups for h in group.handles.values()]
        # members of a run nothing killed can serve the next run (see backends.WarmActors)
        self.backend.close(handles, reuse=not (self.lifecycle.deaths or self.faults.injected))
        self.backend.release()

    def __enter__(self) -> Federation:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def placement(self) -> dict[str, str]:
        """member -> the node id it runs on (``"local"`` in-process)."""
        out: dict[str, str] = {}
        for group in self.groups:
            if len(group):
                out.update(zip(group.names, group.invoke("node"), strict=True))
        return out

    def noise_fingerprints(self) -> dict[str, list[str]]:
        """member -> digests of its noise releases and secrets in draw order (two runs drew the
        same iff these agree); the dead are left out. In memory only, for tests and audits."""
        handles = {n: h for group in self.groups for n, h in group.handles.items()}
        return self.backend.tolerant(handles, "noise_fingerprints")

    # --- driver helpers ----------------------------------------------------------------------
    @contextlib.contextmanager
    def round(self, number: int) -> Iterator[None]:
        """Mark the driver's current round (for errors, transcript and timings); advance progress."""
        self.round_no = number
        started = time.perf_counter()
        self._await_restarts()
        yield
        self._check_shares(number)
        self.timings.append(
            {
                "round": number,
                "phase": "(round)",
                "role": "",
                "seconds": time.perf_counter() - started,
            }
        )
        if self.progress is not None:
            self.progress.update(1)

    def get(
        self,
        value: Any,
        *,
        phase: str = "fetch",
        deadline_s: float | None = None,
        who: list[str] | None = None,
    ) -> Any:
        """Bring payloads to the driver: a Replies (→ dict by name), a Single (→ its value), an object
        ref or a list of refs.

        ``who`` names the members the refs come from, for error messages.
        """
        deadline = self.deadline_s if deadline_s is None else deadline_s
        if isinstance(value, Replies):
            names = value.names()
            fetched = self.get(
                [value.payloads[n] for n in names], phase=phase, deadline_s=deadline, who=names
            )
            return dict(zip(names, fetched, strict=True))
        if isinstance(value, Single):
            value = value.payload
        where = Where("", phase, self.round_no)
        return self.backend.get(value, deadline_s=deadline, who=who, where=where)

    def phase_seconds(self) -> dict[str, float]:
        """Total seconds per phase name so far (round totals excluded)."""
        out: dict[str, float] = {}
        for t in self.timings:
            if t["phase"] != "(round)":
                out[t["phase"]] = out.get(t["phase"], 0.0) + t["seconds"]
        return out

    def require_quorum(self, alive: int, minimum: int, phase: str) -> None:
        """BelowThreshold unless at least ``minimum`` participants are still alive after ``phase``."""
        if alive < minimum:
            raise BelowThreshold(phase, alive, minimum, self.round_no)

    def charge(self, charges: list[tuple[str, str, Any]]) -> list[float]:
        """Charge ``(scope, label, event)`` to the coordinator's ledger before the noise is drawn."""
        return self._ledger("charge", charges, self.round_no)

    def record(self, **values: Any) -> None:
        """Keep values of the current round (e.g. survivors, a loss) for the result's
        ``metrics["per_round"]`` and ``rayfed report``'s per-round plots."""
        self.per_round.append({"round": self.round_no, **values})

    def note(self, text: str) -> None:
        """Add a statement to the privacy report (e.g. a paper's claim beside the true guarantee)."""
        self._ledger("note", text)

    def privacy_report(self):
        return self._ledger("privacy_report")

    def _ledger(self, method: str, *args, **kwargs):
        """A ledger method on the coordinator (a built-in method, not a step)."""
        return self.backend.call_method(
            self.coordinator.handles["coordinator"],
            method,
            args,
            kwargs,
            deadline_s=self.deadline_s,
            where=Where("coordinator", f"coordinator:{method}", self.round_no),
        )

    def _receivers(self, to: str | tuple[str, ...]) -> list[str]:
        if isinstance(to, tuple):  # some members by name (a round over part of a group)
            return list(to)
        groups = {g.role: g for g in self.groups}
        return groups[to].names if to in groups else [to]

    def _after_phase(self, role: str, phase: str, replies: Replies, seconds: float) -> None:
        self.timings.append(
            {"round": self.round_no, "phase": phase, "role": role, "seconds": seconds}
        )
        dp_items, shared_items = [], []
        metas = []
        for name in sorted(replies.metas):  # a split reply (scatter_to): one meta per receiver
            meta = replies.metas[name]
            metas.extend(meta if isinstance(meta, tuple) else [meta])
        metas = [meta for meta in metas if meta is not None]
        carried = self._carried.setdefault(self.round_no, [])
        for meta in metas:
            self.transcript.record(self.round_no, phase, meta, self._receivers(meta.to))
            item = (meta.scope, self.round_no, meta.dp_event)
            if meta.dp_event is None:
                continue
            carried.append(meta.dp_event)
            if meta.scope == RUN_SCOPE and meta.shared:
                # the members' shares of one declared shared release use one charge: one item
                # for all of them, apart from any other message's (whatever the order)
                if item not in shared_items:
                    shared_items.append(item)
            else:
                dp_items.append(item)
        dp_items += shared_items
        declared = {m.label: m.event for m in self._privacy.measurements}
        for meta in metas:
            for label, event in meta.shares_of:
                if declared.get(label) != event:
                    raise UnaccountedNoise(
                        f"round {self.round_no}: {meta.sender} drew a share of {label!r}, which "
                        "the plan does not declare with that event"
                    )
                self._shares.setdefault(self.round_no, []).append((meta.sender, label, event))
        if dp_items:
            self._ledger("verify_charged", dp_items)

    def _check_shares(self, number: int) -> None:
        """At the end of a round: UnaccountedNoise unless every release a step drew a share of
        (``part_of``) is carried — itself or composed with others — by a message of the round."""
        carried = self._carried.get(number, [])
        for sender, label, event in self._shares.pop(number, []):
            if not any(_composes(c, event) for c in carried):
                raise UnaccountedNoise(
                    f"round {number}: {sender} drew a share of {label!r}, but no message of the "
                    "round carries that release"
                )
