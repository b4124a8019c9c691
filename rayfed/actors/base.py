"""What every role actor shares: a step context and a ``run(step, ...)`` that executes a step.

Actors hold data and state and run the step functions a protocol module supplies; they make no
protocol decision. A step is a plain function ``step(ctx, *inputs) -> reply``; a reply that crosses
a trust boundary is a :class:`Message`, whose size and DP event go into the run's transcript.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from dp_accounting import dp_event

from rayfed import rng
from rayfed.errors import UnaccountedNoise
from rayfed.privacy.source import NoiseSource


@dataclass
class Message:
    """A reply that is sent to another role.

    Parameters
    ----------
    name:
        What the message is, e.g. ``"rr_bits"``.
    payload:
        The content; its size in bytes is recorded in the transcript.
    to:
        A role (``"coordinator"``, ``"parties"``, ``"cohorts"``), one member's name, or a tuple
        of member names.
    dp_event:
        The noise event the payload carries, if any: built only from events a
        :mod:`rayfed.privacy` mechanism drew in the same step (else UnaccountedNoise), and equal
        to a charge in the ledger. Several members' messages of one phase with the same event under
        scope ``"run"`` are the shares of one release (distributed noise) and use one charge.
    scope:
        Ledger scope of ``dp_event``; defaults to the sender's name.
    """

    name: str
    payload: Any
    to: str = "coordinator"
    dp_event: dp_event.DpEvent | None = None
    scope: str | None = None


@dataclass(frozen=True)
class MessageMeta:
    """The transcript's view of a message: everything but the payload."""

    name: str
    sender: str
    to: str
    nbytes: int
    dp_event: dp_event.DpEvent | None
    scope: str | None
    #: (label, event) of each declared release this message's step drew a share of (part_of)
    shares_of: tuple = ()
    #: the event is a member's share of a release declared shared (one charge for all members)
    shared: bool = False


