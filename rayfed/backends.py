"""How a federation reaches its members: Ray actors, or plain objects in this process.

Both backends have one interface — make a member, run a step on some members and gather the
replies with a deadline, call a built-in method, fetch payloads, kill — so the federation above
them has no branch on where its members live. A member that dies (or, on Ray, misses the deadline)
ends the phase with :class:`PartyFailed` / :class:`RoundTimeout`, or, when the caller asks for it
(``on_failure="drop"``), becomes a dropout listed in :attr:`Replies.failed` (and in
:attr:`Replies.died` if it died: the run's :class:`~rayfed.lifecycle.Lifecycle` decides what
becomes of it, and the backend only carries it out — :meth:`Backend.revive`).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayfed.actors.base import Crash, MessageMeta, _Slot
from rayfed.errors import PartyFailed, RayfedError, RoundTimeout


@dataclass
class Replies:
    """What one phase returned: payload (or its object ref) and transcript meta per member;
    ``failed`` members are dropouts (``died``: the ones whose actor is gone)."""

    payloads: dict[str, Any]
    #: a member's meta, or (``scatter_to``) a tuple of them, one per receiver
    metas: dict[str, MessageMeta | tuple[MessageMeta, ...] | None]
    failed: list[str] = field(default_factory=list)
    died: list[str] = field(default_factory=list)

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


@dataclass(frozen=True)
class PerMember:
    """An argument whose value differs per member: ``values[name]`` goes to member ``name``.

    ``values`` is a mapping or a Replies (e.g. the output of :meth:`Group.scatter`).
    """

    values: Any

    def for_member(self, name: str) -> Any:
        values = self.values.payloads if isinstance(self.values, Replies) else self.values
        return values[name]


@dataclass(frozen=True)
class Where:
    """Where a phase runs, for the errors that name it."""

    role: str
    phase: str
    round_no: int

    def failed(self, name: str, reason: str, err: BaseException | None = None):
        failure = PartyFailed(name, self.round_no, f"{self.role}:{self.phase}", reason)
        if err is not None:
            raise failure from err
        raise failure


def for_member(obj: Any, name: str) -> Any:
    """``obj`` with every PerMember replaced by ``name``'s value."""
    if isinstance(obj, PerMember):
        return obj.for_member(name)
    if isinstance(obj, dict):
        return {k: for_member(v, name) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not isinstance(obj, Replies):
        return type(obj)(for_member(v, name) for v in obj)
    return obj


def has_per_member(obj: Any) -> bool:
    if isinstance(obj, PerMember):
        return True
    if isinstance(obj, dict):
        return any(has_per_member(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(has_per_member(v) for v in obj)
    return False


class Backend(ABC):
    """The transport of one federation (see the module docstring)."""

    name: str
    #: whether a member that died comes back by itself (Ray's ``max_restarts``: its restart runs
    #: while the run goes on, and is awaited later); otherwise :meth:`revive` rebuilds it at once
    restarts_itself: bool

    def __init__(self, *, seed: int, randomness: str):
        self.seed, self.randomness = seed, randomness

    @abstractmethod
    def make(self, cls, name: str, table, meta: dict, *, restarts: int, options: dict): ...

    @abstractmethod
    def run(
        self, handles, steps, args, kwargs, *, deadline_s, on_failure, where: Where, scatter_to=None
    ) -> Replies:
        """Run ``steps[name](ctx, *args, **kwargs)`` on every member and gather the replies.
        With ``scatter_to`` (receiver names) each member's step answers one Message per receiver, and
        its payload is ``{receiver: payload}``, each a separate object (see :func:`scatter_metas`)."""

    @abstractmethod
    def scatter(self, handle, name, step, to, args, kwargs, *, deadline_s, where: Where):
        """(metas by receiver, payloads by receiver) of a step answering one message each."""

    @abstractmethod
    def invoke(self, handles: dict, method: str, args: tuple, *, deadline_s, where: Where) -> list:
        """A built-in actor method (not a step) on every member; values in name order."""

    @abstractmethod
    def get(self, value: Any, *, deadline_s, who: list[str] | None, where: Where) -> Any:
        """Payloads (or object refs) brought to the driver."""

    @abstractmethod
    def call_method(self, handle, method: str, args, kwargs, *, deadline_s, where: Where) -> Any:
        """One member's built-in method (e.g. the coordinator's ledger), its value fetched."""

    def tolerant(self, handles: dict, method: str) -> dict[str, Any]:
        """A built-in method on every member that still answers (the dead are left out)."""
        return {
            name: getattr(h, method)() for name, h in handles.items() if not isinstance(h, Dead)
        }

    def revive(self, handle, rebuild, member: tuple, deadline_s: float):
        """A member the lifecycle restarts: its handle once it is back, or None if it does not
        come back. In-process: ``rebuild()`` makes it anew from its partition."""
        return rebuild()

    def given_up(self, handle, name: str):
        """The handle of a member the lifecycle gave up: in-process, one whose every call is a
        death (:class:`Dead`); a Ray actor out of restarts is dead already."""
        return Dead(name)

    def kill(self, handles) -> None:
        """Stop every member (in-process members need nothing)."""
        return None

    def doomed(self, handle, deadline_s: float) -> None:
        """A member about to die by an injected fault: on Ray, its process's exit is not echoed
        as Ray's crash report (in-process: nothing to do)."""
        return None

    def close(self, handles, *, reuse: bool) -> None:
        """The run is over: stop its members, or (``reuse``) keep the healthy ones for the next."""
        self.kill(handles)

    def made(self) -> None:
        """Every member of the run exists (in-process: nothing to do)."""
        return None

    def release(self) -> None:
        """Forget what the run left with the backend (in-process: nothing)."""
        return None


def scatter_metas(metas: dict[str, MessageMeta], receivers: list[str]) -> tuple[MessageMeta, ...]:
    """A member's split reply in the transcript: one meta per receiver (each message addressed to
    its receiver, with its own bytes), recorded separately."""
    return tuple(metas[n] for n in receivers)


class Dead:
    """An in-process member that died and is not restarted: every call is a death."""

    def __init__(self, name: str):
        self.name = name

    def run(self, step, spec):
        raise Crash(f"{self.name} is dead")


def _plain(obj: Any) -> Any:
    """The in-process flattening: Replies become plain dicts of payloads."""
    if isinstance(obj, Replies):
        return {name: obj.payloads[name] for name in obj.names()}
    if isinstance(obj, Single):
        return obj.payload
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    return obj


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


class LocalBackend(Backend):
    """Members are objects in this process: the same drivers and steps, no Ray (unit tests,
    debugging). Deadlines cannot pre-empt a step here."""

    name = "local"
    restarts_itself = False

    def make(self, cls, name, table, meta, *, restarts, options):
        return cls(name, self.seed, table, meta, randomness=self.randomness)

    def run(self, handles, steps, args, kwargs, *, deadline_s, on_failure, where, scatter_to=None):
        payloads, metas, failed = {}, {}, []
        for name, handle in handles.items():
            spec = _readonly_copy(
                (_plain(for_member(args, name)), _plain(for_member(kwargs, name)))
            )
            try:
                if scatter_to is None:
                    metas[name], payloads[name] = handle.run(steps[name], spec)
                else:
                    by, *parts = handle.run_scatter(steps[name], list(scatter_to), spec)
                    metas[name] = scatter_metas(by, scatter_to)
                    payloads[name] = dict(zip(scatter_to, parts, strict=True))
            except RayfedError:
                raise
            except Crash as err:  # a simulated death: what a dead Ray actor would be
                if on_failure == "drop":
                    failed.append(name)
                    continue
                where.failed(name, "the actor died (simulated in-process)", err)
            except Exception as err:
                where.failed(name, f"{type(err).__name__}: {err}", err)
        return Replies(payloads, metas, failed, died=list(failed))

    def scatter(self, handle, name, step, to, args, kwargs, *, deadline_s, where):
        try:
            out = handle.run_scatter(step, list(to), _readonly_copy((_plain(args), _plain(kwargs))))
        except RayfedError:
            raise
        except Exception as err:
            where.failed(name, f"{type(err).__name__}: {err}", err)
        return out[0], dict(zip(to, out[1:], strict=True))

    def invoke(self, handles, method, args, *, deadline_s, where):
        return [getattr(h, method)(*args) for h in handles.values()]

    def get(self, value, *, deadline_s, who, where):
        return value

    def call_method(self, handle, method, args, kwargs, *, deadline_s, where):
        return getattr(handle, method)(*args, **kwargs)


class RayBackend(Backend):
    """Members are Ray actors; every wait has a deadline (``ray.wait`` / ``ray.get`` with a
    timeout); payloads stay in the object store and travel by reference."""

    name = "ray"
    restarts_itself = True

    def __init__(self, *, seed: int, randomness: str, actors: int):
        super().__init__(seed=seed, randomness=randomness)
        self.actors = actors  # how many the run starts: each gets its share of the CPUs
        self._step_refs: dict[Any, Any] = {}
        self._keys: dict[int, tuple] = {}  # id(handle) -> its key among the warm actors

    def make(self, cls, name, table, meta, *, restarts, options):
        import ray

        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        actor_options = {
            "num_cpus": min(1.0, cpus / self.actors),
            "max_restarts": restarts,
            "max_task_retries": 0,
            **options,
        }
        key = (cls.__name__, repr(sorted(actor_options.items())))
        handle = self._warm().take(key)
        if handle is None:
            handle = ray.remote(cls).options(**actor_options).remote(in_ray=True)
        self._keys[id(handle)] = key
        # the federation's first contact (ping) runs after this: an actor runs one caller's calls
        # in order
        handle.load.remote(name, self.seed, table, meta, self.randomness)
        return handle

    @staticmethod
    def _warm() -> WarmActors:
        """The warm actors of this process's Ray session (:func:`rayfed.runtime.session`)."""
        from rayfed.runtime import session

        return session().warm

    def made(self) -> None:
        """Every member exists: idle actors no run took are stopped (they hold CPUs)."""
        self._warm().drain()

    def _put_step(self, step):
        import ray

        if step not in self._step_refs:
            self._step_refs[step] = ray.put(step)
        return self._step_refs[step]

    def run(self, handles, steps, args, kwargs, *, deadline_s, on_failure, where, scatter_to=None):
        import ray

        per_member = has_per_member((args, kwargs))
        refs = {}
        for name, handle in handles.items():
            flat: list = []
            a, k = (
                (for_member(args, name), for_member(kwargs, name)) if per_member else (args, kwargs)
            )
            spec = (_flatten(a, flat), _flatten(k, flat))
            if scatter_to is None:
                run = handle.run.options(num_returns=2)
                refs[name] = run.remote(self._put_step(steps[name]), spec, *flat)
            else:
                run = handle.run_scatter.options(num_returns=len(scatter_to) + 1)
                out = run.remote(self._put_step(steps[name]), list(scatter_to), spec, *flat)
                refs[name] = (out[0], dict(zip(scatter_to, out[1:], strict=True)))
        meta_refs = {refs[name][0]: name for name in handles}
        ready, not_ready = ray.wait(list(meta_refs), num_returns=len(meta_refs), timeout=deadline_s)
        late = sorted(meta_refs[r] for r in not_ready)
        if late and on_failure != "drop":
            raise RoundTimeout(late, where.round_no, f"{where.role}:{where.phase}", deadline_s)
        payloads, metas, failed, died = {}, {}, list(late), []
        for name in handles:
            if name in late:
                continue
            meta_ref, payload_ref = refs[name]
            try:
                metas[name] = ray.get(meta_ref, timeout=deadline_s)
                if scatter_to is not None:
                    metas[name] = scatter_metas(metas[name], scatter_to)
            except ray.exceptions.RayError as err:
                if isinstance(_cause(err), RayfedError):
                    raise _cause(err) from err
                # only a member that is gone becomes a dropout; an exception in a step is a failure
                if on_failure == "drop" and isinstance(err, ray.exceptions.RayActorError):
                    failed.append(name)
                    died.append(name)
                    continue
                where.failed(name, _reason(err), err)
            payloads[name] = payload_ref
        return Replies(payloads, metas, sorted(failed), sorted(died))

    def scatter(self, handle, name, step, to, args, kwargs, *, deadline_s, where):
        flat: list = []
        spec = (_flatten(args, flat), _flatten(kwargs, flat))
        refs = handle.run_scatter.options(num_returns=len(to) + 1).remote(
            self._put_step(step), list(to), spec, *flat
        )
        refs = refs if isinstance(refs, list) else [refs]
        metas = self.get(refs[0], deadline_s=deadline_s, who=[name], where=where)
        return metas, dict(zip(to, refs[1:], strict=True))

    def invoke(self, handles, method, args, *, deadline_s, where):
        import ray

        refs = {getattr(h, method).remote(*args): name for name, h in handles.items()}
        _, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=deadline_s)
        if not_ready:
            late = sorted(refs[r] for r in not_ready)
            raise RoundTimeout(late, where.round_no, f"{where.role}:{method}", deadline_s)
        return self.get(list(refs), deadline_s=deadline_s, who=list(handles), where=where)

    def get(self, value, *, deadline_s, who, where):
        import ray

        single = isinstance(value, ray.ObjectRef)
        refs = [value] if single else list(value)
        if any(not isinstance(r, ray.ObjectRef) for r in refs):
            return value
        try:
            out = ray.get(refs, timeout=deadline_s)
        except ray.exceptions.GetTimeoutError as err:
            raise RoundTimeout(
                who or ["(unknown)"], where.round_no, where.phase, deadline_s
            ) from err
        except ray.exceptions.RayError as err:
            if isinstance(_cause(err), RayfedError):
                raise _cause(err) from err
            who_text = ", ".join(who) if who else "(unknown)"
            raise PartyFailed(who_text, where.round_no, where.phase, _reason(err)) from err
        return out[0] if single else out

    def call_method(self, handle, method, args, kwargs, *, deadline_s, where):
        ref = getattr(handle, method).remote(*args, **kwargs)
        return self.get(ref, deadline_s=deadline_s, who=None, where=where)

    def tolerant(self, handles, method):
        import ray

        refs = {name: getattr(h, method).remote() for name, h in handles.items()}
        out = {}
        for name, ref in refs.items():
            with contextlib.suppress(ray.exceptions.RayError):  # a member that died
                out[name] = ray.get(ref, timeout=60.0)
        return out

    def revive(self, handle, rebuild, member, deadline_s):
        """Wait (up to ``deadline_s``) for Ray's restart of the actor and give it back its
        ``member`` (name, table, meta); None if it does not come back."""
        import ray

        until = time.monotonic() + deadline_s
        while time.monotonic() < until:
            try:
                load = handle.load.remote(*member[:1], self.seed, *member[1:], self.randomness)
                ray.get(load, timeout=max(0.1, until - time.monotonic()))
                return handle
            except ray.exceptions.ActorUnavailableError:  # still restarting: ask again
                time.sleep(0.2)
            except ray.exceptions.RayError:  # one that does not come back stays out
                return None
        return None

    def given_up(self, handle, name):
        """Killed without restart: one out of restarts is gone already, and one that did not come
        back in time must not come back unloaded later."""
        self.kill([handle])
        return handle

    def doomed(self, handle, deadline_s):
        import ray

        from rayfed.runtime import mute_worker_death

        with contextlib.suppress(ray.exceptions.RayError):  # one already gone: nothing to mute
            mute_worker_death(ray.get(handle.pid.remote(), timeout=deadline_s))

    def kill(self, handles):
        import ray

        for handle in handles:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    def close(self, handles, *, reuse):
        """Members that answer at once stay warm for the next run; a member still busy (a step past its
        deadline) or gone is stopped."""
        import ray

        handles = list(handles)
        healthy = set()
        if reuse and handles:
            pings = {h.ping.remote(): h for h in handles}
            ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=REUSE_PING_S)
            for ref in ready:
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.get(ref, timeout=REUSE_PING_S)  # ready already: returns at once
                    healthy.add(id(pings[ref]))
        self.kill([h for h in handles if id(h) not in healthy])
        warm = self._warm() if healthy else None
        for handle in handles:
            if id(handle) in healthy:
                warm.give(self._keys[id(handle)], handle)

    def release(self):
        self._step_refs.clear()


class WarmActors:
    """Idle actors of finished runs, by class and actor options, kept by the Ray session that
    started them (:class:`rayfed.runtime.Session`, which drains them when it ends).

    Starting an actor is a process spawn plus imports, about 2 s for a run's three actors on 2
    cores, which dominated small runs and sweeps. A run of the same shape as the last one loads its
    members into these actors instead (:meth:`RoleActor.load` gives each a fresh context). Only
    actors of a run that had no death or injected fault come back, so each still has all its Ray
    restarts. Idle actors hold their CPUs, so they are stopped after ``IDLE_S`` without a run (or
    when a run of another shape starts).
    """

    IDLE_S = 5.0

    def __init__(self):
        self._idle: dict[tuple, list] = {}
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def take(self, key: tuple):
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def give(self, key: tuple, handle) -> None:
        with self._lock:
            self._idle.setdefault(key, []).append(handle)
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.IDLE_S, self.drain)
            self._timer.daemon = True
            self._timer.start()

    def drain(self) -> None:
        """Stop every idle actor (frees the CPUs they hold)."""
        import ray

        with self._lock:
            idle, self._idle = self._idle, {}
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not ray.is_initialized():
                return
            for handles in idle.values():
                for handle in handles:
                    with contextlib.suppress(Exception):
                        ray.kill(handle, no_restart=True)


REUSE_PING_S = 2.0  # a member that does not answer this fast after its run is not reused


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
