"""Planning ``square-wave``: the users' values (synthetic Beta draws, or a file's column mapped
from its declared bounds to [0, 1]) dealt to cohorts, the budget and the aggregator's settings —
before any actor starts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayfed import rng
from rayfed.data import load_table, per_user, require_clean
from rayfed.errors import ConfigError, DataError
from rayfed.ldp import distribution, oracles, wave
from rayfed.ldp import square_wave as sw
from rayfed.ldp.distribution import true_histogram
from rayfed.privacy import (
    Budget,
    Clipped,
    DataDomain,
    Field,
    Interval,
    LocalReport,
    Measurement,
    Neighbours,
    PrivacyDeclaration,
    enforce,
)
from rayfed.protocols.base import Plan
from rayfed.protocols.square_wave.config import (
    MOMENT_METHODS,
    REPORT,
    SW_METHODS,
    SquareWaveConfig,
)
from rayfed.protocols.square_wave.params import Estimator, Evaluation, Params
from rayfed.protocols.square_wave.report import statement
from rayfed.sizing import cohorts_adjusted, default_cohorts

RELATION = Neighbours("replace_one", "user's value")
#: where a user's value lives in a cohort's table, and its domain: the sensitivity check moves
#: one user's value from one end of [0, 1] to the other
DATA = DataDomain((Field(("value",), Interval(0.0, 1.0)),), members="cohorts", key="user_id")


def data_bytes(cfg: SquareWaveConfig) -> int:
    """Every user's value, its uniforms (up to 3) and its report, plus the aggregator's
    d̃ x d matrices: SW's dense transition matrix, HH-ADMM's aggregation matrix (HH's too, for
    simplicity) — or O(d) vectors (SW's structured product, CFO, Haar's fast transform)."""
    users = 0 if cfg.data.path is not None else cfg.users
    d = cfg.buckets
    dense = (cfg.method in SW_METHODS and not cfg.structured()) or cfg.method in ("hh", "hh-admm")
    matrix = cfg.output_width() * d * 24 if dense else 64 * (d + cfg.output_width())
    return users * 8 * 6 + matrix


def plan(cfg: SquareWaveConfig, seed: int) -> Plan:
    values, rows, clipped = _load_values(cfg, seed)
    n = values.size
    n_cohorts = default_cohorts(n, cfg.cohorts)
    table = pa.table({"user_id": np.arange(n, dtype=np.int64), "value": values})
    dealt = per_user(table, "user_id", n_cohorts)
    cohorts = {name: (t, {}) for name, t in dealt.items()}
    moments = cfg.method in MOMENT_METHODS
    parts = (("mean", "variance") if cfg.moments == "both" else (None,)) if moments else ()
    rounds = max(1, len(parts))
    schedule = cfg.population.schedule(
        REPORT,
        {"report": cfg.dropout},
        {name: t.column("user_id").to_numpy() for name, t in dealt.items()},
        (np.arange(n), rows) if rows is not None else None,
        rounds,
    )
    evaluation = None
    if cfg.evaluate:
        evaluation = Evaluation(
            histogram=true_histogram(values, cfg.buckets),
            mean=float(values.mean()),
            variance=float(values.var()),
        )
    releases = _releases(cfg, parts)
    return Plan(
        privacy=PrivacyDeclaration(
            budget=Budget(cfg.epsilon, 0.0),
            accountant="pure",
            relation=RELATION,
            composition="parallel",
            statement=statement(cfg),
            measurements=tuple(releases.values()),
            data=DATA,
        ),
        cohorts=cohorts,
        rounds=rounds,
        inputs=schedule.notes,
        adjusted=cohorts_adjusted(n, cfg.cohorts, n_cohorts),
        # a lost cohort is asked again in the same round: nothing of its users was released
        cohort_restarts=rounds if cfg.lost_users == "resume" else 0,
        evaluation=evaluation,
        params=Params(
            users=n,
            estimator=None if moments else _estimator(cfg),
            moment_parts=parts,
            schedule=schedule,
            releases=releases,
            clipped=clipped,
        ),
    )


def _releases(cfg: SquareWaveConfig, parts: tuple[str | None, ...]) -> dict[str, Measurement]:
    """One ε-LDP report per user and kind of release: the histogram methods' one report
    (``"distribution"``), or SR/PM's report of each part (``"mean"``, ``"variance"``). Each user
    reports once per release from its own value alone, so replacing one user's value changes
    one report: Δ₀ = 1 user, the event (ε, 0)."""
    if parts:
        perturb = oracles.sr_perturb if cfg.method == "sr" else oracles.pm_perturb
        # SR/PM take v mapped to [-1, 1] (the variance half: (v - μ̃)² mapped so)
        return {
            (p or "mean"): Measurement(
                f"{cfg.method} report ({p or 'mean'}, ε-LDP)",
                LocalReport(cfg.epsilon, perturb, width=2),
                Interval(-1.0, 1.0),
                RELATION,
            )
            for p in parts
        }
    perturb, width = _randomizer(cfg)
    label = f"{cfg.method} report per user (ε-LDP)"
    return {
        "distribution": Measurement(
            label, LocalReport(cfg.epsilon, perturb, width), _report_domain(cfg), RELATION
        )
    }


def _report_domain(cfg: SquareWaveConfig) -> Interval:
    """What a user's randomizer takes: its value in [0, 1] (continuous SW, a General Wave), or
    the index of its value's bucket (discrete SW, the hierarchies: d buckets; CFO: its bins)."""
    if cfg.method in SW_METHODS and cfg.bucketize != "br":
        return Interval(0.0, 1.0)
    categories = cfg.bins if cfg.method == "cfo" else cfg.buckets
    return Interval(0.0, float(categories - 1))


