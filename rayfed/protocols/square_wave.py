"""Square Wave LDP distribution estimation with EM/EMS, and its baselines — chapter 3 of Zitao Li's
thesis / Li, Wang, Lopuhaä-Zwakenberg, Li & Škorić, SIGMOD 2020 (spec shared/specs/square-wave.md).

Users live in UserCohortActors as rows (user_id, value); each perturbs its own value in [0, 1]
(mapped from declared bounds) with per-user uniforms keyed by its id, so a report does not depend
on which cohort hosts the user. The aggregator (coordinator) receives one report per user and
reconstructs a d-bucket histogram of [0, 1].

``method``:

* ``sw-ems`` / ``sw-em`` — Square Wave (continuous, R-B; ``bucketize=br`` for the discrete one),
  EMS or EM on the report histogram;
* ``cfo`` — GRR or OLH (by the variance rule) on ``bins`` equal bins, Norm-Sub, spread uniformly;
* ``hh`` / ``hh-admm`` — a ``branching``-ary hierarchy, one layer per user, with Hay et al.'s
  constrained inference (range queries only) or the non-negative least-squares fit of HH-ADMM;
* ``haar-hrr`` — the Haar hierarchy with Hadamard randomized response (range queries only);
* ``sr`` / ``pm`` — stochastic rounding / the piecewise mechanism for the mean; with
  ``moments=both`` half the users report v and the other half (v - μ̃)² for the variance.

Privacy: every user sends one report, ε-LDP (replace-one on its value); users compose in parallel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.config import DataConfig, option
from rayfed.data import load_table, per_user, require_clean
from rayfed.errors import ConfigError, DataError
from rayfed.ldp import hierarchy, metrics, oracles
from rayfed.ldp import square_wave as sw
from rayfed.privacy import Budget, EpsilonDeltaDpEvent, check_budget, local_randomizer
from rayfed.protocols.base import Outcome, Plan, Protocol, reject_inapplicable
from rayfed.sizing import default_cohorts

MAX_EPSILON = 20.0
MAX_BUCKETS = 4096
METHODS = ("sw-ems", "sw-em", "cfo", "hh", "hh-admm", "haar-hrr", "sr", "pm")
RANGE_ONLY = ("hh", "haar-hrr")  # may be negative: range queries only (spec Table 3.2)


@dataclass(frozen=True)
class SquareWaveConfig:
    """Options of ``rayfed run square-wave``."""

    method: Literal[METHODS] = option("sw-ems", "estimator: " + ", ".join(METHODS))
    epsilon: float = option(
        1.0,
        f"ε of every user's one report (ε-LDP); at most {MAX_EPSILON:g}: beyond, SW's transition "
        "matrix loses its precision (p/q = e^ε)",
        above=0,
        at_most=MAX_EPSILON,
    )
    buckets: int = option(
        256,
        f"d, buckets of the estimated histogram of [0, 1] (at most {MAX_BUCKETS}: the aggregator "
        "holds dense d̃ x d matrices)",
        at_least=2,
        at_most=MAX_BUCKETS,
    )
    output_buckets: int | None = option(
        None,
        "SW: d̃, buckets of the report histogram (default d)",
        at_least=2,
        at_most=MAX_BUCKETS,
    )
    bucketize: Literal["rb", "br"] = option(
        "rb", "SW: rb = continuous SW, then bucketize (the paper's experiments); br = discrete SW"
    )
    tolerance: float | None = option(
        None,
        "EM/EMS: stop when the log-likelihood gains less (default 1e-3·e^ε EM, 1e-3 EMS)",
        at_least=0,
    )
    max_iterations: int = option(
        sw.MAX_ITERATIONS, "EM/EMS: at most this many iterations", at_least=1
    )
    bins: int = option(16, "cfo: number of bins c (must divide d)", at_least=2)
    branching: int = option(
        4, "hh, hh-admm: branching factor β (d must be a power of it)", at_least=2
    )
    moments: Literal["both", "mean"] = option(
        "both", "sr, pm: both = half the users for the mean, half for the variance; mean = all"
    )
    users: int = option(100_000, "synthetic data: number of users n", at_least=1, size=True)
    beta_a: float = option(5.0, "synthetic data: Beta(a, b) shape a", above=0)
    beta_b: float = option(2.0, "synthetic data: Beta(a, b) shape b", above=0)
    column: str | None = option(None, "data file: the numerical column to estimate")
    bounds: list[float] | None = option(
        None, "data file: declared [low, high] of the column (mapped to [0, 1])"
    )
    missing: Literal["error", "drop"] = option(
        "error", "data file: a missing value is an error, or its row is dropped"
    )
    cohorts: int | None = option(
        None, "user-cohort actors (default: this machine's CPUs)", at_least=1
    )
    range_queries: int = option(
        1000, "random range queries per width for the range-query error", at_least=1
    )
    evaluate: bool = option(True, "add the error metrics (from the raw values: not private)")
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, 0.0)
        _reject_unused_options(self)
        if self.method == "cfo" and (self.bins < 2 or self.buckets % self.bins):
            raise ConfigError(
                "bins", f"{self.bins} bins must be >= 2 and divide d = {self.buckets}", "16, 32, 64"
            )
        if self.method in ("hh", "hh-admm"):
            _require_power(self.buckets, self.branching, "buckets")
        if self.method == "haar-hrr":
            _require_power(self.buckets, 2, "buckets")
        if self.bounds is not None and (
            len(self.bounds) != 2 or not self.bounds[0] < self.bounds[1]
        ):
            raise ConfigError("bounds", f"must be [low, high] with low < high, got {self.bounds}")

    def em_tolerance(self) -> float:
        if self.tolerance is not None:
            return self.tolerance
        return 1e-3 * (math.exp(self.epsilon) if self.method == "sw-em" else 1.0)


#: options that only some methods read: giving one to another method is an error, not ignored
METHOD_OPTIONS = {
    "output_buckets": ("sw-ems", "sw-em"),
    "bucketize": ("sw-ems", "sw-em"),
    "tolerance": ("sw-ems", "sw-em"),
    "max_iterations": ("sw-ems", "sw-em"),
    "bins": ("cfo",),
    "branching": ("hh", "hh-admm"),
    "moments": ("sr", "pm"),
}


def _reject_unused_options(cfg: SquareWaveConfig) -> None:
    default = SquareWaveConfig()
    for name, methods in METHOD_OPTIONS.items():
        if cfg.method not in methods and getattr(cfg, name) != getattr(default, name):
            raise ConfigError(name, f"does not apply to method {cfg.method}", f"methods {methods}")
    if cfg.bucketize == "br" and cfg.output_buckets is not None:
        raise ConfigError("output_buckets", "discrete SW (bucketize=br) outputs d + 2b values")


def _require_power(d: int, base: int, name: str) -> None:
    h = round(math.log(d, base))
    if base**h != d or h < 1:
        raise ConfigError(name, f"{d} is not a power of {base}", f"e.g. {base**4}")


# --- step functions: users (in cohorts) -------------------------------------------------------------
def _users(ctx: StepContext, part: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, values in [0, 1]) of this cohort's users, or of its half ``part`` (mean/variance)."""
    ids = ctx.table.column("user_id").to_numpy().astype(np.uint64)
    values = ctx.table.column("value").to_numpy()
    if part is None:
        return ids, values
    in_mean = rng.keyed_uniform(ctx.seed, "sample", 0, ids, 1)[:, 0] < 0.5
    keep = in_mean if part == "mean" else ~in_mean
    return ids[keep], values[keep]


