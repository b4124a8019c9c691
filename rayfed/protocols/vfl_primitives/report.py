"""What a ``vfl-primitives`` run reports, per task: the result table, metrics, headline and the
privacy notes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.clustering.kmedian import cost
from rayfed.ldp.patterns import exact_loss, one_hot, predicted_variance
from rayfed.protocols.base import Outcome
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig
from rayfed.protocols.vfl_primitives.params import (
    L1Params,
    LpParams,
    Params,
    PerturbationParams,
    SketchParams,
    Truth,
    pattern_weights,
)

L2_BIAS_NOTE = (
    "the paper's estimator ‖Σo‖²/s is biased by +Σσ_j²; `estimate` removes it (not in the paper)"
)


def outcome(
    cfg: VflPrimitivesConfig,
    params: Params,
    tables: dict[str, pa.Table],
    metrics: dict[str, Any],
    headline: str,
) -> Outcome:
    """The outcome, its headline tagged with what the guarantee protects — user-level on the
    declared domain, or the paper's weaker neighbours, named — and what the plan clipped into
    the declared bounds (in the headline where anything was, and always in the metrics)."""
    metrics["neighbours"] = "user" if cfg.user_level() else "paper"
    if params.clipped:
        metrics["clipped"] = [c.to_dict() for c in params.clipped]
    clips = "".join(f"; {c.statement()}" for c in params.clipped if c.count)
    mark = f"({params.protects})" if cfg.user_level() else f"[{params.protects}]"
    return Outcome(tables=tables, metrics=metrics, headline=f"{headline} {mark}{clips}")


# --- moments ---------------------------------------------------------------------------------------
def l1_outcome(
    cfg: VflPrimitivesConfig, params: L1Params, estimate: float, truth: Truth | None
) -> Outcome:
    """The estimate, and its predicted sd √(2v)·Δ₁/ε (v Laplace draws of scale Δ₁/ε)."""
    sens = params.releases[params.order[0]].sensitivity
    metrics: dict[str, Any] = {
        "task": "l1-moment",
        "estimate": estimate,
        "sensitivity": sens,
        "predicted_sd": math.sqrt(2 * len(params.order)) * sens / cfg.epsilon,
    }
    if truth is not None:
        metrics["true"] = float(truth.a.sum())
        metrics["error"] = estimate - metrics["true"]
        if truth.unclipped is not None:  # the raw data's moment, beside the clipped one
            metrics["true_unclipped"] = float(truth.unclipped.sum())
    return outcome(
        cfg,
        params,
        {"result": pa.table({"estimate": [estimate]})},
        metrics,
        f"ℓ1 moment ≈ {estimate:,.1f}",
    )


@dataclass(frozen=True)
class LpEstimate:
    """Alg. 2's answer: the heavy part from the CC's set L, the light part from the pattern counts
    (M the pattern bound used, theorem_m the theorem's), and the light part's predicted sd."""

    heavy_part: float
    light: float
    estimate: float
    heavy_set: np.ndarray
    big_m: int
    theorem_m: int
    predicted_sd: float
    eps_prime: float


def lp_notes(cfg: VflPrimitivesConfig, params: LpParams, est: LpEstimate) -> list[str]:
    interaction = (
        "Alg. 2 is interactive: the CC sends the heavy set L back before round 2 (the paper calls "
        "its algorithms non-interactive); privacy holds by adaptive composition (ε/2 + ε/2)"
        if cfg.interaction == "interactive"
        else "non-interactive variant of Alg. 2 (spec §2.5; a deviation from the paper): M is "
        "public, each server sends its noisy vector (ε/2) and the pattern bits of its raw values "
        "(ε/2; values > M as all-zero) in one round, and the CC leaves the users of L out of the "
        "counts; nothing is sent back; ε/2 + ε/2 by basic composition"
    )
    where = "given" if cfg.bound else ("the theorem" if est.big_m == est.theorem_m else "hi")
    notes = [
        interaction,
        f"pattern bound M = {est.big_m} ({where}: theorem's M = "
        f"{est.theorem_m}); predicted sd of the light part {est.predicted_sd:.3g}",
        "Thm C.2's explicit bound omits a factor of about the number of patterns (spec §2.5)",
    ]
    if cfg.user_level():
        notes.append(
            f"user-level: the Laplace noise is {params.unit:g} times the paper's (Δ₁ = hi − lo per "
            f"entry), and so are B and τ = {params.tau:.4g}; every value is at most hi, so M = "
            f"min(theorem's M, hi) counts them all and the heavy set L is empty unless the noise "
            f"alone passes τ ({len(est.heavy_set)} users in L here): the estimate is the pattern "
            "counting's"
        )
    return notes


def lp_outcome(
    cfg: VflPrimitivesConfig, params: LpParams, est: LpEstimate, truth: Truth | None
) -> Outcome:
    metrics: dict[str, Any] = {
        "task": "lp-moment",
        "p": cfg.p,
        "estimate": est.estimate,
        "heavy_part": est.heavy_part,
        "light_part": est.light,
        "heavy_coordinates": int(len(est.heavy_set)),
        "M": est.big_m,
        "theorem_M": est.theorem_m,
        "light_part_predicted_sd": est.predicted_sd,
        "exact_epsilon_pattern_counting": exact_loss(est.eps_prime),
        "laplace_scale": params.unit / (cfg.epsilon / 2),
    }
    if truth is not None:
        x = truth.a.sum(axis=1)
        true = float((x**cfg.p).sum())
        if truth.unclipped is not None:
            metrics["true_unclipped"] = float((truth.unclipped.sum(axis=1) ** cfg.p).sum())
        light = np.delete(x, est.heavy_set)
        light_true = float(light @ light ** (cfg.p - 1)) if cfg.p != 1 else float(light.sum())
        metrics.update(
            true=true, relative_error=_relative(est.estimate, true), light_part_true=light_true
        )
        sd = _light_part_sd(cfg, est, truth.a)
        if sd is not None:
            metrics["light_part_sd"] = sd
    return outcome(
        cfg,
        params,
        {"result": pa.table({"estimate": [est.estimate]})},
        metrics,
        f"ℓ{cfg.p:g} moment ≈ {est.estimate:.4g}",
    )


MAX_EXACT_SD_PATTERNS = 20_000  # (M+1)^v above this: only the approximate predicted sd


def _light_part_sd(cfg: VflPrimitivesConfig, est: LpEstimate, a: np.ndarray) -> float | None:
    """The light part's exact sd from the raw data (not private; spec §2.1's variance law, the
    patterns being uncorrelated): √(Σ_ρ (Σρ)^{2p} Σ_i [Π_j (c + a_ijρ) - Π_j a_ijρ]) over the
    users the counts sum over — every user with L's values zeroed (interactive), or the users
    outside L (non-interactive); values > M encode as all-zero. None for a large pattern space."""
    size, v = est.big_m + 1, a.shape[1]
    if size**v > MAX_EXACT_SD_PATTERNS:
        return None
    values = a.astype(np.int64)
    if cfg.interaction == "interactive":
        values[est.heavy_set] = 0
    else:
        values = np.delete(values, est.heavy_set, axis=0)
    onehots = [one_hot(np.where(values[:, j] < size, values[:, j], -1), size) for j in range(v)]
    var = predicted_variance(onehots, est.eps_prime, None, 1.0)
    return float(np.sqrt((pattern_weights(size, v, cfg.p) ** 2 * var).sum()))


def l2_outcome(
    cfg: VflPrimitivesConfig, params: SketchParams, raw: float, truth: Truth | None
) -> Outcome:
    metrics = _sketch_metrics(cfg, params)
    bias = len(params.order) * params.sigma**2
    debiased = raw - bias
    metrics.update(raw=raw, estimate=debiased, bias_removed=bias)
    if truth is not None:
        true = float((truth.a.sum(axis=1) ** 2).sum())
        metrics.update(
            true=true,
            relative_error=_relative(debiased, true),
            raw_relative_error=_relative(raw, true),
        )
        if truth.unclipped is not None:
            metrics["true_unclipped"] = float((truth.unclipped.sum(axis=1) ** 2).sum())
    return outcome(
        cfg,
        params,
        {"result": pa.table({"raw": [raw], "estimate": [debiased]})},
        metrics,
        f"ℓ2 moment ≈ {debiased:.4g} (raw {raw:.4g})",
    )


# --- clustering ------------------------------------------------------------------------------------
CENTRAL_NOTE = (
    "baseline=central (spec §4.4): a TRUSTED CURATOR — the servers send their local labels in the "
    "clear to the CC, which releases a Laplace histogram of them (ε/2, charged run-wide). The "
    "guarantee above is central DP of the CC's output only; the servers' messages are not private, "
    "so this is NOT DP in VFL. A baseline, to show the √m price of VFL"
)


@dataclass(frozen=True)
class Communication:
    """What a server sends in the pattern counting of the labels: users of the public sample,
    and their randomized-response bits (k per user)."""

    users_sent: int
    bits_per_server: int


@dataclass(frozen=True)
class ClusteringTruth:
    """Non-private answers for a clustering run (from the raw data A, outside the protocol): the
    clustering of A, the true counts of the grid's cells and the servers' one-hot labels, the
    grid clustered with the true counts, and the non-private VFL pipeline's centers."""

    a: np.ndarray
    reference: np.ndarray
    true_counts: np.ndarray
    onehots: list[np.ndarray]
    exact_counts: np.ndarray
    nonprivate_vfl: np.ndarray


