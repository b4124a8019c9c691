"""The round of ``pattern-count``: charge, every party's randomized bits, the coordinator's
estimate."""

from __future__ import annotations

from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.pattern_count import report
from rayfed.protocols.pattern_count.config import PatternCountConfig
from rayfed.protocols.pattern_count.steps import estimate_step, randomize_step


def drive(fed, cfg: PatternCountConfig, plan: Plan) -> Outcome:
    params = plan.params
    with fed.round(0):
        fed.charge([params.releases[p].charge(p) for p in params.order])
        bits = fed.parties.run(
            randomize_step,
            releases=params.releases,
            sample_rate=cfg.sample_rate,
            round=0,
            phase="randomize",
        )
        raw = fed.coordinator.call(
            estimate_step,
            bits,
            order=params.order,
            eps_prime=params.eps_prime,
            patterns=params.patterns,
            sample_rate=cfg.sample_rate,
            phase="estimate",
        )
    for note in report.notes(cfg, params, evaluated=plan.evaluation is not None):
        fed.note(note)
    return report.outcome(cfg, params, raw, plan.evaluation)