def _report(
    ctx: StepContext, name: str, randomizer, *args, eps: float, ids, width: int, round: int, **kw
) -> Message:
    """Every user's ε-LDP report through :func:`rayfed.privacy.local_randomizer`: ``randomizer``
    gets (``*args``, eps, u) with ``width`` uniforms per user from the cohort's noise source,
    keyed by user id; the message carries the mechanism's event."""
    scope = kw.pop("scope", None)
    payload, event = local_randomizer(
        ctx.noise, randomizer, *args, epsilon=eps, ids=ids, width=width, round=round, **kw
    )
    return Message(name, payload, dp_event=event, scope=scope)


def sw_step(
    ctx: StepContext, *, eps: float, b: float, discrete: bool, d: int, round: int
) -> Message:
    """Users: one Square Wave report each (a float in [-b, 1+b], or discrete SW's integer)."""
    ids, v = _users(ctx, None)
    if discrete:
        values = np.minimum((v * d).astype(np.int64), d - 1)
        return _report(
            ctx,
            "sw_reports",
            sw.perturb_discrete,
            values,
            eps=eps,
            ids=ids,
            width=2,
            round=round,
            d=d,
        )
    return _report(ctx, "sw_reports", sw.perturb, v, eps=eps, ids=ids, width=1, round=round, b=b)


