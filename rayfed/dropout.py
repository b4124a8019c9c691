"""Availability of a protocol's members, round by round: a seeded, protocol-neutral model of who
is online, offline, late or lost, and how long each answer takes on a simulated clock.

A protocol names the phases of its round, in order, in its own words (:class:`Phases`): square-wave
has one, ``("report",)``; secure aggregation has ``("advertise", "share_keys", "masked_input",
"unmask")`` (:data:`rayfed.secagg.phases.PHASES`). Per round and member the model says
(:class:`Availability`):

* **online** — it answers every phase;
* **offline** — it is absent from the whole round (an availability model: :class:`Markov`,
  :class:`Outage`, :class:`Trace`);
* **late** at phase P — its answer to P comes after P's deadline (:class:`Stragglers`);
* **lost** at phase P — it answers every phase before P and none from P on (an i.i.d. rate per
  phase, or an explicit list of member ids per phase).

In each case ``phase`` is the first phase the member does not answer (``len(phases)`` when it
answers all); what a late or lost member means for the protocol (which messages it already sent,
which ones its peers wait for) is the protocol's to say — secure aggregation maps availability to
its drop codes in :mod:`rayfed.secagg.phases`.

A rate is a per-phase hazard: the probability of being lost at that phase for a member still
present (so rates of 0.1 at two phases lose 19 %, not 20 %). A member's draw is a pure function of
(root seed, round, member id), so schedules do not depend on how users are dealt to cohorts.
Explicit lists name member ids per phase and apply to every round. The models on top are pure,
vectorised functions of (root seed, round, ids):

* availability — :class:`Markov` (a per-user on/off chain across rounds, optionally diurnal),
  :class:`Outage` (a named group offline together for some rounds) and :class:`Trace` (a replayed
  file of (user, round, available[, latency_s]));
* latency — :class:`Stragglers`: every answer of a phase takes a log-normal time (or the trace's),
  and one that would arrive after the phase's deadline makes the member late at that phase.

Nothing sleeps: time runs on a simulated clock (:meth:`DropoutSchedule.simulated_seconds`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.special import ndtri

from rayfed import rng
from rayfed.config import option
from rayfed.errors import ConfigError, DataError

#: a member's availability in one round (:attr:`Availability.state`)
ONLINE, OFFLINE, LATE, LOST = 0, 1, 2, 3


@dataclass(frozen=True)
class Phases:
    """The phases of a protocol's round, in order, in the protocol's own names.

    ``draws`` gives, per phase, the column of a member's keyed uniforms (purpose ``"dropout"``)
    that its i.i.d. loss rate reads (default: the phase's index); a protocol whose seeded
    schedules predate its phase names keeps their draws by naming the columns they used."""

    names: tuple[str, ...]
    draws: tuple[int, ...] | None = None

    def __post_init__(self):
        if not self.names or len(set(self.names)) != len(self.names):
            raise ValueError(f"phases must be distinct names, got {self.names}")
        if self.draws is not None and sorted(self.draws) != list(range(len(self.names))):
            raise ValueError(f"draws must order the columns 0..{len(self.names) - 1}")

    def __len__(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def column(self, p: int) -> int:
        return p if self.draws is None else self.draws[p]


@dataclass(frozen=True, eq=False)
class Availability:
    """One round's availability of the members ``ids``: per member its state (ONLINE, OFFLINE,
    LATE, LOST) and the first phase it does not answer (``len(phases)`` when online)."""

    phases: Phases
    ids: np.ndarray
    state: np.ndarray
    phase: np.ndarray


def _earlier(phase, state, at, new_state, ties: bool) -> None:
    """Members whose ``at`` comes before (or, with ``ties``, at) their phase so far take it."""
    take = at <= phase if ties else at < phase
    phase[take] = at[take]
    state[take] = new_state


@dataclass(frozen=True)
class DropoutSchedule:
    """A protocol's availability model: per-phase loss rates, explicit per-phase lists of lost
    members, and the population models (availability, stragglers) on top of them, in the phase
    names of ``phases``."""

    phases: Phases
    rates: dict[str, float] = field(default_factory=dict)
    explicit: dict[str, list[int]] = field(default_factory=dict)
    #: availability models (Markov, Outage, Trace): offline at a round = absent from all of it
    availability: tuple = ()
    stragglers: Stragglers | None = None
    #: what the run should state of its population inputs (e.g. the trace's coverage), for the
    #: manifest: option -> record
    notes: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for name, table in (("population.rates", self.rates), ("population.lost", self.explicit)):
            for phase in table:
                if phase not in self.phases.names:
                    raise ConfigError(f"{name}.{phase}", "unknown phase", self.phases.names)
        for phase, rate in self.rates.items():
            if not 0 <= rate <= 1:
                raise ConfigError(
                    f"population.rates.{phase}", f"must be a probability in [0, 1], got {rate}"
                )

    def round(
        self, seed: int, round: int, ids: np.ndarray, *, latency: bool = True
    ) -> Availability:
        """Each member's availability at round ``round`` (without the latency model if not
        ``latency``). Where two causes meet, the earliest phase counts; at the same phase offline
        comes before lost, lost before late."""
        ids = np.asarray(ids, dtype=np.int64)
        n = len(self.phases)
        phase = np.full(ids.size, n, dtype=np.int8)
        state = np.full(ids.size, ONLINE, dtype=np.int8)
        if self.rates:
            u = rng.keyed_uniform(seed, "dropout", round, ids, n)
            for p in reversed(range(n)):
                hit = u[:, self.phases.column(p)] < self.rates.get(self.phases.names[p], 0.0)
                phase[hit] = p
            state[phase < n] = LOST
        for p, name in enumerate(self.phases.names):
            listed = np.isin(ids, np.asarray(self.explicit.get(name, []), dtype=np.int64))
            _earlier(phase, state, np.where(listed, p, n), LOST, ties=False)
        for model in self.availability:
            offline = ~model.online(seed, round, ids)
            _earlier(phase, state, np.where(offline, 0, n + 1), OFFLINE, ties=True)
        if latency and self.stragglers is not None:
            _earlier(phase, state, self.stragglers.missed(seed, round, ids, n), LATE, ties=False)
        return Availability(self.phases, ids, state, phase)

    def drop_phase(self, seed: int, round: int, ids: np.ndarray) -> np.ndarray:
        """Index into ``phases`` of the first phase each member does not answer (``len(phases)``
        when it answers all)."""
        return self.round(seed, round, ids).phase

    def one_message(self, seed: int, round: int, ids: np.ndarray) -> tuple[np.ndarray, float]:
        """For members who send one message per round (an LDP report): whether each member's
        message of round ``round`` arrives, and the round's simulated time. A member the rates,
        lists or availability models make absent from its first phase sends nothing; one whose
        answer takes longer than the deadline (its first phase's latency) is late. The server
        waits for the slowest answer, or until the deadline when one does not come in time."""
        ids = np.asarray(ids, dtype=np.int64)
        sent = self.round(seed, round, ids, latency=False).phase > 0
        if self.stragglers is None:
            return sent, 0.0
        latency = self.stragglers.latency(seed, round, ids, 1)[:, 0]
        arrived = sent & (latency <= self.stragglers.deadline_s)
        if not arrived.all():
            return arrived, float(self.stragglers.deadline_s)
        return arrived, float(latency.max()) if ids.size else 0.0

    def simulated_seconds(self, seed: int, round: int, ids: np.ndarray) -> dict[str, float]:
        """The simulated time of each phase of round ``round`` for the members ``ids``: the server
        waits for the slowest answer, or until the deadline when an answer it expects (from a
        member that answered every earlier phase in time) does not come in time. Without a latency
        model every phase takes 0 s."""
        ids = np.asarray(ids, dtype=np.int64)
        absent = self.round(seed, round, ids, latency=False).phase
        n = len(self.phases)
        s = self.stragglers
        latency = s.latency(seed, round, ids, n) if s is not None else np.zeros((ids.size, n))
        deadline = s.deadline_s if s is not None else 0.0
        late = latency > deadline if s is not None else np.zeros_like(latency, dtype=bool)
        late_before = np.cumsum(late, axis=1) - late > 0
        out = {}
        for c, phase in enumerate(self.phases.names):
            expected = (absent >= c) & ~late_before[:, c]
            answered = expected & (absent > c) & ~late[:, c]
            times = latency[answered, c]
            if np.any(expected & ~answered):
                out[phase] = float(deadline)
            else:
                out[phase] = float(times.max()) if times.size else 0.0
        return out


@dataclass(frozen=True)
class Markov:
    """Each user's device is on or off, a two-state Markov chain across rounds: it switches off
    with probability ``off`` and back on with probability ``on`` per round, starting from the
    chain's stationary share ``on / (on + off)``. With ``diurnal`` = a > 0 the rates follow a
    daily cycle of ``period`` rounds: off·(1 + a·sin θ) and on·(1 - a·sin θ), θ = 2π·round/period
    (so devices are scarcer half of the day). A user's state at round r is a pure function of
    (seed, id, r): the chain is replayed from round 0 with keyed uniforms."""

    off: float
    on: float
    diurnal: float = 0.0
    period: int = 24

    def __post_init__(self):
        for name in ("off", "on"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"population.markov_{name}", "must be a probability in (0, 1]")
        if not 0 <= self.diurnal < 1:
            raise ConfigError(
                "population.diurnal", f"the amplitude must be in [0, 1), got {self.diurnal}"
            )
        if self.period < 1:
            raise ConfigError("population.diurnal_period", "must be at least one round")

    def rates(self, round: int) -> tuple[float, float]:
        """(P(on -> off), P(off -> on)) at ``round``."""
        wave = self.diurnal * math.sin(2 * math.pi * round / self.period)
        return min(1.0, self.off * (1 + wave)), min(1.0, self.on * (1 - wave))

    def online(self, seed: int, round: int, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        state = rng.keyed_uniform(seed, "availability", 0, ids)[:, 0] < self.on / (
            self.on + self.off
        )
        for r in range(1, round + 1):
            u = rng.keyed_uniform(seed, "availability", r, ids)[:, 0]
            p_off, p_on = self.rates(r)
            state = np.where(state, u >= p_off, u < p_on)
        return state


@dataclass(frozen=True)
class Outage:
    """A named group of users (a cohort, a region, an app version) offline together for
    ``rounds`` rounds from round ``start``."""

    name: str
    users: tuple[int, ...]
    start: int = 0
    rounds: int = 1

    def online(self, seed: int, round: int, ids: np.ndarray) -> np.ndarray:
        if not self.start <= round < self.start + self.rounds:
            return np.ones(len(ids), dtype=bool)
        return ~np.isin(np.asarray(ids, dtype=np.int64), np.asarray(self.users, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Trace:
    """A replayed availability trace: rows (user, round, available[, latency_s]); a (user, round)
    the trace does not list is available, with no recorded latency."""

    user: np.ndarray
    round: np.ndarray
    available: np.ndarray
    latency_s: np.ndarray | None = None

    @staticmethod
    def read(path: str | Path, setting: str = "population.trace") -> Trace:
        """A CSV or Parquet trace file, checked (errors name the option ``setting``): integer
        user and round (rounds 0-based, both >= 0), availability 0/1 or boolean, latency_s >= 0
        and finite (empty where none is recorded: a column of empty cells records none); a
        (user, round) listed twice must say the same both times (identical repeats count once).
        Columns are numbers or booleans (decimals count as numbers); a text column is refused,
        even one of numerals (a CSV reader makes a column of numerals numbers)."""
        from rayfed.data import load_table

        table = load_table(path, field=setting)
        missing = [c for c in ("user", "round", "available") if c not in table.column_names]
        if missing:
            raise DataError(
                setting, f"the trace lacks column(s) {missing}", "user, round, available"
            )
        user = _ints(table, "user", setting)
        rounds = _ints(table, "round", setting)
        available = _flags(table, "available", setting)
        latency = _latency(table, setting) if "latency_s" in table.column_names else None
        return _deduplicated(user, rounds, available, latency, setting)

    def coverage(self, rounds: int, ids: np.ndarray, setting: str = "population.trace") -> dict:
        """What of this trace applies to a run of ``rounds`` rounds (0-based) and members ``ids``:
        rows used and ignored, run users and rounds the trace lists, and (user, round) pairs it
        covers (``pairs_timed``: those with a recorded latency). Refuses (errors name the option
        ``setting``) a trace that reads as numbered from 1 (:meth:`_check_one_based`) and one of
        which nothing applies."""
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        in_run = np.isin(self.user, ids) & (self.round < rounds)
        self._check_one_based(rounds, setting)
        if not in_run.any():
            raise DataError(
                setting,
                f"nothing of the trace applies to this run: its users {_span(self.user)} and "
                f"rounds {_span(self.round)} do not meet the run's users {_span(ids)} and "
                f"{_rounds(rounds)} (rounds are 0-based)",
                "a trace of this run's user ids and rounds, or population.availability/latency "
                "other than trace",
            )
        cover = {
            "rows": int(self.user.size),
            "rows_used": int(in_run.sum()),
            "rows_ignored": int((~in_run).sum()),
            "users": int(ids.size),
            "users_listed": int(np.unique(self.user[in_run]).size),
            "rounds": int(rounds),
            "rounds_listed": int(np.unique(self.round[in_run]).size),
            "pairs": int(ids.size) * int(rounds),
            "pairs_listed": int(in_run.sum()),
        }
        if self.latency_s is not None:
            cover["pairs_timed"] = int((in_run & ~np.isnan(self.latency_s)).sum())
        return cover

    def _check_one_based(self, rounds: int, setting: str) -> None:
        """Refuses a trace that reads as numbered from 1 for a run of rounds 0..R-1: its rounds
        within 1..R, none at 0 and some at R (outside the run as read 0-based), unless those at R
        are few beside its other rounds (fewer than 1/``_STRAY`` of the median rows per listed
        round: stray rows of a 0-based trace, which the coverage note states). The message gives
        both readings and both fixes."""
        listed, count = np.unique(self.round, return_counts=True)
        if not listed.size or listed[0] < 1 or listed[-1] != rounds:
            return
        if listed.size > 1 and count[-1] * _STRAY < np.median(count[:-1]):
            return
        at_last = _count(int(count[-1]), "row")
        run = f"this run has {_count(rounds, 'round')}, {_rounds(rounds)} (0-based)"
        if listed.size == 1:
            problem = (
                f"the trace lists only round {rounds} ({at_last}), and {run}: counted from 1, "
                f"its round {rounds} is this run's round {rounds - 1}; counted from 0, it is "
                "outside the run and nothing of the trace applies"
            )
            fix = (
                "if the trace is 1-based, subtract 1 from its round column; if 0-based, its "
                f"round {rounds} is outside this run's {_rounds(rounds)}: run more rounds, or "
                "give a trace of this run's rounds"
            )
        else:
            problem = (
                f"the trace's rounds are {listed[0]}..{rounds}, none at 0, and {run}: counted "
                f"from 1, its rounds 1..{rounds} are this run's 0..{rounds - 1} and, read as "
                f"they are, each row would apply one round late; counted from 0, its {at_last} "
                f"at round {rounds} {'is' if count[-1] == 1 else 'are'} outside the run"
            )
            fix = (
                "if the trace is 1-based, subtract 1 from its round column; if 0-based, its "
                f"round {rounds} is outside this run's {_rounds(rounds)}: drop those rows or "
                "run more rounds"
            )
        raise DataError(setting, problem, fix)

    def _rows(self, round: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the trace row of each id at ``round``, whether the trace has one)."""
        at = np.flatnonzero(self.round == round)
        if at.size == 0:
            return np.zeros(ids.size, dtype=np.int64), np.zeros(ids.size, dtype=bool)
        at = at[np.argsort(self.user[at], kind="stable")]
        pos = np.minimum(np.searchsorted(self.user[at], ids), at.size - 1)
        return at[pos], self.user[at][pos] == ids

    def online(self, seed: int, round: int, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        rows, found = self._rows(round, ids)
        out = np.ones(ids.size, dtype=bool)
        out[found] = self.available[rows[found]]
        return out

    def latency(self, round: int, ids: np.ndarray) -> np.ndarray:
        """Each id's recorded latency at ``round`` (NaN where the trace has none)."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.full(ids.size, np.nan)
        if self.latency_s is not None:
            rows, found = self._rows(round, ids)
            out[found] = self.latency_s[rows[found]]
        return out


@dataclass(frozen=True)
class Stragglers:
    """Per member and phase, the time its answer takes: log-normal with median ``median_s`` and
    shape ``sigma`` (or the trace's latency where it records one, for every phase of that round);
    an answer later than the phase's deadline ``deadline_s`` makes the member late at that phase."""

    median_s: float = 1.0
    sigma: float = 1.0
    deadline_s: float = 10.0
    trace: Trace | None = None

    def __post_init__(self):
        for name in ("median_s", "deadline_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"population.latency_{name}", f"must be positive, got {getattr(self, name)}"
                )
        if not self.sigma >= 0:
            raise ConfigError("population.latency_sigma", f"must be >= 0, got {self.sigma}")

    def latency(self, seed: int, round: int, ids: np.ndarray, phases: int) -> np.ndarray:
        """(members x ``phases``) seconds; a member's answer to phase c is its c-th draw, whatever
        the number of phases."""
        ids = np.asarray(ids, dtype=np.int64)
        u = rng.keyed_uniform(seed, "latency", round, ids, phases)
        z = ndtri(np.clip(u, 2.0**-53, 1 - 2.0**-53))
        out = self.median_s * np.exp(self.sigma * z)
        if self.trace is not None:
            recorded = self.trace.latency(round, ids)
            known = ~np.isnan(recorded)
            out[known] = recorded[known, None]
        return out

    def missed(self, seed: int, round: int, ids: np.ndarray, phases: int) -> np.ndarray:
        """The index of each member's first late answer (``phases`` if none is late)."""
        late = self.latency(seed, round, ids, phases) > self.deadline_s
        return np.where(late.any(axis=1), late.argmax(axis=1), phases).astype(np.int8)


def _span(values: np.ndarray) -> str:
    return f"{values.min()}..{values.max()}" if values.size else "(none)"


def _rounds(rounds: int) -> str:
    """A run's rounds, 0-based: 'round 0' or 'rounds 0..R-1'."""
    return "round 0" if rounds == 1 else f"rounds 0..{rounds - 1}"


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


#: rows at a trace's round R fewer than 1/_STRAY of the median rows per round are stray rows of a
#: 0-based trace, not the last round of a 1-based one (:meth:`Trace._check_one_based`)
_STRAY = 10


def _numbers(table, name: str, setting: str) -> np.ndarray:
    """Column ``name`` as float64 (nulls NaN): numbers, booleans and decimals; a column of empty
    cells only (type null) is all NaN; a text column, or one of another type, is refused."""
    column = table.column(name)
    kind = column.type
    if pa.types.is_dictionary(kind):
        column = pc.cast(column, kind.value_type)
        kind = column.type
    if pa.types.is_null(kind):
        return np.full(len(column), np.nan)
    if pa.types.is_decimal(kind):
        column = pc.cast(column, pa.float64())
        kind = column.type
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return column.to_numpy(zero_copy_only=False).astype(np.float64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        values = column.to_pylist()
        given = [i for i, v in enumerate(values) if v is not None]
        row = next((i for i in given if not _number(values[i])), given[0] if given else 0)
        raise DataError(
            setting,
            f"the trace's {name} column is a text column; numbers expected: row {row + 1} (of "
            f"the data rows) holds {values[row]!r}",
            _ALLOWED[name],
        )
    raise DataError(
        setting, f"the trace's {name} column holds {kind} values; numbers expected", _ALLOWED[name]
    )


def _number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


_ALLOWED = {
    "user": "integer user ids >= 0",
    "round": "integer rounds >= 0 (0-based: the first round is 0)",
    "available": "0/1 or true/false",
    "latency_s": "seconds >= 0, finite; an empty cell where none is recorded",
}


def _bad(setting: str, name: str, values: np.ndarray, bad: np.ndarray, what: str):
    row = int(np.flatnonzero(bad)[0])
    value = values[row]
    shown = "NaN or an empty cell" if math.isnan(value) else f"{value:g}"
    return DataError(
        setting,
        f"the trace's {name} must be {what}: row {row + 1} (of the data rows) holds {shown} "
        f"({int(bad.sum())} such row(s))",
        _ALLOWED[name],
    )


def _ints(table, name: str, setting: str) -> np.ndarray:
    values = _numbers(table, name, setting)
    bad = ~np.isfinite(values) | (values != np.round(values)) | (values < 0)
    if bad.any():
        raise _bad(setting, name, values, bad, "whole numbers >= 0")
    return values.astype(np.int64)


def _flags(table, name: str, setting: str) -> np.ndarray:
    values = _numbers(table, name, setting)
    bad = ~np.isin(values, (0.0, 1.0))
    if bad.any():
        raise _bad(setting, name, values, bad, "0 or 1 (false or true)")
    return values == 1.0


def _latency(table, setting: str) -> np.ndarray:
    """latency_s, NaN where a cell is empty (none recorded; a column of empty cells records
    none); NaN written out, inf or negative are refused."""
    column = table.column("latency_s")
    values = _numbers(table, "latency_s", setting)
    given = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    bad = given & ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        raise _bad(setting, "latency_s", values, bad, "seconds >= 0 and finite")
    return np.where(given, values, np.nan)


def _deduplicated(user, rounds, available, latency, setting: str) -> Trace:
    """The trace with each (user, round) once: a repeat that says the same is dropped, one that
    says otherwise (availability or recorded latency) is refused, naming the first such pair in
    the file's order."""
    key = np.stack([user, rounds], axis=1)
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if first.size == user.size:
        return Trace(user, rounds, available, latency)
    head = first[inverse]  # each row's first row of its (user, round)
    conflict = available != available[head]
    if latency is not None:
        a, b = latency, latency[head]
        conflict |= ~((a == b) | (np.isnan(a) & np.isnan(b)))
    if conflict.any():
        row = int(np.flatnonzero(conflict)[0])

        def said(i: int) -> str:
            shown = f", latency_s={latency[i]:g}" if latency is not None else ""
            return f"available={int(available[i])}{shown}"

        raise DataError(
            setting,
            f"user {user[row]} at round {rounds[row]} is listed twice and the rows disagree: "
            f"row {head[row] + 1} says {said(head[row])}, row {row + 1} says {said(row)} "
            f"({int(conflict.sum())} conflicting row(s))",
            "one row per (user, round)",
        )
    keep = np.sort(first)
    return Trace(
        user[keep],
        rounds[keep],
        available[keep],
        None if latency is None else latency[keep],
    )


_MARKOV = {"availability": ("markov",)}
_LATENCY = {"latency": ("lognormal", "trace")}


@dataclass(frozen=True)
class PopulationConfig:
    """The population models of a protocol that hosts users, as its nested ``population``
    options (``--set population.availability=markov``)."""

    availability: Literal["iid", "markov", "trace"] = option(
        "iid",
        "who is online each round, on top of the dropout rates: iid (the rates only), markov (a "
        "per-user on/off chain across rounds) or trace (replay the trace file)",
    )
    rates: dict[str, float] | None = option(
        None,
        "i.i.d. loss rate per phase, in the protocol's phase names (e.g. {share_keys: 0.05, "
        "unmask: 0.1}): a user still present is lost at that phase with that probability, each "
        "round; on top of the protocol's dropout rate",
    )
    lost: dict[str, list[int]] | None = option(
        None,
        "user ids lost at a phase in every round, in the protocol's phase names (e.g. "
        "{unmask: [3, 17]})",
    )
    markov_off: float = option(
        0.1, "markov: P(on -> off) per round", above=0, at_most=1, when=_MARKOV
    )
    markov_on: float = option(
        0.5, "markov: P(off -> on) per round", above=0, at_most=1, when=_MARKOV
    )
    diurnal: float = option(
        0.0,
        "markov: amplitude a of the daily cycle of both rates",
        at_least=0,
        below=1,
        when=_MARKOV,
    )
    diurnal_period: int = option(24, "markov: rounds per day", at_least=1, when=_MARKOV)
    outage: list[int] | None = option(
        None, "user ids offline together (a region, an app version) for outage_rounds rounds"
    )
    outage_cohort: str | None = option(None, "a cohort whose users are all offline together")
    outage_column: str | None = option(
        None, "a column of the data file (e.g. region): users whose value is outage_value"
    )
    outage_value: str | None = option(
        None, "the value of outage_column whose users are offline together (e.g. north)"
    )
    outage_start: int = option(0, "first round of the outage", at_least=0)
    outage_rounds: int = option(1, "rounds the outage lasts", at_least=1)
    latency: Literal["none", "lognormal", "trace"] = option(
        "none",
        "answer times on a simulated clock: none, lognormal per user and phase, or the trace's "
        "latency_s (lognormal where it has none); a late answer makes the user late at that phase",
    )
    latency_median_s: float = option(1.0, "median answer time in seconds", above=0, when=_LATENCY)
    latency_sigma: float = option(1.0, "log-normal shape σ", at_least=0, when=_LATENCY)
    latency_deadline_s: float = option(
        10.0, "deadline of every phase, seconds", above=0, when=_LATENCY
    )
    trace: str | None = option(
        None, "a CSV or Parquet file of (user, round, available[, latency_s])"
    )

    def validate(self) -> None:
        if ("trace" in (self.availability, self.latency)) != (self.trace is not None):
            raise ConfigError(
                "population.trace",
                "availability=trace or latency=trace reads the trace file, and only they do",
                "set both population.trace=FILE and population.availability=trace (or "
                "population.latency=trace), or neither",
            )
        if self.trace is not None:
            from rayfed.config import check_file

            check_file("population.trace", self.trace)
        if (self.outage_column is None) != (self.outage_value is None):
            raise ConfigError(
                "population.outage_value"
                if self.outage_value is None
                else "population.outage_column",
                "an outage by column needs both the column and its value",
                "e.g. population.outage_column=region population.outage_value=north",
            )
        given = [self.outage is not None, self.outage_cohort is not None]
        given.append(self.outage_column is not None)
        if sum(given) > 1:
            raise ConfigError(
                "population.outage_cohort",
                "give the outage's users, its cohort or its column, only one of them",
            )
        if not any(given):
            for name in ("outage_start", "outage_rounds"):
                if getattr(self, name) != getattr(PopulationConfig(), name):
                    raise ConfigError(
                        f"population.{name}",
                        "applies to an outage",
                        "set population.outage, population.outage_cohort or "
                        "population.outage_column",
                    )

    def schedule(
        self,
        phases: Phases,
        dropout: dict[str, float],
        cohorts: dict[str, np.ndarray] | None = None,
        users: tuple[np.ndarray, pa.Table] | None = None,
        rounds: int | None = None,
    ) -> DropoutSchedule:
        """The availability model of these options in the protocol's ``phases``: the protocol's
        own i.i.d. rate(s) ``dropout`` (phase -> rate, e.g. its ``dropout`` option at the phase it
        loses users), ``rates`` and ``lost`` beside them, and the population models; ``cohorts``
        (name -> user ids, known at plan time) resolves ``outage_cohort`` and marks the trace file
        to be read (before it, only the parameters are checked); ``users`` (the user ids and their
        data rows, aligned) resolves ``outage_column``; ``rounds`` (the run's number of rounds,
        0-based) refuses an outage that starts after the last round and a trace of which nothing
        applies, and states (a warning and ``DropoutSchedule.notes``) how much of the trace does."""
        rates = {phase: rate for phase, rate in dropout.items() if rate}
        for phase in self.rates or {}:
            if phase in rates:
                raise ConfigError(
                    f"population.rates.{phase}",
                    "the protocol's dropout rate is already lost at this phase",
                    f"give {phase}'s rate once: dropout or population.rates.{phase}",
                )
        rates.update(self.rates or {})
        explicit = {phase: list(ids) for phase, ids in (self.lost or {}).items()}
        planned = cohorts is not None
        trace = Trace.read(self.trace) if self.trace is not None and planned else None
        models: list = []
        if self.availability == "markov":
            models.append(
                Markov(self.markov_off, self.markov_on, self.diurnal, self.diurnal_period)
            )
        if self.availability == "trace" and trace is not None:
            models.append(trace)
        notes: dict = {}
        if trace is not None and rounds is not None:
            notes["population.trace"] = self._coverage(trace, rounds, cohorts)
        if rounds is not None:
            self._check_outage(rounds)
        group = self._outage_group(cohorts, users) if planned else self.outage
        if group is not None:
            models.append(
                Outage(
                    self.outage_cohort or self.outage_column or "outage",
                    tuple(int(u) for u in group),
                    self.outage_start,
                    self.outage_rounds,
                )
            )
        stragglers = None
        if self.latency != "none":
            stragglers = Stragglers(
                self.latency_median_s,
                self.latency_sigma,
                self.latency_deadline_s,
                trace if self.latency == "trace" else None,
            )
        return DropoutSchedule(
            phases,
            rates=rates,
            explicit=explicit,
            availability=tuple(models),
            stragglers=stragglers,
            notes=notes,
        )

    def _coverage(self, trace: Trace, rounds: int, cohorts: dict[str, np.ndarray]) -> dict:
        """How much of the run the trace covers (refused when nothing of it applies); a trace
        that leaves part of the run's (user, round) pairs unlisted, or lists some outside it, is
        stated in a warning."""
        ids = np.concatenate([np.asarray(v, dtype=np.int64) for v in cohorts.values()] or [[]])
        cover = trace.coverage(rounds, ids)
        if self.latency == "trace" and (trace.latency_s is None or np.isnan(trace.latency_s).all()):
            raise DataError(
                "population.trace",
                "latency=trace replays the trace's latency_s column, and the trace records none",
                "a latency_s column (seconds), or population.latency=lognormal",
            )
        availability, latency = self.availability == "trace", self.latency == "trace"
        lognormal = "log-normal times (latency_median_s, latency_sigma)"
        if availability and latency:
            cover["used_for"] = "availability and answer times"
            cover["unlisted"] = f"online, answering in {lognormal}"
            unlisted = (
                f"an unlisted user is online that round and its answers take {lognormal}, as do "
                "those of a listed one without latency_s"
            )
        elif availability:
            cover["used_for"] = "availability"
            cover["unlisted"] = "online"
            unlisted = "an unlisted user is online that round"
        else:
            cover["used_for"] = "answer times"
            cover["unlisted"] = f"answering in {lognormal}"
            unlisted = (
                f"the trace gives answer times only (population.availability={self.availability}"
                f", its available column unused): an unlisted user's answers take {lognormal}, "
                "as do those of a listed one without latency_s"
            )
        if not latency:
            cover.pop("pairs_timed", None)
        untimed = latency and cover["pairs_timed"] < cover["pairs_listed"]
        if cover["pairs_listed"] < cover["pairs"] or cover["rows_ignored"] or untimed:
            listed, last = np.unique(trace.round), trace.round == rounds
            cover["note"] = (
                f"population.trace covers {cover['pairs_listed']:,} of the run's "
                f"{cover['pairs']:,} (user, round) pairs ({cover['users_listed']:,} of "
                f"{cover['users']:,} users, {cover['rounds_listed']} of {cover['rounds']} rounds, "
                "0-based)"
                + (f", {cover['pairs_timed']:,} of them with a latency_s" if untimed else "")
                + f"; {unlisted}"
                + (
                    f"; {cover['rows_ignored']:,} of its {cover['rows']:,} rows name users or "
                    "rounds outside the run and are ignored"
                    if cover["rows_ignored"]
                    else ""
                )
                + (
                    f" ({int(last.sum()):,} at round {rounds} and none at round 0: if the trace "
                    "counts rounds from 1, subtract 1 from its round column)"
                    if last.any() and listed[0] > 0
                    else ""
                )
            )
            warnings.warn(cover["note"], RuntimeWarning, stacklevel=2)  # the report shows the note
        return cover

    def _check_outage(self, rounds: int) -> None:
        """An outage that starts at or after the run's last round would never happen."""
        given = (self.outage, self.outage_cohort, self.outage_column)
        if any(g is not None for g in given) and self.outage_start >= rounds:
            raise ConfigError(
                "population.outage_start",
                f"the outage starts at round {self.outage_start}, but this run has {rounds} "
                f"round(s), 0..{rounds - 1} (0-based): it would never happen",
                f"an outage_start in 0..{rounds - 1}, or more rounds",
            )

    def _outage_group(
        self, cohorts: dict[str, np.ndarray], users: tuple[np.ndarray, pa.Table] | None
    ):
        """The user ids of the outage (None without one): listed, a cohort's, or the users whose
        ``outage_column`` holds ``outage_value`` (compared as text)."""
        if self.outage is not None:
            return self.outage
        if self.outage_cohort is not None:
            if self.outage_cohort not in cohorts:
                raise ConfigError(
                    "population.outage_cohort", f"no cohort {self.outage_cohort!r}", sorted(cohorts)
                )
            return cohorts[self.outage_cohort]
        if self.outage_column is None:
            return None
        if users is None:
            raise ConfigError(
                "population.outage_column",
                "this run's users have no data columns",
                "a data file (data.path) with that column, or population.outage_cohort",
            )
        ids, table = users
        if self.outage_column not in table.column_names:
            raise DataError(
                "population.outage_column",
                f"column {self.outage_column!r} is not in the data",
                table.column_names,
            )
        text = pc.cast(table.column(self.outage_column), pa.string())
        hit = pc.fill_null(pc.equal(text, self.outage_value), False).to_numpy(zero_copy_only=False)
        if not hit.any():
            raise DataError(
                "population.outage_value",
                f"no user has {self.outage_column} = {self.outage_value!r}",
                "a value the column holds",
            )
        return np.asarray(ids)[hit]