def clustering_outcome(
    cfg: VflPrimitivesConfig,
    params: Params,
    grid: np.ndarray,
    final: np.ndarray,
    raw: np.ndarray,
    eps_prime: float | None,
    sent: Communication,
    truth: ClusteringTruth | None,
) -> Outcome:
    """``raw``: the grid weights before max(0, ·); ``eps_prime``: the RR bias (None: the central
    baseline, which runs no randomized response)."""
    p = 2.0 if cfg.task == "kmeans" else 1.0
    metrics: dict[str, Any] = {"task": cfg.task, "k": cfg.k, "grid_cells": int(grid.shape[0])}
    if cfg.baseline == "central":
        metrics.update(baseline="central", trusted_curator=True)
    else:
        metrics.update(
            exact_epsilon_pattern_counting=exact_loss(eps_prime),
            sample_rate=cfg.sample_rate,
            users_sent=sent.users_sent,
            pattern_bits_per_server=sent.bits_per_server,
        )
    headline = f"{cfg.task}: {cfg.k} centers from a {grid.shape[0]}-cell product grid"
    # clustering.cluster's fallback: with no positive weight left, every cell weighs the same
    metrics["unweighted_grid"] = not bool((raw > 0).any())
    if metrics["unweighted_grid"]:
        headline += (
            "; no grid cell kept a positive weight after the noise, so the grid was clustered "
            "unweighted (post-processing)"
        )
    if truth is not None:
        a = truth.a
        base = cost(a, truth.reference, p)
        metrics.update(
            cost=cost(a, final, p),
            cost_nonprivate=base,
            cost_ratio=_ratio(cost(a, final, p), base),
            cost_product_grid=cost(a, grid, p),
            cost_ratio_exact_counts=_ratio(cost(a, truth.exact_counts, p), base),
            cost_ratio_nonprivate_vfl=_ratio(cost(a, truth.nonprivate_vfl, p), base),
            weights_rmse=float(np.sqrt(np.mean((raw - truth.true_counts) ** 2))),
            weights_predicted_sd=_weights_sd(cfg, truth, eps_prime),
        )
        headline += f"; cost / non-private {metrics['cost_ratio']:.3f}"
    table = pa.table({f"c{i}": final[:, i] for i in range(final.shape[1])})
    return outcome(cfg, params, {"centers": table}, metrics, headline)


