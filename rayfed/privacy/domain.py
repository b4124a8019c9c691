"""Input domains and neighbour relations: what a release's sensitivity is derived from.

A domain says where one unit's contribution to a query lives — every coordinate in an interval,
a vector in a norm ball, one category of a histogram, a bit vector. A relation says what one
neighbour changes: one unit (a user, a rating, a value) added or removed, or replaced by another
of the domain. The sensitivity of a sum of contributions in the ℓp norm then follows by one rule
(:func:`sensitivity`):

* add or remove one unit: the domain's radius, sup ‖x‖_p;
* replace one unit: the domain's diameter, sup ‖x − y‖_p;
* replace one unit by one at most ``within`` away (a bounded replacement, as the event-level or
  ν-bounded neighbours of some papers): the smaller of the diameter and that distance.

p is 1 or 2 for additive noise (Laplace, Gaussian), or 0 for mechanisms that randomise each
coordinate of a released vector on its own (randomized response over bits, one local report per
user): ‖·‖₀ counts the coordinates a neighbour changes.

:func:`enforce` applies a domain to data where it enters a protocol: values outside are clipped
and counted, or refused — never changed in silence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rayfed.errors import DataError

NORMS = (0, 1, 2)
KINDS = ("add_or_remove_one", "replace_one", "replace_special")


def _norm_of(p: int) -> None:
    if p not in NORMS:
        raise ValueError(f"a sensitivity is in the ℓ0, ℓ1 or ℓ2 norm, got ℓ{p}")


@dataclass(frozen=True)
class Interval:
    """Each of ``dim`` coordinates in [low, high]: a bounded value (dim 1) or a box."""

    low: float
    high: float
    dim: int = 1

    def __post_init__(self):
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"an interval needs finite low <= high, got [{self.low}, {self.high}]")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")

    def radius(self, p: int) -> float:
        _norm_of(p)
        if p == 0:
            return float(self.dim) if (self.low, self.high) != (0, 0) else 0.0
        return max(abs(self.low), abs(self.high)) * self.dim ** (1 / p)

    def diameter(self, p: int) -> float:
        _norm_of(p)
        if p == 0:
            return float(self.dim) if self.high > self.low else 0.0
        return (self.high - self.low) * self.dim ** (1 / p)

    def corners(self) -> tuple[np.ndarray, np.ndarray]:
        """Two points of the domain at distance :meth:`diameter` from each other."""
        return np.full(self.dim, float(self.low)), np.full(self.dim, float(self.high))

    def farthest(self) -> np.ndarray:
        """A point of norm :meth:`radius` (every norm at once)."""
        edge = self.low if abs(self.low) >= abs(self.high) else self.high
        return np.full(self.dim, float(edge))

    def clip(self, values: np.ndarray) -> tuple[np.ndarray, int]:
        """(values clipped into the interval, how many values were outside; NaN counts as
        outside and stays NaN: nothing to clip it to)."""
        values = np.asarray(values, dtype=np.float64)
        inside = (values >= self.low) & (values <= self.high)
        return np.clip(values, self.low, self.high), int(np.count_nonzero(~inside))

    def describe(self) -> str:
        box = f"[{self.low:g}, {self.high:g}]"
        return box if self.dim == 1 else f"{box}^{self.dim}"


@dataclass(frozen=True)
class Ball:
    """Vectors of R^dim with ℓp norm at most ``radius`` (p = 1 or 2): a clipped row, a gradient."""

    bound: float
    p: int = 2
    dim: int = 1

    def __post_init__(self):
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise ValueError(f"a ball needs a finite radius > 0, got {self.bound}")
        if self.p not in (1, 2) or self.dim < 1:
            raise ValueError(f"a ball is ℓ1 or ℓ2 in dim >= 1, got ℓ{self.p}, dim {self.dim}")

    def radius(self, p: int) -> float:
        _norm_of(p)
        if p == 0:
            return float(self.dim)
        if p == self.p or p == 2:  # ‖x‖₂ <= ‖x‖₁
            return float(self.bound)
        return self.bound * math.sqrt(self.dim)  # ‖x‖₁ <= sqrt(dim)·‖x‖₂

    def diameter(self, p: int) -> float:
        return self.radius(p) if p == 0 else 2 * self.radius(p)

    def corners(self) -> tuple[np.ndarray, np.ndarray]:
        x = self.farthest()
        return -x, x

    def farthest(self) -> np.ndarray:
        """A point of norm :meth:`radius` in ℓ1 and ℓ2 at once: on the diagonal of the ℓ2 ball,
        at a vertex of the ℓ1 ball."""
        if self.p == 1:
            x = np.zeros(self.dim)
            x[0] = self.bound
            return x
        return np.full(self.dim, self.bound / math.sqrt(self.dim))

    def clip(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """(each row scaled into the ball, how many rows were outside)."""
        rows = np.atleast_2d(np.asarray(rows, dtype=np.float64))
        norms = np.linalg.norm(rows, ord=self.p, axis=1)
        outside = ~(norms <= self.bound)  # a row with NaN is outside
        scale = np.where(outside, self.bound / np.where(outside, norms, 1.0), 1.0)
        return rows * scale[:, None], int(np.count_nonzero(outside))

    def describe(self) -> str:
        return f"ℓ{self.p} ball of radius {self.bound:g} in R^{self.dim}"


@dataclass(frozen=True)
class OneHot:
    """One of ``size`` categories, as a one-hot vector: a record's contribution to a histogram."""

    size: int

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"a one-hot domain needs size >= 1, got {self.size}")

    def radius(self, p: int) -> float:
        _norm_of(p)
        return 1.0

    def diameter(self, p: int) -> float:
        _norm_of(p)
        if self.size == 1:
            return 0.0
        return {0: 2.0, 1: 2.0, 2: math.sqrt(2.0)}[p]

    def corners(self) -> tuple[np.ndarray, np.ndarray]:
        a, b = np.zeros(self.size), np.zeros(self.size)
        a[0], b[-1] = 1.0, 1.0
        return a, b

    def farthest(self) -> np.ndarray:
        return self.corners()[0]

    def describe(self) -> str:
        return f"one of {self.size} categories"