def nbytes_of(obj: Any) -> int:
    """Bytes a payload occupies on the wire (arrays and tables by their buffers)."""
    if obj is None:
        return 0
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (pa.Table, pa.RecordBatch, pa.Array, pa.ChunkedArray)):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, (bool, int, float, np.generic)):
        return 8
    if isinstance(obj, str):
        return len(obj.encode())
    if isinstance(obj, dict):
        return sum(nbytes_of(k) + nbytes_of(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes_of(v) for v in obj)
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


@dataclass
class StepContext:
    """What a step function sees of the actor that runs it.

    ``table`` is the actor's Arrow partition (None for the coordinator), ``meta`` the public facts
    about it (declared domains, bounds), ``state`` a dict that persists across the run's steps.
    ``noise`` is the actor's source of DP noise and secrets (seeded or secure, by the run's
    randomness): draw noise only through :mod:`rayfed.privacy` mechanisms with it.
    """

    name: str
    role: str
    seed: int
    table: pa.Table | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    ledger: Any = None  # the PrivacyLedger, on the coordinator only
    randomness: str = "seeded"
    noise: NoiseSource = field(init=False, repr=False)

    def __post_init__(self):
        self.noise = NoiseSource(self.randomness, self.seed, self.name)

    def rng(self, purpose: str, round: int = 0, ident: Any = None) -> np.random.Generator:
        """This actor's *public* seeded stream for (purpose, round), keyed by its name unless
        ``ident`` is given: simulation inputs, public samples and hashes, post-processing — never
        DP noise or a secret (those come from ``noise``)."""
        return rng.stream(self.seed, purpose, round, self.name if ident is None else ident)


class _Slot:
    """Placeholder for an argument that travels as a top-level Ray argument (so Ray resolves it)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def unflatten(spec: Any, flat: tuple) -> Any:
    if isinstance(spec, _Slot):
        return flat[spec.index]
    if isinstance(spec, dict):
        return {k: unflatten(v, flat) for k, v in spec.items()}
    if isinstance(spec, tuple):
        return tuple(unflatten(v, flat) for v in spec)
    if isinstance(spec, list):
        return [unflatten(v, flat) for v in spec]
    return spec


class Crash(Exception):  # noqa: N818 - not an error of the caller's making
    """Raised by a step to simulate this actor dying (fault injection). As a Ray actor the process
    then really exits; in-process, the federation treats the member as dead."""


class RoleActor:
    """Base of PartyActor, CoordinatorActor and UserCohortActor; used as a Ray actor or in-process."""

    role = "role"

    def __init__(
        self,
        name: str | None = None,
        seed: int = 0,
        table: pa.Table | None = None,
        meta: dict | None = None,
        in_ray: bool = False,
        randomness: str = "seeded",
    ):
        """A member named ``name``; a Ray actor starts without one (``name=None``) and is given
        its member by :meth:`load`, so that a finished run's actor can serve the next run."""
        self.in_ray = in_ray
        self.ctx: StepContext | None = None
        if name is not None:
            self.load(name, seed, table, meta, randomness)

    def load(
        self, name: str, seed: int, table: pa.Table | None, meta: dict | None, randomness: str
    ) -> str:
        """Become member ``name`` of a run: a new context, so nothing of an earlier run's state
        survives, and this process's peak-memory mark reset (benchmarks read it per run)."""
        self.ctx = StepContext(
            name=name,
            role=self.role,
            seed=seed,
            table=table,
            meta=dict(meta or {}),
            randomness=randomness,
        )
        if self.in_ray:
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")
        return name

    def _step(self, step, args, kwargs):
        self.ctx.noise.begin_step()
        try:
            return step(self.ctx, *args, **kwargs)
        except Crash:
            if self.in_ray:
                os._exit(17)
            raise

    def ping(self) -> str:
        if self.ctx is None:
            raise RuntimeError("this actor holds no member: it restarted, or its load failed")
        return self.ctx.name

    def noise_fingerprints(self) -> list[str]:
        """Digests of every noise release this actor drew (see NoiseSource.fingerprints)."""
        return list(self.ctx.noise.fingerprints)

    def pid(self) -> int:
        """This actor's process id (the driver mutes Ray's report of an injected death)."""
        return os.getpid()

    def node(self) -> str:
        """The Ray node this actor runs on ("local" in-process)."""
        if not self.in_ray:
            return "local"
        import ray

        return ray.get_runtime_context().get_node_id()

    def _meta(self, reply: Message) -> MessageMeta:
        if reply.dp_event is not None:  # refused unless a mechanism drew it in this very step
            self.ctx.noise.check_carried(reply.dp_event, f"message {reply.name!r}")
        return MessageMeta(
            name=reply.name,
            sender=self.ctx.name,
            to=reply.to,
            nbytes=nbytes_of(reply.payload),
            dp_event=reply.dp_event,
            scope=reply.scope or (self.ctx.name if reply.dp_event is not None else None),
            shares_of=tuple((m.label, m.event) for m in self.ctx.noise.parts),
            shared=reply.dp_event is not None and reply.dp_event in self.ctx.noise.shared,
        )

    def run(self, step, spec, *flat) -> tuple[MessageMeta | None, Any]:
        """Execute ``step(ctx, *args, **kwargs)``; return (transcript meta or None, payload)."""
        args, kwargs = unflatten(spec, flat)
        reply = self._step(step, args, kwargs)
        if not isinstance(reply, Message):
            self.ctx.noise.check_all_carried([])
            if self.ctx.noise.parts:
                raise UnaccountedNoise(
                    f"{self.ctx.name}: a share of a declared release leaves its step outside a "
                    "Message (the transcript could not check the release is carried)"
                )
            return None, reply
        meta = self._meta(reply)
        self.ctx.noise.check_all_carried([reply.dp_event] if reply.dp_event is not None else [])
        return meta, reply.payload

    def run_scatter(self, step, names: list[str], spec, *flat) -> tuple:
        """Execute a step that returns one Message per receiver in ``names``; return
        (metas by receiver, payload for names[0], payload for names[1], …) — one object each, so
        every receiver is sent only its own message."""
        args, kwargs = unflatten(spec, flat)
        replies = self._step(step, args, kwargs)
        if sorted(replies) != sorted(names):
            raise ValueError(f"scatter step answered {sorted(replies)}, expected {sorted(names)}")
        metas = {name: self._meta(replies[name]) for name in names}
        if self.ctx.noise.parts:  # the shares are recorded once, on the first message
            for name in names[1:]:
                metas[name] = dataclasses.replace(metas[name], shares_of=())
        self.ctx.noise.check_all_carried(
            [replies[n].dp_event for n in names if replies[n].dp_event is not None]
        )
        return (metas, *(replies[name].payload for name in names))