def _frequency_report(values: np.ndarray, domain: int, hashes, *, eps: float, u) -> dict:
    """GRR over the domain, or OLH (``hashes`` given): the report ⟨H, y⟩ carries the user's hash
    (a, b), public randomness from the run seed."""
    if hashes is None:
        return {"report": oracles.grr_perturb(values, domain, eps, u)}
    return {"report": oracles.olh_perturb(values, hashes, eps, u), "hash": hashes}


def _olh_hashes(ctx: StepContext, ids: np.ndarray, domain: int, eps: float, round: int):
    if oracles.use_grr(domain, eps):
        return None
    return oracles.olh_params(rng.keyed_bits64(ctx.seed, "olh-hash", round, ids, 2))


def cfo_step(ctx: StepContext, *, eps: float, bins: int, round: int) -> Message:
    """Users: the bin of the value through GRR or OLH."""
    ids, v = _users(ctx, None)
    binned = np.minimum((v * bins).astype(np.int64), bins - 1)
    hashes = _olh_hashes(ctx, ids, bins, eps, round)
    return _report(
        ctx,
        "cfo_reports",
        _frequency_report,
        binned,
        bins,
        hashes,
        eps=eps,
        ids=ids,
        width=2,
        round=round,
    )


def _hh_randomizer(leaf, d: int, branching: int, hashes: list, *, eps: float, u) -> dict:
    """A uniformly chosen layer ℓ (u's third column) and the FO report of the leaf's ancestor
    there (GRR or OLH by the layer's size; ``hashes[ℓ - 1]`` the OLH parameters of its users)."""
    sizes = hierarchy.layer_sizes(d, branching)
    layer = np.minimum((u[:, 2] * len(sizes)).astype(np.int64), len(sizes) - 1) + 1
    node = hierarchy.ancestor(leaf, layer, branching)
    report = np.empty_like(node)
    olh_rows = np.zeros((node.size, 2), dtype=np.int64)
    for ell, size in enumerate(sizes, start=1):
        mine = layer == ell
        h = None if hashes[ell - 1] is None else hashes[ell - 1][mine]
        part = _frequency_report(node[mine], size, h, eps=eps, u=u[mine])
        report[mine] = part["report"]
        if h is not None:
            olh_rows[mine] = h
    olh = ~np.array([oracles.use_grr(size, eps) for size in sizes])[layer - 1]
    return {"layer": layer.astype(np.int8), "report": report, "hash": olh_rows[olh]}


def hh_step(ctx: StepContext, *, eps: float, d: int, branching: int, round: int) -> Message:
    """Users: a uniformly chosen layer ℓ and the FO report of the value's ancestor there."""
    ids, v = _users(ctx, None)
    leaf = np.minimum((v * d).astype(np.int64), d - 1)
    hashes = [
        _olh_hashes(ctx, ids, size, eps, round) for size in hierarchy.layer_sizes(d, branching)
    ]
    return _report(
        ctx,
        "hh_reports",
        _hh_randomizer,
        leaf,
        d,
        branching,
        hashes,
        eps=eps,
        ids=ids,
        width=3,
        round=round,
    )


