"""The moment family of ``vfl-primitives``: ℓ1 (App. C), ℓp (Alg. 2: two rounds, or the
non-interactive variant of spec §2.5 in one) and ℓ2 (sketch-and-perturb, E.3) of the users'
summed values x_i = Σ_j x^(j)_i."""

from __future__ import annotations

import math

import numpy as np

from rayfed.actors.base import Message, StepContext
from rayfed.data.scaling import features_of
from rayfed.ldp.patterns import per_user_variance_constant, raw_counts
from rayfed.privacy import Measurement
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.vfl_primitives import report
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig
from rayfed.protocols.vfl_primitives.params import (
    L1Params,
    LpParams,
    SketchParams,
    pattern_weights,
)
from rayfed.protocols.vfl_primitives.patterns import count_patterns, pattern_bits_step
from rayfed.protocols.vfl_primitives.sketches import sketch_round


# --- servers ---------------------------------------------------------------------------------------
def l1_step(ctx: StepContext, *, releases: dict[str, Measurement]) -> Message:
    """Server: ‖x^(j)‖₁ + Laplace (Δ₁ = hi − lo user-level; 1 under the paper's neighbours)."""
    total = np.array([features_of(ctx.table, ctx.meta["columns"]).sum()])
    noisy, event = releases[ctx.name](ctx.noise, total)
    return Message("l1_norm", float(noisy[0]), dp_event=event)


def noisy_vector_step(ctx: StepContext, *, releases: dict[str, Measurement]) -> Message:
    """Server (Alg. 2 round 1): y^(j) = x^(j) + Laplace per entry at ε/2 (scale 2(hi − lo)/ε
    user-level; 2/ε under the paper's neighbours)."""
    x = features_of(ctx.table, ctx.meta["columns"])[:, 0]
    noisy, event = releases[ctx.name](ctx.noise, x)
    return Message("noisy_vector", noisy, dp_event=event)


# --- the coordinator -------------------------------------------------------------------------------
def heavy_step(ctx: StepContext, ys: dict[str, np.ndarray], **constants) -> Message:
    """CC (Alg. 2): :func:`heavy_coordinates` of the noisy vectors; sends L and M back."""
    return Message("heavy_coordinates", heavy_coordinates(ys, **constants), to="parties")


def heavy_coordinates(
    ys: dict[str, np.ndarray], *, tau: float, big_m: int, theorem_m: int, p: float
) -> dict:
    """y = Σ y^(j); L = {i : y_i >= τ}; the bound M (public: given, or from the theorem);
    Σ_{i∈L} y_i^p."""
    y = np.sum([ys[name] for name in sorted(ys)], axis=0)
    heavy = np.flatnonzero(y >= tau)
    return {
        "L": heavy,
        "M": big_m,
        "theorem_M": theorem_m,
        "heavy_part": float(np.sum(y[heavy] ** p)),
    }


def light_counts_step(
    ctx: StepContext,
    ys: dict[str, np.ndarray],
    bits: dict[str, dict],
    *,
    order: list[str],
    eps_prime: float,
    **heavy_args,
) -> dict:
    """CC (non-interactive Alg. 2, spec §2.5): the heavy set L from the noisy vectors, and the raw
    pattern counts of the servers' RR bits summed over the users outside L only — it sends
    nothing back. Returns the heavy-set facts with the counts under "counts"."""
    heavy = heavy_coordinates(ys, **heavy_args)
    light = np.ones(len(next(iter(ys.values()))), dtype=bool)
    light[heavy["L"]] = False
    unpacked = [
        np.unpackbits(bits[q]["bits"], axis=1, count=bits[q]["users"])[:, light] for q in order
    ]
    return {**heavy, "counts": raw_counts(unpacked, eps_prime, None, 1.0)}


def l2_step(
    ctx: StepContext, sketches: dict[str, np.ndarray], *, order: list[str], s: int
) -> float:
    """CC (E.3): ‖Σ_j o^(j)‖² / s, the paper's (biased) estimator."""
    total = np.sum([np.asarray(sketches[p]) for p in order], axis=0)
    return float((total**2).sum() / s)