def _weights_sd(cfg: VflPrimitivesConfig, truth: ClusteringTruth, eps_prime: float | None) -> float:
    """Root mean (over cells) of the predicted variance of a raw grid weight: pattern counting's
    Σ_i [(1/p) Π_j (c + a_ij) - Π_j a_ij] (spec §2.2), or the central Laplace's 2·(2/(ε/2))²."""
    if eps_prime is None:
        return math.sqrt(2) * 2 / (cfg.epsilon / 2)
    var = predicted_variance(truth.onehots, eps_prime, None, cfg.sample_rate)
    return float(np.sqrt(np.mean(var)))


# --- sketches --------------------------------------------------------------------------------------
def _calibration(cfg: VflPrimitivesConfig) -> str:
    """How z was found: against the tightest accountant (user-level), or RDP (the paper's mode,
    as before)."""
    if cfg.user_level():
        return "dp-accounting calibration against the tightest accountant (PLD and RDP)"
    return "dp-accounting RDP calibration"


def sigma_note(cfg: VflPrimitivesConfig, params: SketchParams) -> str:
    classical = params.sensitivity * math.sqrt(2 * math.log(1.25 / cfg.delta)) / cfg.epsilon
    text = (
        f"σ = {params.sigma:.4g} per entry, Δ₂ = {params.sensitivity:.4g} ({_calibration(cfg)} "
        f"for one release at (ε, δ)); the paper's classical formula gives {classical:.4g} "
        "(valid for ε < 1)"
    )
    if params.label_sigma is not None and params.label_sigma != params.sigma:
        text += f"; the label server's σ = {params.label_sigma:.4g}"
    return text