def _haar_randomizer(leaf, d: int, *, eps: float, u) -> dict:
    """A uniformly chosen height (u's third column) and an HRR report of that level's signed
    coefficient."""
    heights = int(round_log2(d))
    height = np.minimum((u[:, 2] * heights).astype(np.int64), heights - 1) + 1
    node, sign = hierarchy.haar_signs(leaf, height)
    rows = np.empty_like(node)
    bits = np.empty(node.size, dtype=np.int8)
    for h in range(1, heights + 1):
        mine = height == h
        rows[mine], bits[mine] = oracles.hrr_perturb(node[mine], sign[mine], d >> h, eps, u[mine])
    return {"height": height.astype(np.int8), "row": rows, "bit": bits}


def haar_step(ctx: StepContext, *, eps: float, d: int, round: int) -> Message:
    """Users: a uniformly chosen height and an HRR report of that level's signed coefficient."""
    ids, v = _users(ctx, None)
    leaf = np.minimum((v * d).astype(np.int64), d - 1)
    return _report(
        ctx, "haar_reports", _haar_randomizer, leaf, d, eps=eps, ids=ids, width=3, round=round
    )


def round_log2(d: int) -> int:
    return int(round(math.log2(d)))


def moment_step(
    ctx: StepContext, *, mechanism: str, eps: float, part: str | None, mu: float, round: int
) -> Message:
    """Users (SR/PM): report v mapped to [-1, 1], or — the variance half — (v - μ̃)² mapped so."""
    ids, v = _users(ctx, part)
    x = 2 * v - 1 if part != "variance" else 2 * (v - mu) ** 2 - 1
    perturb = oracles.sr_perturb if mechanism == "sr" else oracles.pm_perturb
    scope = f"{ctx.name}/{part or 'mean'}"
    return _report(
        ctx, f"{mechanism}_reports", perturb, x, eps=eps, ids=ids, width=2, round=round, scope=scope
    )


# --- step functions: the aggregator ------------------------------------------------------------------
def _gather(reports: dict[str, Any], key: str | None = None) -> np.ndarray:
    """Every cohort's reports concatenated (in one fixed order for every field: the estimates are
    sums over users, so the order does not matter beyond aligning the fields)."""
    parts = [reports[c] if key is None else reports[c][key] for c in sorted(reports)]
    return np.concatenate(parts) if parts else np.zeros(0)


def _frequencies(report: np.ndarray, hashes: np.ndarray | None, domain: int, eps: float):
    """GRR or OLH frequency estimates of one group of users (OLH when hashes are given)."""
    n = max(1, report.size)
    if hashes is None:
        return oracles.grr_estimate(report, domain, eps, n)
    return oracles.olh_estimate(report, hashes, domain, eps, n)


def estimate_step(ctx: StepContext, reports: dict[str, Any], *, method: str, cfg: dict) -> dict:
    """Aggregator: the d-bucket estimate of the value distribution from every received report."""
    d, eps = cfg["buckets"], cfg["epsilon"]
    if method in ("sw-ems", "sw-em"):
        values = _gather(reports)
        if cfg["discrete"]:
            b, _, _ = sw.discrete_parameters(eps, d)
            counts = np.bincount(values + b, minlength=d + 2 * b).astype(np.float64)
            m = sw.discrete_transition_matrix(eps, d)
        else:
            counts = sw.histogram(values, cfg["b"], cfg["output_buckets"])
            m = sw.transition_matrix(eps, cfg["b"], d, cfg["output_buckets"])
        est, iterations = sw.expectation_maximisation(
            counts,
            m,
            smoothing=method == "sw-ems",
            tolerance=cfg["tolerance"],
            max_iterations=cfg["max_iterations"],
        )
        return {"estimate": est, "iterations": iterations}
    if method == "cfo":
        report = _gather(reports, "report")
        olh = not oracles.use_grr(cfg["bins"], eps)
        freq = oracles.norm_sub(
            _frequencies(report, _gather(reports, "hash") if olh else None, cfg["bins"], eps)
        )
        spread = d // cfg["bins"]
        return {"estimate": np.repeat(freq / spread, spread)}
    if method in ("hh", "hh-admm"):
        layer, report = _gather(reports, "layer"), _gather(reports, "report")
        sizes = hierarchy.layer_sizes(d, cfg["branching"])
        olh_layer = ~np.array([oracles.use_grr(size, eps) for size in sizes])
        hashes = np.zeros((layer.size, 2), dtype=np.int64)
        hashes[olh_layer[layer - 1]] = _gather(reports, "hash").reshape(-1, 2)
        layers = []
        for ell, size in enumerate(sizes, start=1):
            mine = layer == ell
            own = hashes[mine] if olh_layer[ell - 1] else None
            layers.append(_frequencies(report[mine], own, size, eps))
        if method == "hh":
            est = hierarchy.constrained_inference(layers, cfg["branching"])[0]
        else:
            est = hierarchy.admm_leaves(layers, cfg["branching"])
        return {"estimate": est}
    if method == "haar-hrr":
        height = _gather(reports, "height")
        rows, bits = _gather(reports, "row"), _gather(reports, "bit")
        coefficients = []
        for h in range(1, round_log2(d) + 1):
            mine = height == h
            coefficients.append(
                oracles.hrr_estimate(rows[mine], bits[mine], d >> h, eps, max(1, int(mine.sum())))
            )
        return {"estimate": hierarchy.haar_leaves(coefficients)}
    raise ValueError(f"unknown histogram method {method!r}")