@dataclass(frozen=True)
class Bits:
    """Any vector of ``width`` bits (a unit may set or clear every one)."""

    width: int

    def radius(self, p: int) -> float:
        _norm_of(p)
        return float(self.width) if p != 2 else math.sqrt(self.width)

    def diameter(self, p: int) -> float:
        return self.radius(p)

    def corners(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(self.width), np.ones(self.width)

    def farthest(self) -> np.ndarray:
        return np.ones(self.width)

    def describe(self) -> str:
        return f"{self.width} bits"


@dataclass(frozen=True)
class Unbounded:
    """Any vector of R^dim: no bound at all. Its radius and diameter are infinite, so only a
    bounded replacement (:attr:`Neighbours.within`) gives a release on it a sensitivity — a
    relation such as a paper's "one entry moves by at most 1" on otherwise unbounded data."""

    dim: int = 1

    def __post_init__(self):
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")

    def radius(self, p: int) -> float:
        _norm_of(p)
        return float(self.dim) if p == 0 else math.inf

    def diameter(self, p: int) -> float:
        return self.radius(p)

    def describe(self) -> str:
        return "R" if self.dim == 1 else f"R^{self.dim}"


Domain = Interval | Ball | OneHot | Bits | Unbounded


@dataclass(frozen=True)
class Neighbours:
    """The neighbour relation: one ``unit`` added or removed, replaced by another of its domain,
    or (``replace_special``, "zero-out") replaced by the empty record while the unit stays and
    takes part — its device still runs the protocol, contributing zero and any noise share it adds.
    Zero-out is the relation of a distributed noise sum: its neighbours hold the same number of
    noise shares (under add/remove the removed unit's share would leave with it). ``at_one_party``: the unit's data changes at one party only ("DP in VFL", where
    parties hold column blocks of the same users). ``kind`` is what the sensitivity rule and the
    accountant read; ``unit`` names what is protected in the statement.

    ``within``: a bounded replacement — the unit's data moves by at most this ℓ2 distance (for
    one value, |x − x′| <= within). A weaker relation than a replacement anywhere in the domain
    (a paper's event-level or ν-bounded neighbours): a protocol offering it names it as such.
    """

    kind: Literal["add_or_remove_one", "replace_one", "replace_special"]
    unit: str
    at_one_party: bool = False
    within: float | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"a neighbour relation is one of {KINDS}, got {self.kind!r}")
        if self.within is not None:
            if self.kind != "replace_one":
                raise ValueError("a bounded move (within) is a replacement: kind='replace_one'")
            if not (math.isfinite(self.within) and self.within > 0):
                raise ValueError(f"within is a finite distance > 0, got {self.within}")

    def describe(self) -> str:
        where = " at one party" if self.at_one_party else ""
        if self.kind == "replace_special":
            return (
                f"one {self.unit}'s data replaced by the empty record{where} (zero-out: the "
                f"{self.unit} stays and takes part)"
            )
        verb = "added or removed" if self.kind == "add_or_remove_one" else "replaced"
        moved = f", moved by at most {self.within:g}" if self.within is not None else ""
        return f"one {self.unit} {verb}" + where + moved