def ridge_note(params: SketchParams) -> str:
    return (
        "the least squares on the noisy sketch is a sketched ridge regression with "
        f"λ = σ² = {params.sigma**2:.4g} (spec §2.9)"
    )


def _sketch_metrics(cfg: VflPrimitivesConfig, params: SketchParams) -> dict[str, Any]:
    return {
        "task": cfg.task,
        "sketch_size": params.s,
        "sigma": params.sigma,
        "sensitivity": params.sensitivity,
        "noise_multiplier": params.z,
        "sketch_draws": params.attempt + 1,
        **({"label_sigma": params.label_sigma} if params.label_sigma is not None else {}),
    }


def _lowrank_errors(k: int, a: np.ndarray, v_mat: np.ndarray) -> dict[str, float]:
    """‖A - AVVᵀ‖_F, ‖A - A_k‖_F, their ratio and the excess."""
    err = float(np.linalg.norm(a - a @ v_mat @ v_mat.T))
    sv = np.linalg.svd(a, compute_uv=False)
    best = float(np.sqrt((sv[k:] ** 2).sum()))
    return {
        "error": err,
        "best_rank_k_error": best,
        "ratio": _ratio(err, best),
        "excess": err - best,
    }


def _relative(value: float, true: float) -> float:
    """(value − true) / true; ±inf for a true value of 0 (0 where the value is 0 too): the
    evaluation after the release never divides by zero."""
    if true != 0:
        return (value - true) / true
    return 0.0 if value == 0 else math.copysign(math.inf, value)


def _ratio(value: float, base: float) -> float:
    """value / base, where a base of 0 (data of rank <= k, or no more users than clusters) gives
    inf (1 where the value is 0 too) rather than an error after the release."""
    return value / base if base > 0 else (math.inf if value > 0 else 1.0)


