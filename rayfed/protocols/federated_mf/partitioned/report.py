"""What a run of ``federated-mf``'s VFL or HFL setting reports: the per-party evaluation table,
metrics, headline and privacy notes."""

from __future__ import annotations

import pyarrow as pa

from rayfed.protocols.base import Outcome
from rayfed.protocols.federated_mf.config import FederatedMFConfig, calibration_accountant
from rayfed.protocols.federated_mf.partitioned.params import (
    ObjPertParams,
    PartitionedParams,
    SgldParams,
)

#: how the notes name the accountants
ACCOUNTANTS = {
    "tightest": "tightest accountant (PLD and RDP side by side, the smaller ε)",
    "rdp": "RDP accountant",
}

LOCAL_NOTE = (
    "local non-private SGD baseline: each party trains on its own data only; nothing is released"
)
RATING_GAP_NOTE = (
    "per-rating in HFL has a gap (spec §7.8): the pre-trained u_i depends on all of the user's "
    "ratings, so the guarantee holds given the pre-trained U only; pretrain_steps=0 closes it, "
    "and per-user (privacy_unit=user) is sound"
)


EVALUATION_NOTE = (
    "test_mse and train_mse are computed on the raw ratings, outside the protocol: a "
    "simulation's evaluation, not covered by the guarantee (nor is a learning rate tuned on them)"
)

NOT_PRIVATE_NOTE = (
    "noise=none: the federated algorithm without noise, a non-private reference — no DP "
    "guarantee holds and the ledger is empty"
)


FROM_SUMMARY = (
    "implemented from the spec's summary (federated-mf §2.10); the papers' exact constants were "
    "not available"
)


def baseline_notes(cfg: FederatedMFConfig, params: PartitionedParams) -> list[str]:
    """What DP-SGLD's or ObjPertb's guarantee rests on, and what it releases."""
    baseline = params.baseline
    if isinstance(baseline, SgldParams):
        return [
            f"DP-SGLD: {FROM_SUMMARY}. z = {params.z:.4g} calibrated by advanced composition as "
            f"in the SGLD papers (Gaussian (ε0, δ0) per step, amplified by sampling at "
            f"q = {cfg.sampling_rate:g}, {cfg.iterations * cfg.local_steps} steps) for "
            f"ε = {baseline.target_epsilon:g}; the ledger charges the true events of its steps "
            f"and the {ACCOUNTANTS[cfg.accountant]} proves the ε this run reports"
            + ("" if params.faithful_epsilon else ", below that target"),
            f"DP-SGLD: step η = {baseline.step:g}, temperature τ = {baseline.temperature:.4g}, "
            f"L = {baseline.sensitivity:.4g}; releases the last sample (U, V) (each round's U "
            "too, charged)",
        ]
    assert isinstance(baseline, ObjPertParams)
    notes = [
        f"ObjPertb: {FROM_SUMMARY}. {baseline.alternations} V-solves, each "
        f"ε/K = {baseline.epsilon_k:.4g}-DP by objective perturbation (ridge λ = "
        f"{baseline.reg:.4g}, ε' = {baseline.epsilon_prime:.4g} for the noise, ‖b_j‖ ~ "
        f"Gamma(p, {baseline.scale:.4g})), basic composition; V is the DP release, each u_i "
        "goes to user i only (joint DP): test_mse uses U, as VFL's does",
    ]
    if params.privacy_unit == "rating":
        notes.append(
            "ObjPertb per rating: a rating moves u_i, which enters every item of user i, so the "
            "per-rating sensitivity covers θ + 1 item blocks (each user trimmed to θ ratings) "
            "and is twice the per-user one"
        )
    return notes


def sampling_note(cfg: FederatedMFConfig, params: PartitionedParams) -> str | None:
    """What a per-rating DP-SGD (or DP-SGLD) run's minibatches sample, and what that does to ε."""
    sampling = params.baseline is None or isinstance(params.baseline, SgldParams)
    if params.privacy_unit != "rating" or params.z is None or not sampling:
        return None
    if params.faithful_epsilon is None:
        holds = (
            "per rating and the nominal ε does for the published steps (subject, in HFL, to the "
            "rating gap of the pre-trained u_i)"
            if cfg.setting == "hfl"
            else "per rating and the nominal ε does"
        )
        return (
            f"corrected mode: every training rating is Poisson-sampled at q = "
            f"{cfg.sampling_rate:g} on its own, so the sampled Gaussian's amplification holds "
            + holds
        )
    accounting = "the SGLD papers'" if params.baseline is not None else "the thesis's"
    return (
        f"faithful mode: calibrated to nominal ε={cfg.epsilon:g} by {accounting} accounting, "
        "which credits per-rating runs with user-sampling amplification they do not get; the "
        f"true ε is {params.faithful_epsilon:.4g} (users Poisson-sampled at η = "
        f"{cfg.sampling_rate:g}: a sampled user's other ratings leave one rating's Gaussian loss "
        "unamplified), which the ledger charges"
    )