def _randomizer(cfg: SquareWaveConfig):
    """(the histogram method's randomizer, uniforms it takes per user): SW's continuous or
    discrete report, a General Wave's, CFO's GRR/OLH on the value's bin, the hierarchy's or
    the Haar hierarchy's report of one layer."""
    if cfg.method in SW_METHODS:
        if cfg.bucketize == "br":
            return sw.perturb_discrete, 2
        return (sw.perturb, 1) if cfg.wave_ratio() == 1.0 else (wave.perturb, 3)
    return {
        "cfo": (distribution.frequency_report, 2),
        "hh": (distribution.hh_report, 3),
        "hh-admm": (distribution.hh_report, 3),
        "haar-hrr": (distribution.haar_report, 3),
    }[cfg.method]


def synthetic_values(users: int, a: float, b: float, seed: int) -> np.ndarray:
    """Spec §4.2: n i.i.d. draws from Beta(a, b) (default Beta(5, 2))."""
    return rng.stream(seed, "synthetic", 0, "square-wave").beta(a, b, users)


def _estimator(cfg: SquareWaveConfig) -> Estimator:
    d = cfg.buckets
    return Estimator(
        method=cfg.method,
        epsilon=cfg.epsilon,
        buckets=d,
        b=cfg.band if cfg.band is not None else sw.band_half_width(cfg.epsilon),
        output_buckets=cfg.output_buckets or d,
        discrete=cfg.bucketize == "br",
        tolerance=cfg.em_tolerance(),
        max_iterations=cfg.max_iterations,
        bins=cfg.bins,
        branching=cfg.branching,
        wave_ratio=cfg.wave_ratio(),
        structured=cfg.structured(),
    )


def _load_values(
    cfg: SquareWaveConfig, seed: int
) -> tuple[np.ndarray, pa.Table | None, Clipped | None]:
    """The users' values in [0, 1], a data file's rows aligned with them (the population's
    ``outage_column`` reads them), and what the declared bounds clipped (a file's values outside
    them are refused, or clipped and counted: ``out_of_domain``)."""
    if cfg.data.path is None:
        return synthetic_values(cfg.users, cfg.beta_a, cfg.beta_b, seed), None, None
    if cfg.column is None or cfg.bounds is None:
        raise ConfigError(
            "column" if cfg.column is None else "bounds",
            "a data file needs the column to estimate and its declared bounds",
            "e.g. --set column=air_time --set bounds=[0,700]",
        )
    if cfg.population.outage_column == cfg.column:
        raise ConfigError(
            "population.outage_column",
            f"the estimated column {cfg.column!r} would decide who reports: a user's silence "
            "would reveal its value without noise (the ε-LDP guarantee would not hold)",
            "another column (e.g. region), or population.outage_cohort",
        )
    values, rows = _file_column(cfg)
    lo, hi = cfg.bounds
    values, clipped = enforce(
        values, Interval(float(lo), float(hi)), cfg.out_of_domain, cfg.column, "out_of_domain"
    )
    if values.size < 2:
        raise DataError("column", f"{values.size} usable value(s)", "2 or more users")
    return (values - lo) / (hi - lo), rows, clipped


def _file_column(cfg: SquareWaveConfig) -> tuple[np.ndarray, pa.Table]:
    """The numerical column of the data file as floats, its missing values dropped or refused,
    and the rows kept."""
    table = load_table(cfg.data.path, cfg.data.format)
    if cfg.column not in table.column_names:
        raise DataError("column", f"column {cfg.column!r} is not in the data", table.column_names)
    col = table.column(cfg.column)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise DataError(
            "column", f"column {cfg.column!r} is not numeric ({col.type})", "a numerical column"
        )
    if cfg.missing == "drop":
        as_float = pc.cast(col, pa.float64(), safe=False)  # as numpy's astype: large ints round
        values = pc.fill_null(as_float, np.nan).to_numpy(zero_copy_only=False)
        keep = np.isfinite(values)
        return values[keep], table.filter(pa.array(keep))
    require_clean(table.select([cfg.column]), [cfg.column], "column")
    return col.to_numpy(zero_copy_only=False).astype(np.float64), table