def moment_estimate_step(ctx: StepContext, reports: dict[str, Any], *, part: str) -> dict:
    """Aggregator (SR/PM): the average of the unbiased reports, mapped back to [0, 1] units."""
    values = _gather(reports)
    mean = math.fsum(values) / values.size if values.size else 0.0
    if part == "variance":
        return {"variance": (mean + 1) / 2}
    return {"mean": (mean + 1) / 2}


# --- the protocol ----------------------------------------------------------------------------------
def synthetic_values(users: int, a: float, b: float, seed: int) -> np.ndarray:
    """Spec §4.2: n i.i.d. draws from Beta(a, b) (default Beta(5, 2))."""
    return rng.stream(seed, "synthetic", 0, "square-wave").beta(a, b, users)


def true_histogram(values: np.ndarray, d: int) -> np.ndarray:
    """Frequencies of d equal buckets of [0, 1]; a value of exactly 1 falls in the last bucket."""
    idx = np.minimum((values * d).astype(np.int64), d - 1)
    return np.bincount(idx, minlength=d) / values.size


def _load_values(cfg: SquareWaveConfig, seed: int) -> np.ndarray:
    if cfg.data.path is None:
        return synthetic_values(cfg.users, cfg.beta_a, cfg.beta_b, seed)
    if cfg.column is None or cfg.bounds is None:
        raise ConfigError(
            "column" if cfg.column is None else "bounds",
            "a data file needs the column to estimate and its declared bounds",
            "e.g. --set column=air_time --set bounds=[0,700]",
        )
    table = load_table(cfg.data.path, cfg.data.format)
    if cfg.column not in table.column_names:
        raise DataError("column", f"column {cfg.column!r} is not in the data", table.column_names)
    col = table.column(cfg.column)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise DataError(
            "column", f"column {cfg.column!r} is not numeric ({col.type})", "a numerical column"
        )
    if cfg.missing == "drop":
        col = pc.drop_null(col)
        values = col.to_numpy(zero_copy_only=False).astype(np.float64)
        values = values[np.isfinite(values)]
    else:
        require_clean(table.select([cfg.column]), [cfg.column], "column")
        values = col.to_numpy(zero_copy_only=False).astype(np.float64)
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
    return (values - lo) / (hi - lo)