# --- the rounds ------------------------------------------------------------------------------------
def drive(fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
    if cfg.task == "l1-moment":
        return _l1(fed, cfg, plan)
    if cfg.task == "lp-moment":
        return _lp(fed, cfg, plan)
    params: SketchParams = plan.params
    raw = sketch_round(fed, params, params.order, l2_step, s=params.s)
    fed.note(report.sigma_note(cfg, params))
    fed.note(report.L2_BIAS_NOTE)
    return report.l2_outcome(cfg, params, raw, plan.evaluation)


def _l1(fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
    params: L1Params = plan.params
    with fed.round(0):
        fed.charge([params.releases[p].charge(p) for p in params.order])
        norms = fed.get(fed.parties.run(l1_step, releases=params.releases, phase="l1"))
    return report.l1_outcome(cfg, params, math.fsum(norms.values()), plan.evaluation)


def _lp(fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
    """Round 0: noisy vectors, the CC's heavy set; round 1: pattern counting with L zeroed."""
    if cfg.interaction == "non-interactive":
        return _lp_non_interactive(fed, cfg, plan)
    params: LpParams = plan.params
    order, v, m = params.order, len(params.order), params.users
    with fed.round(0):
        fed.charge([params.vectors[p].charge(p) for p in order])
        ys = fed.parties.run(noisy_vector_step, releases=params.vectors, phase="noisy-vectors")
        heavy_reply = fed.coordinator.run(
            heavy_step, ys, **_heavy_constants(cfg, params), phase="heavy"
        )
        heavy = fed.get(heavy_reply.single())
    eps_prime = params.eps_prime
    with fed.round(1):
        counts = count_patterns(
            fed, order, params.counting, eps_prime, heavy_reply.single(), params.big_m + 1, 1
        )
    estimate = lp_estimate(cfg, heavy, counts, eps_prime, v, m)
    for note in report.lp_notes(cfg, params, estimate):
        fed.note(note)
    return report.lp_outcome(cfg, params, estimate, plan.evaluation)


def _heavy_constants(cfg: VflPrimitivesConfig, params: LpParams) -> dict:
    """The public constants the CC needs to pick the heavy users L, and the bound M."""
    return dict(tau=params.tau, big_m=params.big_m, theorem_m=params.theorem_m, p=cfg.p)


def _lp_non_interactive(fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
    """Spec §2.5's non-interactive variant (not in the paper): M depends only on public values
    (m, v, ε, α and the bounds, or the given bound), so every server sends its noisy vector (ε/2)
    and the pattern bits of its raw x^(j) (ε/2; values > M as all-zero) at once, and the CC drops
    the users of L from the counts itself. One round, nothing sent back; the same ε/2 + ε/2 per
    server (basic composition of two releases of the same data)."""
    params: LpParams = plan.params
    order, v, m = params.order, len(params.order), params.users
    eps_prime = params.eps_prime
    with fed.round(0):
        fed.charge(
            [params.vectors[p].charge(p) for p in order]
            + [params.counting[p].charge(p) for p in order]
        )
        ys = fed.parties.run(noisy_vector_step, releases=params.vectors, phase="noisy-vectors")
        bits = fed.parties.run(
            pattern_bits_step,
            None,
            releases=params.counting,
            size=params.big_m + 1,
            round=0,
            source="column",
            phase="pattern-counting",
        )
        reply = fed.coordinator.call(
            light_counts_step,
            ys,
            bits,
            order=order,
            eps_prime=eps_prime,
            **_heavy_constants(cfg, params),
            phase="counts",
        )
    counts = np.asarray(reply.pop("counts"))
    estimate = lp_estimate(cfg, reply, counts, eps_prime, v, m - len(reply["L"]))
    for note in report.lp_notes(cfg, params, estimate):
        fed.note(note)
    return report.lp_outcome(cfg, params, estimate, plan.evaluation)


def lp_estimate(
    cfg: VflPrimitivesConfig, heavy: dict, counts: np.ndarray, eps_prime: float, v: int, m: int
) -> report.LpEstimate:
    """Σ_{i∈L} y_i^p + Σ_ρ count_ρ (Σρ)^p over the patterns ρ in {0..M}^v, and the light part's
    predicted sd (``m``: the users the counts sum over)."""
    weights = pattern_weights(heavy["M"] + 1, v, cfg.p)
    used = np.maximum(counts, 0.0) if cfg.counts == "clipped" else counts
    light = float((used * weights).sum())
    c = per_user_variance_constant(eps_prime)
    return report.LpEstimate(
        heavy_part=heavy["heavy_part"],
        light=light,
        estimate=heavy["heavy_part"] + light,
        heavy_set=heavy["L"],
        big_m=heavy["M"],
        theorem_m=heavy["theorem_M"],
        predicted_sd=math.sqrt(m * c**v * float((weights**2).sum())),
        eps_prime=eps_prime,
    )
