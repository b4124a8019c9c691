"""The step functions of ``square-wave``, by role: plain functions of (ctx, inputs) -> reply."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.dropout import DropoutSchedule
from rayfed.errors import BelowThreshold
from rayfed.ldp import distribution, hierarchy, oracles
from rayfed.privacy import Measurement
from rayfed.protocols.square_wave.params import Estimator


# --- cohorts (users) -------------------------------------------------------------------------------
def sw_step(
    ctx: StepContext,
    *,
    release: Measurement,
    b: float,
    discrete: bool,
    d: int,
    round: int,
    schedule: DropoutSchedule,
    ratio: float = 1.0,
) -> Message:
    """Users: one Square Wave report each (a float in [-b, 1+b], or discrete SW's integer), or
    a General Wave's of top/bottom ``ratio`` < 1 (trapezoid; 0 the triangle)."""
    ids, v = _users(ctx, None, schedule, round)
    if discrete:
        return _report(ctx, "sw_reports", release, distribution.bucket_index(v, d), ids, round, d=d)
    if ratio != 1.0:  # three uniforms per user (rayfed.ldp.wave.perturb)
        return _report(ctx, "sw_reports", release, v, ids, round, b=b, ratio=ratio)
    return _report(ctx, "sw_reports", release, v, ids, round, b=b)


def cfo_step(
    ctx: StepContext, *, release: Measurement, bins: int, round: int, schedule: DropoutSchedule
) -> Message:
    """Users: the bin of the value through GRR or OLH."""
    ids, v = _users(ctx, None, schedule, round)
    binned = distribution.bucket_index(v, bins)
    hashes = _olh_hashes(ctx, ids, bins, release.mechanism.epsilon, round)
    return _report(ctx, "cfo_reports", release, binned, ids, round, domain=bins, hashes=hashes)


def hh_step(
    ctx: StepContext,
    *,
    release: Measurement,
    d: int,
    branching: int,
    round: int,
    schedule: DropoutSchedule,
) -> Message:
    """Users: a uniformly chosen layer ℓ and the FO report of the value's ancestor there."""
    ids, v = _users(ctx, None, schedule, round)
    leaf = distribution.bucket_index(v, d)
    eps = release.mechanism.epsilon
    hashes = [
        _olh_hashes(ctx, ids, size, eps, round) for size in hierarchy.layer_sizes(d, branching)
    ]
    return _report(
        ctx, "hh_reports", release, leaf, ids, round, d=d, branching=branching, hashes=hashes
    )


def haar_step(
    ctx: StepContext, *, release: Measurement, d: int, round: int, schedule: DropoutSchedule
) -> Message:
    """Users: a uniformly chosen height and an HRR report of that level's signed coefficient."""
    ids, v = _users(ctx, None, schedule, round)
    leaf = distribution.bucket_index(v, d)
    return _report(ctx, "haar_reports", release, leaf, ids, round, d=d)


def moment_step(
    ctx: StepContext,
    *,
    release: Measurement,
    method: str,
    part: str | None,
    mu: float,
    round: int,
    schedule: DropoutSchedule,
) -> Message:
    """Users (SR/PM): report v mapped to [-1, 1], or — the variance half — (v - μ̃)² mapped so
    (μ̃ in [0, 1], so the value stays in [-1, 1])."""
    ids, v = _users(ctx, part, schedule, round)
    x = 2 * v - 1 if part != "variance" else 2 * (v - mu) ** 2 - 1
    scope = f"{ctx.name}/{part or 'mean'}"
    return _report(ctx, f"{method}_reports", release, x, ids, round, scope=scope)


def in_part(seed: int, ids: np.ndarray, part: str) -> np.ndarray:
    """Which of the users ``ids`` report in SR/PM's ``part`` ("mean" or "variance" half)."""
    in_mean = rng.keyed_uniform(seed, "sample", 0, np.asarray(ids, np.uint64), 1)[:, 0] < 0.5
    return in_mean if part == "mean" else ~in_mean


def _users(
    ctx: StepContext, part: str | None, schedule: DropoutSchedule, round: int
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, values in [0, 1]) of this cohort's users, or of its half ``part`` (mean/variance),
    whose report arrives in ``round``. Reports are keyed by user id, so who drops out does not
    change anyone else's report."""
    ids = ctx.table.column("user_id").to_numpy().astype(np.uint64)
    values = ctx.table.column("value").to_numpy()
    if part is not None:
        keep = in_part(ctx.seed, ids, part)
        ids, values = ids[keep], values[keep]
    arrived, _ = schedule.one_message(ctx.seed, round, ids.astype(np.int64))
    return ids[arrived], values[arrived]


def _report(
    ctx: StepContext,
    name: str,
    release: Measurement,
    values,
    ids,
    round: int,
    scope: str | None = None,
    **options,
) -> Message:
    """Every user's ε-LDP report through the plan's ``release`` (a
    :class:`~rayfed.privacy.LocalReport`): its randomizer gets the ``values``, ``options`` and
    its uniforms keyed by user id from the cohort's noise source; the message carries the
    release's event."""
    payload, event = release(ctx.noise, values, round=round, ids=ids, **options)
    return Message(name, payload, dp_event=event, scope=scope)


def _olh_hashes(ctx: StepContext, ids: np.ndarray, domain: int, eps: float, round: int):
    """OLH's public hash parameters of the users, keyed by id (None where GRR is used)."""
    if oracles.use_grr(domain, eps):
        return None
    return oracles.olh_params(rng.keyed_bits64(ctx.seed, "olh-hash", round, ids, 2))


# --- the coordinator (aggregator) ------------------------------------------------------------------
def estimate_step(ctx: StepContext, reports: dict[str, Any], *, estimator: Estimator) -> dict:
    """Aggregator: the d-bucket estimate of the value distribution from every received report."""
    method, d, eps = estimator.method, estimator.buckets, estimator.epsilon
    _require_reports(reports, "estimate", 0)
    if method in ("sw-ems", "sw-em"):
        est, iterations = distribution.sw_estimate(
            _gather(reports),
            eps=eps,
            d=d,
            b=estimator.b,
            output_buckets=estimator.output_buckets,
            discrete=estimator.discrete,
            ratio=estimator.wave_ratio,
            structured=estimator.structured,
            smoothing=method == "sw-ems",
            tolerance=estimator.tolerance,
            max_iterations=estimator.max_iterations,
        )
        return {"estimate": est, "iterations": iterations, "reports": _count(reports)}
    if method == "cfo":
        hashes = None if oracles.use_grr(estimator.bins, eps) else _gather(reports, "hash")
        report = _gather(reports, "report")
        return {
            "estimate": distribution.cfo_estimate(
                report, hashes, bins=estimator.bins, d=d, eps=eps
            ),
            "reports": _count(reports),
        }
    if method in ("hh", "hh-admm"):
        branching = estimator.branching
        layers = distribution.hh_layers(
            _gather(reports, "layer"),
            _gather(reports, "report"),
            _gather(reports, "hash"),
            d=d,
            branching=branching,
            eps=eps,
        )
        if method == "hh":
            est = hierarchy.constrained_inference(layers, branching)[0]
        else:
            est = hierarchy.admm_leaves(layers, branching)
        return {"estimate": est, "reports": _count(reports)}
    if method == "haar-hrr":
        height, rows, bits = (_gather(reports, k) for k in ("height", "row", "bit"))
        return {
            "estimate": distribution.haar_estimate(height, rows, bits, d=d, eps=eps),
            "reports": _count(reports),
        }
    raise ValueError(f"unknown histogram method {method!r}")


def moment_estimate_step(ctx: StepContext, reports: dict[str, Any], *, part: str) -> dict:
    """Aggregator (SR/PM): the average of the unbiased reports, mapped back to [0, 1] units."""
    _require_reports(reports, f"estimate-{part}", 1 if part == "variance" else 0)
    values = _gather(reports)
    mean = math.fsum(values) / values.size if values.size else 0.0
    return {part: (mean + 1) / 2, f"reports_{part}": values.size}


def _require_reports(reports: dict[str, Any], phase: str, round: int) -> None:
    """No report arrived (every user offline, late or lost): there is nothing to estimate from,
    and an estimator would return its prior (a uniform histogram, a mean of 1/2) as if it were
    one."""
    if not _count(reports):
        raise BelowThreshold(phase, 0, 1, round, what="reports", needed="minimum reports")


def _count(reports: dict[str, Any]) -> int:
    """How many users reported: one report each, an array per cohort or a dict of arrays whose
    first field has one entry per user."""
    return sum(len(next(iter(r.values())) if isinstance(r, dict) else r) for r in reports.values())


def _gather(reports: dict[str, Any], key: str | None = None) -> np.ndarray:
    """Every cohort's reports concatenated (in one fixed order for every field: the estimates are
    sums over users, so the order does not matter beyond aligning the fields)."""
    parts = [reports[c] if key is None else reports[c][key] for c in sorted(reports)]
    return np.concatenate(parts) if parts else np.zeros(0)
