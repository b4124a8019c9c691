"""The actors of one run, how the driver talks to them, and what it records.

A :class:`Federation` holds three role groups — the coordinator, the parties and the user cohorts —
on one of two backends with the same interface:

* ``"ray"``: each member is a Ray actor; every wait has a deadline (``ray.wait`` with a timeout);
  a member that dies or times out ends the phase with :class:`PartyFailed` / :class:`RoundTimeout`,
  or, when the driver asks for it (``on_failure="drop"``, as secure aggregation does for cohorts),
  turns into a dropout.
* ``"local"``: each member is a plain object in this process; the same drivers and step functions
  run without Ray, for unit tests and debugging (deadlines cannot pre-empt a step there).

Every message a step returns is recorded in the :class:`Transcript` (round, phase, sender, receiver,
name, bytes, DP event); messages' payloads stay in the object store and travel by reference.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed import faults
from rayfed.actors.base import Crash, MessageMeta, RoleActor, _Slot
from rayfed.actors.cohort import UserCohortActor
from rayfed.actors.coordinator import CoordinatorActor
from rayfed.actors.party import PartyActor
from rayfed.errors import BelowThreshold, ConfigError, PartyFailed, RayfedError, RoundTimeout
from rayfed.faults import MEMBER as MEMBER_ROLE
from rayfed.privacy.ledger import RUN_SCOPE, Budget, event_to_dict
from rayfed.privacy.source import RANDOMNESS

BACKENDS = ("ray", "local")
RESERVED = ("coordinator", "parties", "cohorts")
STARTUP_DEADLINE_S = 60.0


@dataclass
class Replies:
    """What one phase returned: payload (or its object ref) and transcript meta per member."""

    payloads: dict[str, Any]
    metas: dict[str, MessageMeta | None]
    failed: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        return sorted(self.payloads)

    def single(self) -> Single:
        """The payload of a one-member phase (e.g. the coordinator's broadcast), to pass on as an
        argument without fetching it to the driver."""
        (name,) = self.names()
        return Single(self.payloads[name])


@dataclass(frozen=True)
class Single:
    """One payload (or its object ref) passed as an argument: see :meth:`Replies.single`."""

    payload: Any


@dataclass
class Transcript:
    """Every cross-role message of a run, in the order the driver received them."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def record(self, round: int, phase: str, meta: MessageMeta, receivers: list[str]) -> None:
        event = event_to_dict(meta.dp_event) if meta.dp_event is not None else None
        for receiver in receivers:
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
        columns = ["round", "phase", "sender", "receiver", "name", "bytes", "dp_event"]
        types = [
            pa.int64(),
            pa.string(),
            pa.string(),
            pa.string(),
            pa.string(),
            pa.int64(),
            pa.string(),
        ]
        schema = pa.schema(list(zip(columns, types, strict=True)))
        return pa.Table.from_pylist(self.rows, schema=schema)

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


@dataclass(frozen=True)
class PerMember:
    """An argument whose value differs per member: ``values[name]`` goes to member ``name``.

    ``values`` is a mapping or a Replies (e.g. the output of :meth:`Group.scatter`).
    """

    values: Any

    def for_member(self, name: str) -> Any:
        values = self.values.payloads if isinstance(self.values, Replies) else self.values
        return values[name]


def _for_member(obj: Any, name: str) -> Any:
    if isinstance(obj, PerMember):
        return obj.for_member(name)
    if isinstance(obj, dict):
        return {k: _for_member(v, name) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not isinstance(obj, Replies):
        return type(obj)(_for_member(v, name) for v in obj)
    return obj


def _has_per_member(obj: Any) -> bool:
    if isinstance(obj, PerMember):
        return True
    if isinstance(obj, dict):
        return any(_has_per_member(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_per_member(v) for v in obj)
    return False


class _DeadMember:
    """An in-process member that died and is not restarted: every call is a death."""

    def __init__(self, name: str):
        self.name = name

    def run(self, step, spec):
        raise Crash(f"{self.name} is dead")


def check_member_names(names: list[str]) -> None:
    """Member names must be unique and must not be a role name (they address messages)."""
    for name in names:
        if name in RESERVED or names.count(name) > 1:
            raise ConfigError(
                "parties",
                f"member name {name!r} is reserved or used twice",
                f"unique names other than {', '.join(RESERVED)}",
            )


def _flatten(obj: Any, flat: list) -> Any:
    """Replace object refs and Replies by slots so that Ray resolves them as top-level arguments."""
    import ray

    if isinstance(obj, Replies):
        return {name: _flatten(obj.payloads[name], flat) for name in obj.names()}
    if isinstance(obj, Single):
        return _flatten(obj.payload, flat)
    if isinstance(obj, ray.ObjectRef):
        flat.append(obj)
        return _Slot(len(flat) - 1)
    if isinstance(obj, dict):
        return {k: _flatten(v, flat) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_flatten(v, flat) for v in obj)
    return obj


def _plain(obj: Any) -> Any:
    """The local backend's flattening: Replies become plain dicts of payloads."""
    if isinstance(obj, Replies):
        return {name: obj.payloads[name] for name in obj.names()}
    if isinstance(obj, Single):
        return obj.payload
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    return obj


def _cause(err: BaseException) -> BaseException:
    """The original exception inside a Ray task error (or the error itself)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err


def _reason(err: BaseException) -> str:
    """What went wrong, in words, for a Ray error or a step's own exception."""
    import ray

    if isinstance(err, ray.exceptions.ActorUnavailableError):
        return "the actor is unavailable (possibly transient: the step may or may not have run)"
    if isinstance(err, ray.exceptions.RayActorError):
        return "the actor died"
    cause = _cause(err)
    return f"{type(cause).__name__}: {cause}"


def _readonly_copy(obj: Any) -> Any:
    """What a Ray actor receives: a copy whose numpy arrays are read-only (the in-process backend
    hands these to steps, so a step that mutates its input fails on both backends alike)."""
    if isinstance(obj, np.ndarray):
        out = obj.copy()
        out.flags.writeable = False
        return out
    if isinstance(obj, dict):
        return {k: _readonly_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_readonly_copy(v) for v in obj)
    return copy.deepcopy(obj)


class Group:
    """The members of one role; ``run`` executes a step on all (or some) of them in parallel."""

    def __init__(self, fed: Federation, role: str, handles: dict[str, Any]):
        self.fed, self.role, self.handles = fed, role, dict(sorted(handles.items()))

    @property
    def names(self) -> list[str]:
        return list(self.handles)

    def __len__(self) -> int:
        return len(self.handles)

    def run(
        self,
        step,
        *args,
        phase: str,
        members: list[str] | None = None,
        deadline_s: float | None = None,
        on_failure: str = "raise",
        **kwargs,
    ) -> Replies:
        """Run ``step(ctx, *args, **kwargs)`` on every member (or ``members``) and gather replies.

        Replies from an earlier phase (or object refs) may be passed as arguments: they reach the
        actors as plain payloads, without passing through the driver; ``PerMember(...)`` sends each
        member its own value. ``on_failure="drop"`` turns a member that dies or misses the deadline
        into a dropout (listed in ``Replies.failed``) instead of raising PartyFailed / RoundTimeout;
        an exception raised by a step is always a PartyFailed.
        """
        names = members if members is not None else self.names
        deadline = self.fed.deadline_s if deadline_s is None else deadline_s
        started = time.perf_counter()
        steps = {name: self.fed._step_for(self.role, name, phase, step) for name in names}
        if self.fed.backend == "local":
            replies = self._run_local(steps, names, args, kwargs, phase, on_failure)
        else:
            replies = self._run_ray(steps, names, args, kwargs, phase, deadline, on_failure)
        self.fed._after_phase(self.role, phase, replies, time.perf_counter() - started)
        return replies

    def _fail(self, name: str, phase: str, reason: str, err: BaseException | None = None):
        failure = PartyFailed(name, self.fed.round_no, f"{self.role}:{phase}", reason)
        if err is not None:
            raise failure from err
        raise failure

    def _run_local(self, steps, names, args, kwargs, phase, on_failure) -> Replies:
        payloads, metas, failed = {}, {}, []
        for name in names:
            spec = _readonly_copy(
                (_plain(_for_member(args, name)), _plain(_for_member(kwargs, name)))
            )
            try:
                metas[name], payloads[name] = self.handles[name].run(steps[name], spec)
            except RayfedError:
                raise
            except Crash as err:  # a simulated death: what a dead Ray actor would be
                if on_failure == "drop":
                    failed.append(name)
                    self.fed._restart_local(self, name)
                    continue
                self._fail(name, phase, "the actor died (simulated in-process)", err)
            except Exception as err:
                self._fail(name, phase, f"{type(err).__name__}: {err}", err)
        return Replies(payloads, metas, failed)

    def _run_ray(self, steps, names, args, kwargs, phase, deadline, on_failure) -> Replies:
        import ray

        per_member = _has_per_member((args, kwargs))
        refs = {}
        for name in names:
            flat: list = []
            a, k = (
                (_for_member(args, name), _for_member(kwargs, name))
                if per_member
                else (args, kwargs)
            )
            spec = (_flatten(a, flat), _flatten(k, flat))
            step_ref = self.fed._put_step(steps[name])
            refs[name] = self.handles[name].run.options(num_returns=2).remote(step_ref, spec, *flat)
        meta_refs = {refs[name][0]: name for name in names}
        ready, not_ready = ray.wait(list(meta_refs), num_returns=len(meta_refs), timeout=deadline)
        late = sorted(meta_refs[r] for r in not_ready)
        if late and on_failure != "drop":
            raise RoundTimeout(late, self.fed.round_no, f"{self.role}:{phase}", deadline)
        payloads, metas, failed = {}, {}, list(late)
        for name in names:
            if name in late:
                continue
            meta_ref, payload_ref = refs[name]
            try:
                metas[name] = ray.get(meta_ref, timeout=deadline)
            except ray.exceptions.RayError as err:
                if isinstance(_cause(err), RayfedError):
                    raise _cause(err) from err
                # only a member that is gone becomes a dropout; an exception in a step is a failure
                if on_failure == "drop" and isinstance(err, ray.exceptions.RayActorError):
                    failed.append(name)
                    self.fed._restarting.add((self.role, name))
                    continue
                self._fail(name, phase, _reason(err), err)
            payloads[name] = payload_ref
        return Replies(payloads, metas, sorted(failed))

    def scatter(
        self, step, *args, to: list[str], phase: str, deadline_s: float | None = None, **kwargs
    ) -> Replies:
        """Run on the single member of this group (e.g. the coordinator) a step that returns one
        Message per receiver in ``to``; each payload is a separate object, so passing the result as
        ``PerMember(replies)`` sends every receiver only its own message."""
        (name,) = self.names
        deadline = self.fed.deadline_s if deadline_s is None else deadline_s
        started = time.perf_counter()
        handle = self.handles[name]
        if self.fed.backend == "local":
            try:
                out = handle.run_scatter(
                    step, list(to), _readonly_copy((_plain(args), _plain(kwargs)))
                )
            except RayfedError:
                raise
            except Exception as err:
                self._fail(name, phase, f"{type(err).__name__}: {err}", err)
            metas, payloads = out[0], dict(zip(to, out[1:], strict=True))
        else:
            flat: list = []
            spec = (_flatten(args, flat), _flatten(kwargs, flat))
            refs = handle.run_scatter.options(num_returns=len(to) + 1).remote(
                self.fed._put_step(step), list(to), spec, *flat
            )
            refs = refs if isinstance(refs, list) else [refs]
            metas = self.fed.get(
                refs[0], phase=f"{self.role}:{phase}", deadline_s=deadline, who=[name]
            )
            payloads = dict(zip(to, refs[1:], strict=True))
        replies = Replies(payloads, metas)
        self.fed._after_phase(self.role, phase, replies, time.perf_counter() - started)
        return replies

    def call(self, method: str, *args, deadline_s: float | None = None) -> list[Any]:
        """Call a built-in actor method (not a step) on every member; return values in name order."""
        deadline = self.fed.deadline_s if deadline_s is None else deadline_s
        if self.fed.backend == "local":
            return [getattr(h, method)(*args) for h in self.handles.values()]
        import ray

        refs = {getattr(h, method).remote(*args): name for name, h in self.handles.items()}
        _, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=deadline)
        if not_ready:
            raise RoundTimeout(
                sorted(refs[r] for r in not_ready),
                self.fed.round_no,
                f"{self.role}:{method}",
                deadline,
            )
        return self.fed.get(
            list(refs), phase=f"{self.role}:{method}", deadline_s=deadline, who=self.names
        )


class Federation:
    """The actors of one run: a coordinator, parties and user cohorts, and what crosses between them.

    Parameters
    ----------
    run_id:
        Names the run (and its actors' log lines).
    seed:
        The run's root seed; every actor derives its streams from it.
    parties, cohorts:
        ``{name: (table, meta)}`` — each member's Arrow partition and public facts about it.
    budget, ledger:
        The privacy budget and the ledger declaration (accountant, relation, composition,
        statement) the coordinator opens.
    backend:
        ``"ray"`` (default) or ``"local"`` (in-process, no Ray).
    randomness:
        ``"seeded"`` (default) or ``"secure"``: where every actor's DP noise and secrets come from
        (:mod:`rayfed.privacy.source`).
    deadline_s:
        Deadline of every remote wait, in seconds.
    actor_options:
        Extra ``ray.remote`` options per role (e.g. resources for placement).
    """

    def __init__(
        self,
        *,
        run_id: str,
        seed: int,
        parties: Mapping[str, tuple[pa.Table, dict]] | None = None,
        cohorts: Mapping[str, tuple[pa.Table, dict]] | None = None,
        budget: Budget,
        ledger: dict[str, Any] | None = None,
        backend: str = "ray",
        randomness: str = "seeded",
        deadline_s: float = 120.0,
        actor_options: dict[str, dict] | None = None,
        progress=None,
        faults: list | None = None,
        cohort_restarts: int = 0,
    ):
        if backend not in BACKENDS:
            raise ConfigError("backend", f"unknown backend {backend!r}", BACKENDS)
        if randomness not in RANDOMNESS:
            raise ConfigError("randomness", f"unknown randomness {randomness!r}", RANDOMNESS)
        self.randomness = randomness
        if not deadline_s > 0:
            raise ConfigError("deadline_s", f"must be > 0 seconds, got {deadline_s!r}")
        self.run_id, self.seed, self.backend, self.deadline_s = (
            run_id,
            seed,
            backend,
            float(deadline_s),
        )
        self._specs = {"party": dict(parties or {}), "cohort": dict(cohorts or {})}
        check_member_names(list(self._specs["party"]) + list(self._specs["cohort"]))
        self._budget, self._ledger_decl = budget, dict(ledger or {})
        self._actor_options = actor_options or {}
        self._faults = list(faults or [])
        self.injected_faults = tuple(self._faults)  # as planned, for references that need them
        self._restarts = {"cohort": int(cohort_restarts)}  # per member, as Ray's max_restarts
        self._restarted: dict[str, int] = {}
        self._restarting: set[tuple[str, str]] = set()
        self.transcript = Transcript()
        self.timings: list[dict[str, Any]] = []
        self.per_round: list[dict[str, Any]] = []
        self.round_no = 0
        self.progress = progress
        self._step_refs: dict[Any, Any] = {}
        self._started = False

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Federation:
        """Create the actors, load their partitions, open the ledger; wait (with deadline) for all.

        If any of this fails, the actors already created are killed before the error propagates.
        """
        make = self._make_local if self.backend == "local" else self._make_ray
        self._started = True
        self.coordinator = Group(self, "coordinator", {})
        self.parties = Group(self, "parties", {})
        self.cohorts = Group(self, "cohorts", {})
        try:
            self.coordinator.handles["coordinator"] = make(
                CoordinatorActor, "coordinator", None, {}
            )
            for n, (t, m) in self._specs["party"].items():
                self.parties.handles[n] = make(PartyActor, n, t, m)
            for n, (t, m) in self._specs["cohort"].items():
                self.cohorts.handles[n] = make(UserCohortActor, n, t, m)
            # Starting an actor is a process spawn (about a second each here, longer under load), so
            # the first contact gets at least STARTUP_DEADLINE_S whatever the per-phase deadline is.
            for group in (self.coordinator, self.parties, self.cohorts):
                if len(group):
                    group.call("ping", deadline_s=max(self.deadline_s, STARTUP_DEADLINE_S))
            self._call_coordinator(
                "open_ledger", self._budget, randomness=self.randomness, **self._ledger_decl
            )
        except BaseException:
            self.shutdown()
            raise
        return self

    def noise_fingerprints(self) -> dict[str, list[str]]:
        """member -> digests of its noise releases in draw order (two runs drew the same noise
        iff these agree); in memory only, for tests and audits."""
        handles = {
            name: handle
            for group in (self.coordinator, self.parties, self.cohorts)
            for name, handle in group.handles.items()
            if not isinstance(handle, _DeadMember)
        }
        if self.backend == "local":
            return {name: h.noise_fingerprints() for name, h in handles.items()}
        import ray

        refs = {name: h.noise_fingerprints.remote() for name, h in handles.items()}
        out = {}
        for name, ref in refs.items():
            with contextlib.suppress(ray.exceptions.RayError):  # a member that died: no draws
                out[name] = ray.get(ref, timeout=self.deadline_s)
        return out

    def placement(self) -> dict[str, str]:
        """member -> the node id it runs on (``"local"`` in-process)."""
        out: dict[str, str] = {}
        for group in (self.coordinator, self.parties, self.cohorts):
            if len(group):
                out.update(zip(group.names, group.call("node"), strict=True))
        return out

    def _await_restarts(self) -> None:
        """Before a new round, wait for members Ray is restarting (a restart re-runs the actor's
        constructor on its partition); one that does not come back stays a dropout."""
        if self.backend != "ray" or not self._restarting:
            return
        import ray

        groups = {"cohorts": self.cohorts, "parties": self.parties}
        pending, self._restarting = self._restarting, set()
        for role, name in sorted(pending):
            if self._restarts.get(MEMBER_ROLE[role], 0) <= 0:
                continue
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(groups[role].handles[name].ping.remote(), timeout=STARTUP_DEADLINE_S)

    def _restart_local(self, group: Group, name: str) -> None:
        """In-process twin of what Ray does with a dead actor: restart it (a fresh member built
        from its partition) while restarts remain, else it stays dead for every later call."""
        role = MEMBER_ROLE.get(group.role)
        if self._restarted.get(name, 0) < self._restarts.get(role, 0):
            self._restarted[name] = self._restarted.get(name, 0) + 1
            cls = type(group.handles[name])
            table, meta = self._specs[role][name]
            group.handles[name] = self._make_local(cls, name, table, meta)
        else:
            group.handles[name] = _DeadMember(name)

    def _make_local(self, cls, name, table, meta) -> RoleActor:
        return cls(name, self.seed, table, meta, randomness=self.randomness)

    def _make_ray(self, cls, name, table, meta):
        import ray

        role = cls.role
        n_actors = 1 + sum(len(v) for v in self._specs.values())
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        options = {
            "num_cpus": min(1.0, cpus / n_actors),
            "max_restarts": self._restarts.get(role, 0),
            "max_task_retries": 0,
        }
        options.update(self._actor_options.get(role, {}))
        return (
            ray.remote(cls)
            .options(**options)
            .remote(name, self.seed, table, meta, in_ray=True, randomness=self.randomness)
        )

    def shutdown(self) -> None:
        """Kill every actor of this run (idempotent). Ray itself keeps running for the next run."""
        if not self._started:
            return
        self._started = False
        if self.backend == "ray":
            import ray

            for group in (self.coordinator, self.parties, self.cohorts):
                for handle in group.handles.values():
                    with contextlib.suppress(Exception):
                        ray.kill(handle, no_restart=True)
        self._step_refs.clear()

    def __enter__(self) -> Federation:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # --- driver helpers ----------------------------------------------------------------------
    @contextlib.contextmanager
    def round(self, number: int) -> Iterator[None]:
        """Mark the driver's current round (for errors, transcript and timings); advance progress."""
        self.round_no = number
        started = time.perf_counter()
        self._await_restarts()
        yield
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
        """Bring payloads to the driver: a Replies (→ dict by name), an object ref or a list of refs.

        ``who`` names the members the refs come from, for error messages.
        """
        deadline = self.deadline_s if deadline_s is None else deadline_s
        if isinstance(value, Replies):
            names = value.names()
            fetched = self.get(
                [value.payloads[n] for n in names], phase=phase, deadline_s=deadline, who=names
            )
            return dict(zip(names, fetched, strict=True))
        if self.backend == "local":
            return value
        import ray

        single = isinstance(value, ray.ObjectRef)
        refs = [value] if single else list(value)
        if any(not isinstance(r, ray.ObjectRef) for r in refs):
            return value
        who_text = ", ".join(who) if who else "(unknown)"
        try:
            out = ray.get(refs, timeout=deadline)
        except ray.exceptions.GetTimeoutError as err:
            raise RoundTimeout(who or ["(unknown)"], self.round_no, phase, deadline) from err
        except ray.exceptions.RayError as err:
            if isinstance(_cause(err), RayfedError):
                raise _cause(err) from err
            raise PartyFailed(who_text, self.round_no, phase, _reason(err)) from err
        return out[0] if single else out

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

    def one(self, replies: Replies) -> Any:
        """The payload of a single-member phase (e.g. the coordinator's), fetched to the driver."""
        (name,) = replies.names()
        return self.get(replies, phase=f"fetch:{name}")[name]

    def charge(self, charges: list[tuple[str, str, Any]]) -> list[float]:
        """Charge ``(scope, label, event)`` to the coordinator's ledger before the noise is drawn."""
        return self._call_coordinator("charge", charges, self.round_no)

    def record(self, **values: Any) -> None:
        """Keep values of the current round (e.g. survivors, a loss) for the result's
        ``metrics["per_round"]`` and ``rayfed report``'s per-round plots."""
        self.per_round.append({"round": self.round_no, **values})

    def note(self, text: str) -> None:
        """Add a statement to the privacy report (e.g. a paper's claim beside the true guarantee)."""
        self._call_coordinator("note", text)

    def privacy_report(self):
        return self._call_coordinator("privacy_report")

    def _call_coordinator(self, method: str, *args, **kwargs):
        handle = self.coordinator.handles["coordinator"]
        if self.backend == "local":
            return getattr(handle, method)(*args, **kwargs)
        return self.get(
            getattr(handle, method).remote(*args, **kwargs), phase=f"coordinator:{method}"
        )

    @property
    def unfired_faults(self) -> list:
        """Injected faults whose member never got a step in their round or phase."""
        return list(self._faults)

    def _step_for(self, role: str, name: str, phase: str, step):
        """``step``, or — once, if a fault is due for this member now — the step that kills it."""
        for fault in self._faults:
            if fault.matches(role, name, self.round_no, phase):
                self._faults.remove(fault)
                return faults.die
        return step

    def _put_step(self, step):
        import ray

        if step not in self._step_refs:
            self._step_refs[step] = ray.put(step)
        return self._step_refs[step]

    def _receivers(self, to: str) -> list[str]:
        groups = {"coordinator": self.coordinator, "parties": self.parties, "cohorts": self.cohorts}
        return groups[to].names if to in groups else [to]

    def _after_phase(self, role: str, phase: str, replies: Replies, seconds: float) -> None:
        self.timings.append(
            {"round": self.round_no, "phase": phase, "role": role, "seconds": seconds}
        )
        dp_items = []
        for name in sorted(replies.metas):
            meta = replies.metas[name]
            if meta is None:
                continue
            self.transcript.record(self.round_no, phase, meta, self._receivers(meta.to))
            item = (meta.scope, self.round_no, meta.dp_event)
            if meta.dp_event is None:
                continue
            if meta.scope != RUN_SCOPE or item not in dp_items:  # run-wide shares of one release
                dp_items.append(item)
        if dp_items:
            self._call_coordinator("verify_charged", dp_items)