@dataclass(frozen=True)
class Field:
    """Columns of a member's table that hold a unit's data, and their declared domain: an
    :class:`Interval` (every column in it), a :class:`Ball` over the columns together, or a
    :class:`OneHot` of one integer column (values 0 … size − 1)."""

    columns: tuple[str, ...]
    domain: Domain


@dataclass(frozen=True)
class DataDomain:
    """Where the protected units live in a plan's member tables, and their declared domain: what
    the conformance suite's sensitivity check builds neighbouring datasets from.

    ``members`` names the plan's group that holds the data (``"parties"`` or ``"cohorts"``);
    ``key`` the column naming a unit's rows (None: each row is a unit, by position);
    ``partition`` whether members hold different units (``"horizontal"``: users dealt to parties
    or cohorts) or different fields of the same units (``"vertical"``: a user's columns spread
    over parties, aligned by key or position).
    """

    fields: tuple[Field, ...]
    members: Literal["parties", "cohorts"] = "parties"
    key: str | None = None
    partition: Literal["horizontal", "vertical"] = "horizontal"


def sensitivity(domain: Domain, relation: Neighbours, p: int) -> float:
    """The ℓp sensitivity of a sum of contributions in ``domain`` under ``relation``: the
    domain's radius for add/remove and zero-out, its diameter for replace — or, for a bounded replacement
    (``relation.within`` = w, an ℓ2 distance), the smaller of the diameter and w in ℓ2, w·√dim
    in ℓ1 (‖v‖₁ <= √dim·‖v‖₂); in ℓ0 a move of any size may change every coordinate."""
    if relation.kind in ("add_or_remove_one", "replace_special"):
        return domain.radius(p)
    if relation.within is None or p == 0:
        return domain.diameter(p)
    if not hasattr(domain, "dim"):  # one-hot, bits: a bounded move is no tighter a bound
        return domain.diameter(p)
    moved = relation.within if p == 2 else relation.within * math.sqrt(domain.dim)
    return min(domain.diameter(p), moved)


