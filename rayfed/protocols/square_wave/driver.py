"""The rounds of ``square-wave``: every user's one report and the aggregator's histogram, or for
SR/PM one round per part (the mean half, then the variance half around the estimated mean)."""

from __future__ import annotations

from rayfed.privacy import EpsilonDeltaDpEvent
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.square_wave import report
from rayfed.protocols.square_wave.config import SquareWaveConfig
from rayfed.protocols.square_wave.params import Estimator
from rayfed.protocols.square_wave.steps import (
    cfo_step,
    estimate_step,
    haar_step,
    hh_step,
    moment_estimate_step,
    moment_step,
    sw_step,
)


def drive(fed, cfg: SquareWaveConfig, plan: Plan) -> Outcome:
    params = plan.params
    if params.estimator is None:
        return _drive_moments(fed, cfg, plan)
    estimator = params.estimator
    with fed.round(0):
        fed.charge(
            [
                (c, f"{cfg.method} report per user (ε-LDP)", EpsilonDeltaDpEvent(cfg.epsilon, 0.0))
                for c in fed.cohorts.names
            ]
        )
        reports = _perturb(fed, estimator)
        out = fed.coordinator.call(estimate_step, reports, estimator=estimator, phase="estimate")
    for note in report.notes(cfg):
        fed.note(note)
    return report.histogram_outcome(cfg, params, out, plan.evaluation)


def _perturb(fed, estimator: Estimator):
    """Every cohort's users report by the method's randomizer."""
    method, eps, d = estimator.method, estimator.epsilon, estimator.buckets
    if method in ("sw-ems", "sw-em"):
        return fed.cohorts.run(
            sw_step,
            eps=eps,
            b=estimator.b,
            discrete=estimator.discrete,
            d=d,
            round=0,
            phase="perturb",
        )
    if method == "cfo":
        return fed.cohorts.run(cfo_step, eps=eps, bins=estimator.bins, round=0, phase="perturb")
    if method in ("hh", "hh-admm"):
        return fed.cohorts.run(
            hh_step, eps=eps, d=d, branching=estimator.branching, round=0, phase="perturb"
        )
    return fed.cohorts.run(haar_step, eps=eps, d=d, round=0, phase="perturb")


def _drive_moments(fed, cfg: SquareWaveConfig, plan: Plan) -> Outcome:
    eps = cfg.epsilon
    results: dict[str, float] = {}
    mu = 0.0
    for r, part in enumerate(plan.params.moment_parts):
        name = part or "mean"
        with fed.round(r):
            fed.charge(
                [
                    (
                        f"{c}/{name}",
                        f"{cfg.method} report ({name}, ε-LDP)",
                        EpsilonDeltaDpEvent(eps, 0.0),
                    )
                    for c in fed.cohorts.names
                ]
            )
            reports = fed.cohorts.run(
                moment_step,
                mechanism=cfg.method,
                eps=eps,
                part=part,
                mu=mu,
                round=r,
                phase=f"perturb-{name}",
            )
            out = fed.coordinator.call(
                moment_estimate_step, reports, part=name, phase=f"estimate-{name}"
            )
            results.update(out)
            if "mean" in out:
                mu = min(1.0, max(0.0, out["mean"]))
    for note in report.notes(cfg):
        fed.note(note)
    return report.moments_outcome(cfg, plan.params, results, plan.evaluation)