def vfl_noise_note(cfg: FederatedMFConfig, params: PartitionedParams) -> str:
    if params.baseline is not None:
        return f"ratings kept per user: θ = {params.trim}" if params.trim else "no trimming"
    if params.z is None:
        return NOT_PRIVATE_NOTE
    return (
        f"noise multiplier z = {params.z:.4g} (σ = z·Δ, Δ = {params.delta_joint:.4g} joint, "
        f"{params.delta_v:.4g} fine-tuning{_per_user_bound(cfg, params)}) for "
        f"{cfg.iterations}x{cfg.local_steps}+{cfg.finetune_steps} "
        f"steps at η = {cfg.sampling_rate:g}, δ = {params.delta:.3g}, calibrated with the "
        + ACCOUNTANTS[calibration_accountant(cfg)]
    )


def rate_note(params: PartitionedParams) -> str:
    """Where DP-SGD's learning rate came from: the options, or the public rule of the noise."""
    rate = f"{params.lr:.4g}" + (
        "" if params.lr_end is None else f" decaying to {params.lr_end:.4g}"
    )
    if params.lr_source == "given":
        return f"learning rate {rate} (given)"
    return (
        f"learning rate {rate}: the public rule of the noise (rayfed/mf/rates.py; from z, Δ, η, "
        "the batch sizes, T·T', R, p and the shape, no rating), not tuned on the data"
    )


def _per_user_bound(cfg: FederatedMFConfig, params: PartitionedParams) -> str:
    """Which per-user Δ the run took (``user_sensitivity``)."""
    if params.trim is None:
        return ""
    if cfg.user_sensitivity == "thesis":
        return f"; θ = {params.trim} times one rating's: the thesis's bound, more noise than needed"
    return (
        f"; a user's θ = {params.trim} ratings on distinct items: √(θ²+θ)·2R^(3/2) and √θ·2R^(3/2)"
    )


def outcome(
    cfg: FederatedMFConfig,
    params: PartitionedParams,
    parts: dict[str, tuple[float, int, float, int]],
) -> Outcome:
    """Pooled test and training MSE over the parties' evaluation replies (test sse, count, train
    sse, count)."""
    test_mse = sum(v[0] for v in parts.values()) / max(1, sum(v[1] for v in parts.values()))
    train_mse = sum(v[2] for v in parts.values()) / max(1, sum(v[3] for v in parts.values()))
    metrics = {
        "test_mse": test_mse,
        "train_mse": train_mse,
        "setting": cfg.setting,
        "method": params.method,
        "parties": len(parts),
        "privacy_unit": params.privacy_unit,
        "noise": cfg.noise,
        "noise_multiplier": params.z,
        "delta": None if params.z is None else params.delta,
        "users": params.n,
        "items": params.m,
    }
    private = params.z is not None or params.baseline is not None
    if params.baseline is None and (cfg.setting == "vfl" or params.method == "hfl"):
        metrics["learning_rate"] = {  # (HFL's local-only baseline runs no DP-SGD)
            "start": params.lr,
            "end": params.lr if params.lr_end is None else params.lr_end,
            "source": params.lr_source,
        }
    if params.baseline is not None:
        metrics.update(
            delta=params.delta, trim=params.trim, baseline=dict(params.baseline.__dict__)
        )
    guarantee = f"per-{params.privacy_unit} DP" if private else "not private"
    if params.rating_gap:
        guarantee += " given the pre-trained U (the thesis's relation, spec §7.8)"
    headline = (
        f"{cfg.setting.upper()} {params.method} test MSE {test_mse:.4f} ({len(parts)} parties, "
        f"{guarantee})"
    )
    if params.clipped is not None:
        metrics["clipped"] = params.clipped.to_dict()
        if params.clipped.count:
            headline += f"; {params.clipped.statement()}"
    table = pa.table(
        {
            "party": list(parts),
            "sse": [v[0] for v in parts.values()],
            "ratings": [v[1] for v in parts.values()],
        }
    )
    return Outcome(tables={"evaluation": table}, metrics=metrics, headline=headline)
