"""What a ``square-wave`` run reports: the histogram (or moments) table, metrics, headline and
privacy notes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.ldp import metrics
from rayfed.ldp import square_wave as sw
from rayfed.protocols.base import Outcome
from rayfed.protocols.square_wave.config import RANGE_ONLY, SW_METHODS, SquareWaveConfig
from rayfed.protocols.square_wave.params import Evaluation, Params

STATEMENT = (
    "ε-LDP: every user sends one report computed from its own value alone; "
    "users (and the two halves of SR/PM's moments) compose in parallel"
)


def statement(cfg: SquareWaveConfig) -> str:
    """The privacy statement: ε-LDP per user, and what who-reports reveals. Dropouts, stragglers
    and outages by cohort or id do not depend on anyone's data; an outage by a data column
    (``population.outage_column``, never the estimated column: plan refuses that) reveals
    through a user's silence whether its row holds ``outage_value`` there — a column the
    relation does not protect."""
    column = cfg.population.outage_column
    if column is None:
        return STATEMENT
    return (
        f"{STATEMENT}; who reports is decided by the data column {column!r} "
        f"(population.outage_column): a user's missing report reveals, without noise, whether "
        f"its {column!r} is {cfg.population.outage_value!r} — that column is not protected "
        "(the relation covers the estimated value only)"
    )


def notes(cfg: SquareWaveConfig, lost: set[str] = frozenset()) -> list[str]:
    out = [
        "each simulated user's coins are its own (keyed by its id); in a real deployment the "
        "LDP guarantee assumes they stay on the user's device"
    ]
    if cfg.evaluate:
        out.append("the error metrics compare with the raw values: they are not private")
    if lost:
        how = (
            "lost for good (lost_users=dropouts)"
            if cfg.lost_users == "dropouts"
            else "did not report (missed the deadline, or died again after a restart)"
        )
        out.append(
            f"cohort(s) {', '.join(sorted(lost))} {how}: their users' reports are missing from "
            "the estimate, which describes the users who reported"
        )
    if cfg.method in RANGE_ONLY:
        out.append(
            f"{cfg.method}'s estimate can be negative: only its range-query errors are meaningful (spec Table 3.2)"
        )
    return out


def histogram_outcome(
    cfg: SquareWaveConfig, params: Params, out: dict, evaluation: Evaluation | None
) -> Outcome:
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
        "users": params.users,
        "epsilon": cfg.epsilon,
        "buckets": d,
    }
    if cfg.method in SW_METHODS:
        if cfg.bucketize == "br":  # discrete SW: b is an integer number of buckets
            result["b_buckets"] = sw.discrete_parameters(cfg.epsilon, d)[0]
        else:
            result["b"] = params.estimator.b
            if cfg.wave != "square":
                result["wave"] = cfg.wave
                result["wave_ratio"] = params.estimator.wave_ratio
        result.update(iterations=out["iterations"], tolerance=params.estimator.tolerance)
    method = cfg.method if "wave" not in result else f"{cfg.method} ({cfg.wave} wave)"
    headline = (
        f"{method}: {d}-bucket distribution of {_who(params.users, int(out['reports']))} "
        f"at ε={cfg.epsilon:g}"
    )
    result.update(_clipped(params))
    if evaluation is not None:
        truth = evaluation.histogram
        columns["true"] = truth
        scores = _scores(cfg, truth, est)
        result.update(scores)
        if "wasserstein" in scores:
            headline += f"; W1 {scores['wasserstein']:.2e}, KS {scores['ks']:.2e}"
        else:
            headline += f"; range error (α=0.1) {scores['range_error_0.1']:.2e}"
    headline += _clip_note(params)
    return Outcome(tables={"histogram": pa.table(columns)}, metrics=result, headline=headline)


def _who(users: int, reports: int) -> str:
    """Whose values an estimate describes: every user's, or the reports that arrived of the users
    asked (dropouts, stragglers and lost cohorts send none)."""
    if reports == users:
        return f"{users:,} users"
    return f"the {reports:,} reports that arrived of {users:,} users asked"


def _clipped(params: Params) -> dict[str, int]:
    """A data file's values clipped to its declared bounds (metrics; 0 when none was, or the
    values were refused instead)."""
    return {} if params.clipped is None else {"clipped": params.clipped.count}


def _clip_note(params: Params) -> str:
    """The headline's "k of n values clipped to [a, b]" when a value was clipped."""
    c = params.clipped
    return f"; {c.statement()}" if c is not None and c.count else ""


def _scores(cfg: SquareWaveConfig, truth: np.ndarray, est: np.ndarray) -> dict[str, float]:
    """The error metrics against the true histogram (range-query errors only where the estimate
    may be negative)."""
    # the same queries for every run and method (keyed by nothing), so errors compare
    starts = metrics.range_starts(
        rng.stream(0, "evaluation", 0, "range-queries"), cfg.range_queries
    )
    scores = metrics.all_metrics(truth, est, starts)
    if cfg.method in RANGE_ONLY:
        scores = {k: v for k, v in scores.items() if k.startswith("range_error")}
    return scores


def population(
    params: Params, seed: int, reports: list[int], lost: set[str], asked: list[np.ndarray]
) -> dict[str, Any]:
    """Who reported: the reports per round (counted by the aggregator), the share of users whose
    report did not arrive (dropouts, stragglers, lost cohorts: every user reports at most once,
    the two halves of SR/PM being disjoint), and each round's simulated time over the users
    ``asked`` that round (a lost cohort keeps the server waiting until the deadline)."""
    clock = [params.schedule.one_message(seed, r, ids)[1] for r, ids in enumerate(asked)]
    stragglers = params.schedule.stragglers
    if lost and stragglers is not None:
        clock = [stragglers.deadline_s] * len(clock)
    return {
        "reports": reports,
        "dropout": 1 - sum(reports) / params.users,
        "simulated_round_seconds": clock,
        "lost_cohorts": sorted(lost),
    }


def moments_outcome(
    cfg: SquareWaveConfig,
    params: Params,
    results: dict[str, float],
    evaluation: Evaluation | None,
) -> Outcome:
    metrics_: dict[str, Any] = {
        "method": cfg.method,
        "users": params.users,
        "epsilon": cfg.epsilon,
        "mean": results["mean"],
    }
    if "variance" in results:
        metrics_["variance"] = results["variance"]
    reports = sum(int(v) for k, v in results.items() if k.startswith("reports_"))
    headline = f"{cfg.method}: mean {results['mean']:.4f}"
    if evaluation is not None:
        metrics_["mean_error"] = abs(results["mean"] - evaluation.mean)
        headline += f" (error {metrics_['mean_error']:.2e})"
        if "variance" in results:
            metrics_["variance_error"] = abs(results["variance"] - evaluation.variance)
    if "variance" in results:
        headline += f", variance {results['variance']:.4f}"
    if reports != params.users:
        headline += f" from {_who(params.users, reports)}"
    metrics_.update(_clipped(params))
    headline += _clip_note(params)
    table = pa.table(
        {
            "statistic": list(k for k in ("mean", "variance") if k in results),
            "estimate": [results[k] for k in ("mean", "variance") if k in results],
        }
    )
    return Outcome(tables={"moments": table}, metrics=metrics_, headline=headline)