def lowrank_outcome(
    cfg: VflPrimitivesConfig,
    params: SketchParams,
    v_mat: np.ndarray,
    truth: Truth | None,
    noiseless: np.ndarray | None = None,
) -> Outcome:
    """``noiseless``: the top-k right singular vectors of the same sketch without noise (the
    non-private VFL baseline, from the raw data; with ``truth``)."""
    metrics = _sketch_metrics(cfg, params)
    headline = f"top-{cfg.k} right singular vectors from an s={params.s} sketch"
    if truth is not None:
        a = truth.a
        metrics.update(
            **_lowrank_errors(cfg.k, a, v_mat),
            excess_bound=2
            * params.sigma
            * math.sqrt(2 * a.shape[1])
            / math.sqrt(1 - min(cfg.alpha, 0.99)),
        )
        if noiseless is not None:
            metrics["ratio_noiseless_sketch"] = _lowrank_errors(cfg.k, a, noiseless)["ratio"]
        headline += f"; ‖A - AVVᵀ‖ / ‖A - A_k‖ = {metrics['ratio']:.3f}"
    table = pa.table({f"v{i}": v_mat[:, i] for i in range(v_mat.shape[1])})
    return outcome(cfg, params, {"result": table}, metrics, headline)


def perturbation_note(cfg: VflPrimitivesConfig, params: PerturbationParams) -> str:
    return (
        "baseline=input-perturbation (spec §4.4, not the paper's algorithm): each server releases "
        f"A^(j) + N(0, σ²), σ = {params.sigma:.4g} per entry (the sketch's {_calibration(cfg)} "
        f"at (ε, δ), with sensitivity {params.sensitivity:g} in place of the sketch's); the CC "
        "takes the top-k right singular vectors of the noisy rows. m x d^(j) reals per server"
    )


def perturbation_outcome(
    cfg: VflPrimitivesConfig, params: PerturbationParams, v_mat: np.ndarray, truth: Truth | None
) -> Outcome:
    metrics: dict[str, Any] = {
        "task": cfg.task,
        "baseline": "input-perturbation",
        "sigma": params.sigma,
        "sensitivity": params.sensitivity,
        "reals_per_server": {
            p: params.users * d for p, d in zip(params.order, params.widths, strict=True)
        },
    }
    headline = f"top-{cfg.k} right singular vectors of the input-perturbed rows (baseline)"
    if truth is not None:
        metrics.update(_lowrank_errors(cfg.k, truth.a, v_mat))
        headline += f"; ‖A - AVVᵀ‖ / ‖A - A_k‖ = {metrics['ratio']:.3f}"
    table = pa.table({f"v{i}": v_mat[:, i] for i in range(v_mat.shape[1])})
    return outcome(cfg, params, {"result": table}, metrics, headline)


def regression_outcome(
    cfg: VflPrimitivesConfig, params: SketchParams, x: np.ndarray, truth: Truth | None
) -> Outcome:
    lam = params.sigma**2
    metrics = _sketch_metrics(cfg, params)
    metrics["ridge_lambda"] = lam
    headline = f"regression on an s={params.s} sketch (ridge-equivalent λ = {lam:.3g})"
    if truth is not None:
        a, b = truth.a, truth.b
        opt_x = np.linalg.lstsq(a, b, rcond=None)[0]
        ridge = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ b)
        loss = float(((a @ x - b) ** 2).sum())
        opt = float(((a @ opt_x - b) ** 2).sum())
        metrics.update(
            loss=loss,
            opt=opt,
            loss_ratio=_ratio(loss, opt),
            ridge_loss=float(((a @ ridge - b) ** 2).sum()),
            distance_to_ridge=float(np.linalg.norm(x - ridge) / np.linalg.norm(ridge)),
            distance_to_ols=float(np.linalg.norm(x - opt_x) / np.linalg.norm(opt_x)),
        )
        headline += f"; loss / OPT {metrics['loss_ratio']:.3f}"
    return outcome(cfg, params, {"result": pa.table({"coefficient": x})}, metrics, headline)
