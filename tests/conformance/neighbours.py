"""Neighbouring datasets from a plan's declared data domain, and a noiseless probe that records
every release's exact query value — the pieces of the empirical sensitivity check
(``test_sensitivity.py``).

Neighbours are built from the plan's member tables after planning (the plan's parameters stay
those of D: they are public), at the last unit, so that no other unit's position moves (with no
key, each row is a unit: the last row of every member, one unit per member where members hold
different units):

* replace one unit: D holds the unit at one corner of the declared domain, D′ at the opposite
  one — at one party only if the relation says so;
* add or remove one unit: D′ is D without the unit; and the unit added back at the domain's
  farthest point to D′ (under the same id and in the same place: a plan's public parameters —
  its count of users, a registry of ids — stay those of D, so the unit added must be one they
  already name).

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

from rayfed.privacy import Ball, DataDomain, Field, Interval, OneHot
from rayfed.privacy.measurement import Measurement


@dataclass
class Seen:
    measurement: Measurement
    values: np.ndarray
    ids: np.ndarray | None
    release: Any


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

    def observe(self, m: Measurement, actor: str, values, ids, noiseless):
        key = (actor, m.label, self._calls[(actor, m.label)])
        self._calls[(actor, m.label)] += 1
        exact = np.array(values, copy=True)
        release = noiseless(values)
        self.seen[key] = Seen(m, exact, None if ids is None else np.array(ids), release)
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


def _unit_rows(table: pa.Table, key: str | None, unit) -> np.ndarray:
    if key is None:  # each row a unit: the member's last
        return np.arange(table.num_rows)[-1:]
    return np.flatnonzero(table.column(key).to_numpy() == unit)


def _last_unit(members: dict, key: str | None):
    tables = [t for t, _ in members.values() if t.num_rows]
    if key is None:
        return None  # every member's last row (_unit_rows)
    return max(np.max(t.column(key).to_numpy()) for t in tables)


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
        rows = _unit_rows(table, data.key, unit)
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
        keep[_unit_rows(table, data.key, unit)] = False
        out[name] = (table.filter(pa.array(keep)), meta)
    return out


def neighbouring_plans(plan) -> list[tuple[str, Any, Any]]:
    """``(name, plan of D, plan of D′)`` pairs from the plan's declared relation and data."""
    privacy = plan.privacy
    data, relation = privacy.data, privacy.relation
    members = _members(plan, data)
    unit = _last_unit(members, data.key)
    pairs = []
    if relation.kind == "replace_one":
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
        without = _without(plan, data, unit)
        far = _placed(plan, data, unit, lambda name, f: _farthest(f))
        pairs.append(("removed", members, without))
        pairs.append(("added at the farthest point", without, far))
    return [(n, _with_members(plan, data, a), _with_members(plan, data, b)) for n, a, b in pairs]


# --- the comparison --------------------------------------------------------------------------------
def _distance(a: np.ndarray, b: np.ndarray, norm: int) -> float:
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if norm == 0:
        return float(np.count_nonzero(d))
    return float(np.linalg.norm(d.ravel(), ord=norm))


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
    diff = [rows_a.get(u, zero) - rows_b.get(u, zero) for u in users]
    if mechanism.norm == 0:
        return float(sum(np.count_nonzero(d) for d in diff))
    return float(np.linalg.norm(np.sum(diff, axis=0).ravel(), ord=mechanism.norm))


def moves(d: Probe, d_prime: Probe) -> list[tuple[str, float, float]]:
    """``(release, how far it moved, its Δ)`` for every release of the two runs: a release of
    per-user rows (drawn with ids) across all actors that drew it, any other one per actor."""
    assert set(d.seen) == set(d_prime.seen), "the two runs made different releases"
    out = []
    groups: dict[tuple, list] = {}
    for key, seen in sorted(d.seen.items()):
        actor, label, call = key
        group = (label, call) if seen.ids is not None else key
        groups.setdefault(group, []).append(key)
    for group, keys in groups.items():
        m = d.seen[keys[0]].measurement
        a, b = [d.seen[k] for k in keys], [d_prime.seen[k] for k in keys]
        if a[0].ids is not None:
            moved = _per_user_move(a, b, m.mechanism)
        elif getattr(m.mechanism, "per_row", False):  # rows by position: count those changed
            x, y = np.atleast_1d(a[0].values), np.atleast_1d(b[0].values)
            common = min(len(x), len(y))
            moved = float(abs(len(x) - len(y))) + sum(
                not np.array_equal(x[i], y[i]) for i in range(common)
            )
        else:
            x, y = np.asarray(a[0].values), np.asarray(b[0].values)
            rows = max(x.shape[0], y.shape[0]) if x.ndim else 0
            moved = _distance(_padded(x, rows), _padded(y, rows), m.mechanism.norm)
        out.append((str(group), moved, m.sensitivity))
    return out