class SquareWave(Protocol):
    name = "square-wave"
    summary = (
        "Square Wave LDP distribution estimation with EM/EMS and the CFO/hierarchy/SR/PM baselines"
    )
    Config = SquareWaveConfig
    examples = (
        {"users": 5000},
        {"users": 5000, "method": "cfo"},
        {"users": 5000, "method": "hh"},
        {"users": 5000, "method": "haar-hrr"},
        {"users": 5000, "method": "sr"},
    )

    def data_bytes(self, cfg: SquareWaveConfig) -> int:
        """Every user's value, its uniforms (up to 3) and its report, plus the aggregator's
        d̃ x d transition matrix."""
        users = 0 if cfg.data.path is not None else cfg.users
        d = cfg.buckets
        return users * 8 * 6 + (cfg.output_buckets or d) * d * 8 * 3

    def plan(self, cfg: SquareWaveConfig, seed: int) -> Plan:
        _reject_inapplicable(cfg)
        values = _load_values(cfg, seed)
        n = values.size
        n_cohorts = default_cohorts(n, cfg.cohorts)
        table = pa.table({"user_id": np.arange(n, dtype=np.int64), "value": values})
        cohorts = {name: (t, {}) for name, t in per_user(table, "user_id", n_cohorts).items()}
        evaluation = None
        if cfg.evaluate:
            evaluation = {
                "histogram": true_histogram(values, cfg.buckets),
                "mean": float(values.mean()),
                "variance": float(values.var()),
            }
        two_rounds = cfg.method in ("sr", "pm") and cfg.moments == "both"
        return Plan(
            budget=Budget(cfg.epsilon, 0.0),
            ledger=dict(
                accountant="pure",
                relation="replace_one",
                composition="parallel",
                statement="ε-LDP: every user sends one report computed from its own value alone; "
                "users (and the two halves of SR/PM's moments) compose in parallel",
            ),
            cohorts=cohorts,
            rounds=2 if two_rounds else 1,
            evaluation=evaluation,
            info={"users": n},
        )

    def drive(self, fed, cfg: SquareWaveConfig, plan: Plan) -> Outcome:
        if cfg.method in ("sr", "pm"):
            return self._drive_moments(fed, cfg, plan)
        eps, d = cfg.epsilon, cfg.buckets
        b = sw.band_half_width(eps)
        server = {
            "buckets": d,
            "epsilon": eps,
            "b": b,
            "output_buckets": cfg.output_buckets or d,
            "discrete": cfg.bucketize == "br",
            "tolerance": cfg.em_tolerance(),
            "max_iterations": cfg.max_iterations,
            "bins": cfg.bins,
            "branching": cfg.branching,
        }
        with fed.round(0):
            fed.charge(
                [
                    (c, f"{cfg.method} report per user (ε-LDP)", EpsilonDeltaDpEvent(eps, 0.0))
                    for c in fed.cohorts.names
                ]
            )
            if cfg.method in ("sw-ems", "sw-em"):
                reports = fed.cohorts.run(
                    sw_step,
                    eps=eps,
                    b=b,
                    discrete=server["discrete"],
                    d=d,
                    round=0,
                    phase="perturb",
                )
            elif cfg.method == "cfo":
                reports = fed.cohorts.run(
                    cfo_step, eps=eps, bins=cfg.bins, round=0, phase="perturb"
                )
            elif cfg.method in ("hh", "hh-admm"):
                reports = fed.cohorts.run(
                    hh_step, eps=eps, d=d, branching=cfg.branching, round=0, phase="perturb"
                )
            else:
                reports = fed.cohorts.run(haar_step, eps=eps, d=d, round=0, phase="perturb")
            out = fed.one(
                fed.coordinator.run(
                    estimate_step, reports, method=cfg.method, cfg=server, phase="estimate"
                )
            )
        self._notes(fed, cfg)
        return self._histogram_outcome(cfg, plan, out, b)

    def _drive_moments(self, fed, cfg: SquareWaveConfig, plan: Plan) -> Outcome:
        eps = cfg.epsilon
        parts = ["mean", "variance"] if cfg.moments == "both" else [None]
        results: dict[str, Any] = {}
        mu = 0.0
        for r, part in enumerate(parts):
            with fed.round(r):
                scope = [
                    (
                        f"{c}/{part or 'mean'}",
                        f"{cfg.method} report ({part or 'mean'}, ε-LDP)",
                        EpsilonDeltaDpEvent(eps, 0.0),
                    )
                    for c in fed.cohorts.names
                ]
                fed.charge(scope)
                reports = fed.cohorts.run(
                    moment_step,
                    mechanism=cfg.method,
                    eps=eps,
                    part=part,
                    mu=mu,
                    round=r,
                    phase=f"perturb-{part or 'mean'}",
                )
                out = fed.one(
                    fed.coordinator.run(
                        moment_estimate_step,
                        reports,
                        part=part or "mean",
                        phase=f"estimate-{part or 'mean'}",
                    )
                )
                results.update(out)
                if "mean" in out:
                    mu = min(1.0, max(0.0, out["mean"]))
        self._notes(fed, cfg)
        metrics_: dict[str, Any] = {
            "method": cfg.method,
            "users": plan.info["users"],
            "epsilon": eps,
            "mean": results["mean"],
        }
        if "variance" in results:
            metrics_["variance"] = results["variance"]
        headline = f"{cfg.method}: mean {results['mean']:.4f}"
        if plan.evaluation is not None:
            metrics_["mean_error"] = abs(results["mean"] - plan.evaluation["mean"])
            headline += f" (error {metrics_['mean_error']:.2e})"
            if "variance" in results:
                metrics_["variance_error"] = abs(results["variance"] - plan.evaluation["variance"])
        if "variance" in results:
            headline += f", variance {results['variance']:.4f}"
        table = pa.table(
            {
                "statistic": list(k for k in ("mean", "variance") if k in results),
                "estimate": [results[k] for k in ("mean", "variance") if k in results],
            }
        )
        return Outcome(tables={"moments": table}, metrics=metrics_, headline=headline)

    @staticmethod
    def _notes(fed, cfg: SquareWaveConfig) -> None:
        fed.note(
            "each simulated user's coins are its own (keyed by its id); in a real deployment the "
            "LDP guarantee assumes they stay on the user's device"
        )
        if cfg.evaluate:
            fed.note("the error metrics compare with the raw values: they are not private")
        if cfg.method in RANGE_ONLY:
            fed.note(
                f"{cfg.method}'s estimate can be negative: only its range-query errors are meaningful (spec Table 3.2)"
            )

    @staticmethod
    def _histogram_outcome(cfg: SquareWaveConfig, plan: Plan, out: dict, b: float) -> Outcome:
        d = cfg.buckets
        est = np.asarray(out["estimate"])
        columns: dict[str, Any] = {
            "bucket": np.arange(d),
            "lower": np.arange(d) / d,
            "upper": (np.arange(d) + 1) / d,
            "estimate": est,
        }
        result: dict[str, Any] = {
            "method": cfg.method,
            "users": plan.info["users"],
            "epsilon": cfg.epsilon,
            "buckets": d,
        }
        if cfg.method in ("sw-ems", "sw-em"):
            if cfg.bucketize == "br":  # discrete SW: b is an integer number of buckets
                result["b_buckets"] = sw.discrete_parameters(cfg.epsilon, d)[0]
            else:
                result["b"] = b
            result.update(iterations=out["iterations"], tolerance=cfg.em_tolerance())
        headline = f"{cfg.method}: {d}-bucket distribution of {plan.info['users']:,} users at ε={cfg.epsilon:g}"
        if plan.evaluation is not None:
            truth = plan.evaluation["histogram"]
            columns["true"] = truth
            # the same queries for every run and method (keyed by nothing), so errors compare
            starts = metrics.range_starts(
                rng.stream(0, "evaluation", 0, "range-queries"), cfg.range_queries
            )
            scores = metrics.all_metrics(truth, est, starts)
            if cfg.method in RANGE_ONLY:
                scores = {k: v for k, v in scores.items() if k.startswith("range_error")}
            result.update(scores)
            if "wasserstein" in scores:
                headline += f"; W1 {scores['wasserstein']:.2e}, KS {scores['ks']:.2e}"
            else:
                headline += f"; range error (α=0.1) {scores['range_error_0.1']:.2e}"
        return Outcome(tables={"histogram": pa.table(columns)}, metrics=result, headline=headline)


def _reject_inapplicable(cfg: SquareWaveConfig) -> None:
    """File options without a file (data.key included), synthetic options with one."""
    if cfg.data.columns is not None:
        raise ConfigError("data.columns", "square-wave estimates one column", "set column instead")
    if cfg.data.path is None and cfg.missing != "error":
        raise ConfigError("missing", "applies to a data file, but no data.path is given")
    reject_inapplicable(cfg, ["column", "bounds"], ["users", "beta_a", "beta_b"])
