"""The rounds of ``square-wave``: every user's one report and the aggregator's histogram, or for
SR/PM one round per part (the mean half, then the variance half around the estimated mean)."""

from __future__ import annotations

import numpy as np

from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.square_wave import report
from rayfed.protocols.square_wave.config import SquareWaveConfig
from rayfed.protocols.square_wave.params import Estimator
from rayfed.protocols.square_wave.steps import (
    cfo_step,
    estimate_step,
    haar_step,
    hh_step,
    in_part,
    moment_estimate_step,
    moment_step,
    sw_step,
)


def drive(fed, cfg: SquareWaveConfig, plan: Plan) -> Outcome:
    params = plan.params
    if params.estimator is None:
        return _drive_moments(fed, cfg, plan)
    estimator = params.estimator
    lost: set[str] = set()
    release = params.releases["distribution"]
    with fed.round(0):
        fed.charge([release.charge(c) for c in fed.cohorts.names])
        reports = _perturb(fed, cfg, lost, estimator, release, params.schedule)
        out = fed.coordinator.call(estimate_step, reports, estimator=estimator, phase="estimate")
    for note in report.notes(cfg, lost):
        fed.note(note)
    outcome = report.histogram_outcome(cfg, params, out, plan.evaluation)
    everyone = np.arange(params.users)
    outcome.metrics.update(report.population(params, fed.seed, [out["reports"]], lost, [everyone]))
    return outcome


def _perturb(fed, cfg: SquareWaveConfig, lost: set[str], estimator: Estimator, release, schedule):
    """Every cohort's users report by the method's randomizer (the plan's ``release``)."""
    method, d = estimator.method, estimator.buckets
    common = dict(release=release, round=0, schedule=schedule, phase="perturb")
    if method in ("sw-ems", "sw-em"):
        step, kw = (
            sw_step,
            dict(b=estimator.b, ratio=estimator.wave_ratio, discrete=estimator.discrete, d=d),
        )
    elif method == "cfo":
        step, kw = cfo_step, dict(bins=estimator.bins)
    elif method in ("hh", "hh-admm"):
        step, kw = hh_step, dict(d=d, branching=estimator.branching)
    else:
        step, kw = haar_step, dict(d=d)
    return _reports(fed, cfg, lost, step, **common, **kw)


def _reports(fed, cfg: SquareWaveConfig, lost: set[str], step, **kwargs):
    """The cohorts' reports. A cohort that dies is restarted and asked again (lost_users=resume:
    its users' reports of the lost attempt never left it) or its users are dropouts from then
    on (lost_users=dropouts)."""
    on_failure = "retry" if cfg.lost_users == "resume" else "drop"
    replies = fed.cohorts.run(step, on_failure=on_failure, **kwargs)
    lost.update(replies.failed)
    return replies


def _drive_moments(fed, cfg: SquareWaveConfig, plan: Plan) -> Outcome:
    lost: set[str] = set()
    results: dict[str, float] = {}
    mu = 0.0
    for r, part in enumerate(plan.params.moment_parts):
        name = part or "mean"
        release = plan.params.releases[name]
        with fed.round(r):
            fed.charge([release.charge(f"{c}/{name}") for c in fed.cohorts.names])
            reports = _reports(
                fed,
                cfg,
                lost,
                moment_step,
                release=release,
                method=cfg.method,
                part=part,
                mu=mu,
                round=r,
                schedule=plan.params.schedule,
                phase=f"perturb-{name}",
            )
            out = fed.coordinator.call(
                moment_estimate_step, reports, part=name, phase=f"estimate-{name}"
            )
            results.update(out)
            fed.record(reports=int(out[f"reports_{name}"]))
            if "mean" in out:
                mu = min(1.0, max(0.0, out["mean"]))
    for note in report.notes(cfg, lost):
        fed.note(note)
    outcome = report.moments_outcome(cfg, plan.params, results, plan.evaluation)
    parts = plan.params.moment_parts
    counts = [results[f"reports_{part or 'mean'}"] for part in parts]
    everyone = np.arange(plan.params.users)
    asked = [everyone if p is None else everyone[in_part(fed.seed, everyone, p)] for p in parts]
    outcome.metrics.update(report.population(plan.params, fed.seed, counts, lost, asked))
    return outcome
