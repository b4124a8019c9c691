"""Neighbouring datasets from a plan's declared data domain, and a noiseless probe that records
every release's exact query value — the pieces of the empirical sensitivity check
(``test_sensitivity.py``).

Neighbours are built from the plan's member tables after planning (the plan's parameters stay
those of D: they are public). A unit is moved where it lies — the unit with the most rows for a
replacement, the last unit for a removal (so no other unit's position moves); with no key each
row is a unit, in one member where members hold different units (horizontal data) or in every
member (vertical data):

* replace one unit: D holds the unit at one corner of the declared domain, D′ at the opposite
  one — at one party only if the relation says so;
* add or remove one unit: D′ is D without the unit; and the unit added back at the domain's
  farthest point to D′ (under the same id and in the same place: a plan's public parameters —
  its count of users, a registry of ids — stay those of D, so the unit added must be one they
  already name); where rows are units by position, also D with a new row at the farthest point
  appended;
* a bounded replacement (``relation.within`` = w): D′ is D with the unit's data moved by w (its
  first column of each field, at one party if the relation says so) — the relation bounds the
  move, not the domain.

Under the probe every Poisson sample holds every unit (:meth:`Probe.sampled`): a sampled
release's sensitivity is that of its sum with the changed unit in it.

The D′ run replays D's releases (:class:`Probe` with ``replay``), so every release of D′ is
computed under the same history as D's: the adaptive notion of sensitivity.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.privacy import Ball, DataDomain, Field, Interval, OneHot, Unbounded
from rayfed.privacy.measurement import Measurement


@dataclass
class Seen:
    measurement: Measurement
    values: np.ndarray
    ids: np.ndarray | None
    release: Any
    #: a share of one release several actors draw (part_of, or a shared measurement)
    share: bool = False


class Probe:
    """Records ``(actor, label, call index) -> Seen``; with ``replay`` (a D-run's record) each
    release returns D's release at the same key, so the run follows D's history."""

    def __init__(self, replay: dict | None = None):
        self.seen: dict[tuple, Seen] = {}
        self.replay = replay
        self._calls: Counter = Counter()

    @staticmethod
    def sampled(mask: np.ndarray) -> np.ndarray:
        """A Poisson sample under the probe: every unit in (the worst case for a release)."""
        return np.ones_like(mask, dtype=bool)

    def observe(self, m: Measurement, actor: str, values, ids, noiseless, share=False):
        key = (actor, m.label, self._calls[(actor, m.label)])
        self._calls[(actor, m.label)] += 1
        exact = np.array(values, copy=True)
        release = noiseless(values)
        ids = None if ids is None else np.array(ids)
        self.seen[key] = Seen(m, exact, ids, release, share or m.shared)
        if self.replay is None:
            return release
        if key not in self.replay:
            raise AssertionError(f"{key} was released in the neighbour's run only")
        return self.replay[key].release


# --- neighbouring tables ---------------------------------------------------------------------------
def _members(plan, data: DataDomain) -> dict[str, tuple[pa.Table, dict]]:
    return getattr(plan, data.members)


def _with_members(plan, data: DataDomain, members: dict) -> Any:
    return dataclasses.replace(plan, **{data.members: members})


def _corners(field: Field) -> tuple[np.ndarray, np.ndarray]:
    domain = field.domain
    if isinstance(domain, OneHot):  # an integer column: its first and last value
        return np.array([0.0]), np.array([float(domain.size - 1)])
    if isinstance(domain, Interval):
        width = len(field.columns)
        return np.full(width, domain.low), np.full(width, domain.high)
    return domain.corners()


def _farthest(field: Field) -> np.ndarray:
    domain = field.domain
    if isinstance(domain, OneHot):
        return np.array([float(domain.size - 1)])
    if isinstance(domain, Interval):
        return np.full(len(field.columns), Interval(domain.low, domain.high).farthest()[0])
    assert isinstance(domain, Ball)
    return domain.farthest()


@dataclass(frozen=True)
class Unit:
    """The unit whose data changes: its key value, or (without a key) its row position — in
    one member (``member``: horizontal data) or in every member (vertical data)."""

    value: Any
    member: str | None = None


def _unit_rows(table: pa.Table, name: str, data: DataDomain, unit: Unit) -> np.ndarray:
    if unit.member is not None and name != unit.member:
        return np.array([], dtype=np.int64)
    if data.key is None:
        inside = unit.value < table.num_rows
        return np.array([unit.value]) if inside else np.array([], dtype=np.int64)
    return np.flatnonzero(table.column(data.key).to_numpy() == unit.value)


def _largest_unit(members: dict, data: DataDomain) -> Unit:
    """The unit holding the most rows (a cap on rows per unit is exercised where one exists);
    without a key every unit is one row: the last."""
    if data.key is None:
        return _last_unit(members, data)
    keys = np.concatenate([t.column(data.key).to_numpy() for t, _ in members.values()])
    values, counts = np.unique(keys, return_counts=True)
    return Unit(values[np.argmax(counts)])


def _last_unit(members: dict, data: DataDomain) -> Unit:
    """The last unit: no other unit's position moves when it changes or goes."""
    held = {name: t for name, (t, _) in members.items() if t.num_rows}
    if data.key is not None:
        return Unit(max(np.max(t.column(data.key).to_numpy()) for t in held.values()))
    if data.partition == "vertical":
        return Unit(min(t.num_rows for t in held.values()) - 1)
    last = sorted(held)[-1]
    return Unit(held[last].num_rows - 1, last)


def _set(table: pa.Table, rows: np.ndarray, columns: tuple[str, ...], point: np.ndarray):
    for col, value in zip(columns, point, strict=True):
        i = table.schema.get_field_index(col)
        array = table.column(col).to_numpy().copy()
        array[rows] = value
        table = table.set_column(i, col, pa.array(array, type=table.schema.field(col).type))
    return table


def _fields_of(table: pa.Table, data: DataDomain) -> list[Field]:
    names = set(table.column_names)
    return [f for f in data.fields if set(f.columns) <= names]


def _placed(plan, data: DataDomain, unit, which) -> dict:
    """The members with the unit's fields set by ``which(field)`` (None: left as they are)."""
    out = {}
    for name, (table, meta) in _members(plan, data).items():
        rows = _unit_rows(table, name, data, unit)
        for field in _fields_of(table, data):
            point = which(name, field)
            if point is not None and rows.size:
                table = _set(table, rows, field.columns, point)
        out[name] = (table, meta)
    return out


def _without(plan, data: DataDomain, unit) -> dict:
    out = {}
    for name, (table, meta) in _members(plan, data).items():
        keep = np.ones(table.num_rows, dtype=bool)
        keep[_unit_rows(table, name, data, unit)] = False
        out[name] = (table.filter(pa.array(keep)), meta)
    return out


def _appended(plan, data: DataDomain, unit: Unit) -> dict:
    """D with a copy of the unit's row appended at the domain's farthest point (its member's
    last row: no other row's position moves)."""
    out = {}
    for name, (table, meta) in _members(plan, data).items():
        rows = _unit_rows(table, name, data, unit)
        if rows.size:
            extra = table.take(pa.array(rows))
            for field in _fields_of(table, data):
                extra = _set(extra, np.arange(extra.num_rows), field.columns, _farthest(field))
            table = pa.concat_tables([table, extra])
        out[name] = (table, meta)
    return out


def outside_domain(plan) -> list[str]:
    """The member columns whose values lie outside their declared field's domain."""
    data = plan.privacy.data
    found = []
    for name, (table, _) in _members(plan, data).items():
        for field in _fields_of(table, data):
            x = np.column_stack([table.column(c).to_numpy() for c in field.columns]).astype(float)
            domain = field.domain
            if isinstance(domain, Unbounded):  # no bound: only a bounded move protects it
                continue
            if isinstance(domain, OneHot):
                bad = (x < 0) | (x > domain.size - 1) | (x != np.round(x))
            elif isinstance(domain, Interval):
                bad = ~((x >= domain.low) & (x <= domain.high))
            else:
                bad = ~(np.linalg.norm(x, ord=domain.p, axis=1) <= domain.bound * (1 + 1e-12))
            if np.any(bad):
                found.append(f"{name}: {field.columns}")
    return found


def _moved(plan, data: DataDomain, unit, party, by: float) -> dict:
    """The members with the unit's data moved by ``by`` (ℓ2) along the first column of each of
    its fields — at ``party`` only, or everywhere (None)."""
    out = {}
    for name, (table, meta) in _members(plan, data).items():
        rows = _unit_rows(table, name, data, unit)
        if rows.size and party in (None, name):
            for field in _fields_of(table, data):
                col = field.columns[0]
                point = table.column(col).to_numpy()[rows].astype(np.float64) + by
                if pa.types.is_integer(table.schema.field(col).type):
                    point = np.round(point)  # an integer moved by an integer stays one
                table = _set_rows(table, rows, col, point)
        out[name] = (table, meta)
    return out


def _set_rows(table: pa.Table, rows: np.ndarray, col: str, values: np.ndarray) -> pa.Table:
    i = table.schema.get_field_index(col)
    array = table.column(col).to_numpy().copy()
    array[rows] = values
    return table.set_column(i, col, pa.array(array, type=table.schema.field(col).type))


def neighbouring_plans(plan) -> list[tuple[str, Any, Any]]:
    """``(name, plan of D, plan of D′)`` pairs from the plan's declared relation and data."""
    privacy = plan.privacy
    data, relation = privacy.data, privacy.relation
    members = _members(plan, data)
    last, unit = _last_unit(members, data), _largest_unit(members, data)
    pairs = []
    if relation.within is not None:
        for party in members if relation.at_one_party else [None]:
            moved = _moved(plan, data, unit, party, relation.within)
            pairs.append(
                (f"{party or 'every party'}: moved by {relation.within:g}", members, moved)
            )
    elif relation.kind == "replace_one":
        low = _placed(plan, data, unit, lambda name, f: _corners(f)[0])
        if relation.at_one_party:
            for party in members:
                high = _placed(
                    plan, data, unit, lambda name, f, p=party: _corners(f)[1 if name == p else 0]
                )
                pairs.append((f"{party}: corner to corner", low, high))
        else:
            high = _placed(plan, data, unit, lambda name, f: _corners(f)[1])
            pairs.append(("corner to corner", low, high))
        original = _members(plan, data)
        far = _placed(plan, data, unit, lambda name, f: _farthest(f))
        pairs.append(("moved to the farthest point", original, far))
    else:
        without = _without(plan, data, last)
        far = _placed(plan, data, last, lambda name, f: _farthest(f))
        pairs.append(("removed", members, without))
        pairs.append(("added back at the farthest point", without, far))
        # rows by position: a new row names no unit the plan must know; zero-out's unit stays
        if data.key is None and relation.kind == "add_or_remove_one":
            pairs.append(("a new row at the farthest point", members, _appended(plan, data, last)))
    return [(n, _with_members(plan, data, a), _with_members(plan, data, b)) for n, a, b in pairs]


# --- the comparison --------------------------------------------------------------------------------
def _difference(a, b, modulus: int | None = None) -> np.ndarray:
    if modulus is None:
        return np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return _ring_difference(a, b, modulus)


def _norm(d: np.ndarray, norm: int) -> float:
    if norm == 0:
        return float(np.count_nonzero(d))
    return float(np.linalg.norm(np.asarray(d).ravel(), ord=norm))


def _distance(a: np.ndarray, b: np.ndarray, norm: int, modulus: int | None = None) -> float:
    return _norm(_difference(a, b, modulus), norm)


def _ring_difference(a: np.ndarray, b: np.ndarray, modulus: int) -> np.ndarray:
    """a − b for words of Z_modulus (modulus 2^b, b <= 64), as the signed residue nearest 0: the
    distance of two padded aggregates under the same pads is their sums' change, whatever wraps
    (computed in integers: words near 2^64 do not fit a float exactly)."""
    bits = modulus.bit_length() - 1
    assert modulus == 1 << bits and bits <= 64, f"a ring of words is Z_2^b, b <= 64: {modulus}"
    diff = np.asarray(a).astype(np.uint64) - np.asarray(b).astype(np.uint64)  # mod 2^64
    if bits < 64:
        diff &= np.uint64(modulus - 1)
        signed = diff.astype(np.int64)
        signed[signed >= modulus // 2] -= modulus
        return signed.astype(np.float64)
    return diff.view(np.int64).astype(np.float64)


def _padded(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` with zero rows appended up to ``rows`` (a removed unit compares with nothing)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0 or a.shape[0] >= rows:
        return a
    return np.concatenate([a, np.zeros((rows - a.shape[0], *a.shape[1:]))])


def _by_user(seen: list[Seen]) -> dict:
    """user id -> its row, over every actor's part of one per-user release."""
    return {
        int(u): np.atleast_1d(np.asarray(row, dtype=np.float64))
        for s in seen
        for u, row in zip(s.ids, np.asarray(s.values), strict=True)
    }


def _per_user_move(a: list[Seen], b: list[Seen], mechanism) -> float:
    """How far a release made of per-user rows moved: the rows aligned by user id (a missing
    user's row differs from any); in ℓ0 the rows (a per-user report) or entries that changed, in
    ℓ1/ℓ2 the change of their sum."""
    rows_a, rows_b = _by_user(a), _by_user(b)
    users = sorted(set(rows_a) | set(rows_b))
    if mechanism.norm == 0 and getattr(mechanism, "per_row", False):
        return float(
            sum(
                u not in rows_a or u not in rows_b or not np.array_equal(rows_a[u], rows_b[u])
                for u in users
            )
        )
    width = next(iter((rows_a or rows_b).values())).shape
    zero = np.zeros(width)
    diff = np.array([rows_a.get(u, zero) - rows_b.get(u, zero) for u in users])
    if mechanism.norm == 0:
        return float(np.count_nonzero(diff))
    # every changed row counts, summed or not: ‖vec d‖ >= ‖Σ d‖, so rows whose changes cancel
    # in the sum cannot hide a move
    return float(np.linalg.norm(diff.ravel(), ord=mechanism.norm))


def moves(d: Probe, d_prime: Probe) -> list[tuple[str, float, float]]:
    """``(release, how far it moved, its Δ)`` for every release of the two runs: a release of
    per-user rows (drawn with ids) across all actors that drew it, any other one per actor."""
    assert set(d.seen) == set(d_prime.seen), "the two runs made different releases"
    out = []
    groups: dict[tuple, list] = {}
    # a release drawn in shares (or per user) is one release over every actor that drew it
    joint = {(k[1], k[2]) for k, seen in d.seen.items() if seen.share or seen.ids is not None}
    for key in sorted(d.seen):
        actor, label, call = key
        group = (label, call) if (label, call) in joint else key
        groups.setdefault(group, []).append(key)
    for group, keys in groups.items():
        m = d.seen[keys[0]].measurement
        a, b = [d.seen[k] for k in keys], [d_prime.seen[k] for k in keys]
        modulus = getattr(m.mechanism, "modulus", None)  # words of a ring (padded sums)
        if a[0].ids is not None:
            moved = _per_user_move(a, b, m.mechanism)
        elif len(keys) > 1 or a[0].share:  # one release drawn in shares: its sum moved
            change = sum(
                _difference(x.values, y.values, modulus) for x, y in zip(a, b, strict=True)
            )
            moved = _norm(change, m.mechanism.norm)
        elif getattr(m.mechanism, "per_row", False):  # rows by position: count those changed
            x, y = np.atleast_1d(a[0].values), np.atleast_1d(b[0].values)
            common = min(len(x), len(y))
            moved = float(abs(len(x) - len(y))) + sum(
                not np.array_equal(x[i], y[i]) for i in range(common)
            )
        else:
            x, y = np.asarray(a[0].values), np.asarray(b[0].values)
            rows = max(x.shape[0], y.shape[0]) if x.ndim else 0
            modulus = getattr(m.mechanism, "modulus", None)  # words of a ring (padded sums)
            moved = _distance(_padded(x, rows), _padded(y, rows), m.mechanism.norm, modulus)
        out.append((str(group), moved, m.sensitivity))
    return out