@dataclass(frozen=True)
class Clipped:
    """What :func:`enforce` changed: ``count`` of ``total`` values (or rows) moved into the
    domain. ``statement()`` is the line a headline carries. ``columns``: with values enforced per
    named column, each column's count (name, count)."""

    field: str
    count: int
    total: int
    domain: str
    columns: tuple[tuple[str, int], ...] = ()

    def statement(self) -> str:
        text = f"{self.count:,} of {self.total:,} {self.field} values clipped to {self.domain}"
        if len(self.columns) > 1 and self.count:
            text += " (" + ", ".join(f"{c}: {k:,}" for c, k in self.columns if k) + ")"
        return text

    def to_dict(self) -> dict:
        """For metrics and the manifest: the counts, the domain and the statement."""
        return {
            "field": self.field,
            "count": self.count,
            "total": self.total,
            "domain": self.domain,
            **({"columns": dict(self.columns)} if self.columns else {}),
            "statement": self.statement(),
        }


OUT_OF_DOMAIN = ("clip", "refuse")


def enforce(
    values: np.ndarray,
    domain: Interval | Ball,
    policy: str,
    field: str,
    option: str,
    columns: list[str] | tuple[str, ...] | None = None,
    widen: str = "widen the domain",
) -> tuple[np.ndarray, Clipped]:
    """``values`` inside ``domain``: clipped (and counted) under ``policy="clip"``, or a
    DataError naming ``field`` under ``policy="refuse"`` if any lies outside. ``option`` is the
    user's option that chooses the policy (named in the error), ``widen`` the other fix (the
    option that sets the domain, say).

    ``columns``: the names of the columns of a 2-D ``values`` (an :class:`Interval` domain, which
    holds each value): values are counted per column, a refusal names the first column holding
    values outside as ``field.column`` (and every such column in its text), and the Clipped's
    domain is the interval one value lies in."""
    if policy not in OUT_OF_DOMAIN:
        raise ValueError(f"out-of-domain policy is one of {OUT_OF_DOMAIN}, got {policy!r}")
    if columns is not None:
        return _enforce_columns(values, domain, policy, field, option, tuple(columns), widen)
    clipped, outside = domain.clip(values)
    total = len(np.atleast_2d(values)) if isinstance(domain, Ball) else np.size(values)
    if np.isnan(clipped).any():
        raise DataError(field, "holds NaN (not a number): no domain holds it", "clean the data")
    if outside and policy == "refuse":
        raise DataError(
            field,
            f"{outside:,} of {total:,} values lie outside the declared domain {domain.describe()}",
            f"{widen}, or set {option}=clip to clip them (counted in the result)",
        )
    return clipped, Clipped(field, outside, int(total), domain.describe())


def _enforce_columns(
    values: np.ndarray,
    domain: Interval | Ball,
    policy: str,
    field: str,
    option: str,
    columns: tuple[str, ...],
    widen: str,
) -> tuple[np.ndarray, Clipped]:
    """:func:`enforce` over named columns (see there)."""
    if not isinstance(domain, Interval):
        raise ValueError("values are enforced per column in an Interval domain only")
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] != len(columns) or domain.dim not in (1, len(columns)):
        raise ValueError(
            f"{len(columns)} named columns need (rows, {len(columns)}) values in a domain of that "
            f"dim (or 1), got {values.shape} in {domain.describe()}"
        )
    each = Interval(domain.low, domain.high)  # what one value lies in
    if np.isnan(values).any():
        raise DataError(field, "holds NaN (not a number): no domain holds it", "clean the data")
    counts = np.count_nonzero((values < each.low) | (values > each.high), axis=0)
    per_column = tuple((c, int(k)) for c, k in zip(columns, counts, strict=True))
    outside = [(c, k) for c, k in per_column if k]
    n = values.shape[0]
    if outside and policy == "refuse":
        raise DataError(
            f"{field}.{outside[0][0]}",
            " and ".join(f"{k:,} of {n:,} values of column {c!r}" for c, k in outside)
            + f" lie outside the declared domain {each.describe()}",
            f"{widen}, or set {option}=clip to clip them (counted in the result)",
        )
    name = f"{field}.{columns[0]}" if len(columns) == 1 else field
    clipped = np.clip(values, each.low, each.high)
    return clipped, Clipped(name, int(counts.sum()), int(values.size), each.describe(), per_column)
