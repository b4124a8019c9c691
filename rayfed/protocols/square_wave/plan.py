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
from rayfed.ldp import square_wave as sw
from rayfed.ldp.distribution import true_histogram
from rayfed.privacy import Budget, Neighbours, PrivacyDeclaration
from rayfed.protocols.base import Plan
from rayfed.protocols.square_wave.config import MOMENT_METHODS, SW_METHODS, SquareWaveConfig
from rayfed.protocols.square_wave.params import Estimator, Params
from rayfed.protocols.square_wave.report import STATEMENT
from rayfed.sizing import default_cohorts


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
    values, rows = _load_values(cfg, seed)
    n = values.size
    n_cohorts = default_cohorts(n, cfg.cohorts)
    table = pa.table({"user_id": np.arange(n, dtype=np.int64), "value": values})
    dealt = per_user(table, "user_id", n_cohorts)
    cohorts = {name: (t, {}) for name, t in dealt.items()}
    schedule = cfg.population.schedule(
        {"before_advertise": cfg.dropout} if cfg.dropout else {},
        {},
        {name: t.column("user_id").to_numpy() for name, t in dealt.items()},
        (np.arange(n), rows) if rows is not None else None,
    )
    evaluation = None
    if cfg.evaluate:
        evaluation = {
            "histogram": true_histogram(values, cfg.buckets),
            "mean": float(values.mean()),
            "variance": float(values.var()),
        }
    moments = cfg.method in MOMENT_METHODS
    parts = (("mean", "variance") if cfg.moments == "both" else (None,)) if moments else ()
    rounds = max(1, len(parts))
    return Plan(
        privacy=PrivacyDeclaration(
            budget=Budget(cfg.epsilon, 0.0),
            accountant="pure",
            relation=Neighbours("replace_one", "user's value"),
            composition="parallel",
            statement=STATEMENT,
        ),
        cohorts=cohorts,
        rounds=rounds,
        # a lost cohort is asked again in the same round: nothing of its users was released
        cohort_restarts=rounds if cfg.lost_users == "resume" else 0,
        evaluation=evaluation,
        params=Params(
            users=n,
            estimator=None if moments else _estimator(cfg),
            moment_parts=parts,
            schedule=schedule,
        ),
    )


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


def _load_values(cfg: SquareWaveConfig, seed: int) -> tuple[np.ndarray, pa.Table | None]:
    """The users' values in [0, 1], and a data file's rows aligned with them (the population's
    ``outage_column`` reads them)."""
    if cfg.data.path is None:
        return synthetic_values(cfg.users, cfg.beta_a, cfg.beta_b, seed), None
    if cfg.column is None or cfg.bounds is None:
        raise ConfigError(
            "column" if cfg.column is None else "bounds",
            "a data file needs the column to estimate and its declared bounds",
            "e.g. --set column=air_time --set bounds=[0,700]",
        )
    values, rows = _file_column(cfg)
    lo, hi = cfg.bounds
    outside = int(np.count_nonzero((values < lo) | (values > hi)))
    if outside:
        raise DataError(
            "bounds",
            f"{outside} value(s) of {cfg.column!r} lie outside the declared bounds [{lo:g}, {hi:g}]",
            "bounds that cover the domain (public knowledge, not the data's min/max)",
        )
    if values.size < 2:
        raise DataError("column", f"{values.size} usable value(s)", "2 or more users")
    return (values - lo) / (hi - lo), rows


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
