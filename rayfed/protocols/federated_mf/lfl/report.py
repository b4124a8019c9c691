"""What a run of ``federated-mf``'s LFL setting reports: the iterations table, metrics, headline
and privacy notes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rayfed.mf.lfl import worst_case_variance
from rayfed.protocols.base import Outcome
from rayfed.protocols.federated_mf.config import FederatedMFConfig, calibration_accountant
from rayfed.protocols.federated_mf.lfl.params import LflParams

ITERATION_COLUMNS = ("iteration", "skipped", "u1", "u2", "f_eff", "f_applied")
METHOD_NAMES = {
    "lfl": "LFL-SGDMF",
    "ldp": "LFL with LDP-level noise (baseline)",
    "stage1": "LFL Stage 1 only (baseline)",
    "central": "central non-private SGD (baseline)",
    "gd-dr": "Private-GD-DR (LDP baseline)",
}


def notes(cfg: FederatedMFConfig, params: LflParams) -> list[str]:
    if params.gddr is not None:
        return _gddr_notes(cfg, params)
    out = [_method_note(cfg, params)]
    if params.method in ("lfl", "ldp") and cfg.secagg_mode != "secure":
        out.append(
            f"secagg_mode={cfg.secagg_mode}: the DP statement assumes an ideal secure "
            "aggregation; in this mode the coordinator could derive the masks (a simulation, "
            "not a deployment)"
        )
    if params.method in ("lfl", "ldp"):
        out.append(secagg_note(cfg, params))
    if params.ddp is not None:
        out.append(integer_note(cfg, params))
        return out
    accountant = "RDP" if calibration_accountant(cfg) == "rdp" else "PLD and RDP, the smaller ε"
    out.append(
        f"σ_v = z·2R^(3/2) with z = {params.z:.4g} from dp-accounting ({accountant}, "
        f"T={cfg.iterations}, δ={params.delta:.3g}); skipped iterations are charged too "
        "(conservative)"
    )
    return out


def integer_note(cfg: FederatedMFConfig, params: LflParams) -> str:
    """The integer mechanism: the pipeline, the share, the removal levels, the bounds."""
    p, shares = params.ddp, params.releases.round1.mechanism
    return (
        f"dp_mechanism={cfg.dp_mechanism}: gradient rows rotated (padded to {p.padded_dim}), "
        f"scaled by γ = {p.gamma:.4g} and conditionally rounded (Δ₂ = {p.l2_bound:.4g}, "
        f"Δ₁ = {p.l1_bound} in integer units: {p.inflation_bound:.4f}× the scaled 2R^(3/2)), "
        f"a Skellam share of variance {shares.variance:.6g} per user and coordinate, "
        f"{cfg.bits}-bit ring (modular-clipping bound {p.modular_clip_bound():.2g} per "
        f"iteration); at least t − c = {shares.quorum} honest shares (t = {params.threshold}, "
        f"c = {params.secagg.corrupt} users colluding with the server) make Skellam of variance "
        f">= {shares.variance * shares.quorum:.6g} = (z·Δ₂)², z = {params.z:.4g}, calibrated "
        f"for T={cfg.iterations} at δ={params.delta:.3g} (Skellam's RDP); Round 2 removes the "
        f"survivors' share components below the largest of g = {list(params.levels)} that is "
        "<= |U1| − c (under a malicious server: nothing), leaving the honest users Skellam of "
        "variance >= the target: the nominal ε holds"
    )


def secagg_note(cfg: FederatedMFConfig, params: LflParams) -> str:
    """Round 1's secure aggregation: the threat model it is sized for, k, t and both bounds."""
    sa = params.secagg
    note = (
        f"Round-1 secure aggregation against a {sa.threat_model} server (threat_model): "
        + (
            f"complete graph k={sa.degree} (n - 1)"
            if sa.complete
            else f"Harary graph k={sa.degree}"
        )
        + f", t={sa.threshold}, {sa.bounds()}"
    )
    if sa.threat_model == "semi-honest":
        note += (
            "; a server that lies about who dropped could isolate a user's Round-1 message: "
            "out of scope (threat_model=malicious)"
        )
    return note


def _gddr_notes(cfg: FederatedMFConfig, params: LflParams) -> list[str]:
    gd = params.gddr
    k = gd.projection.shape[0]
    return [
        f"GD-DR: each report is ε0-LDP with ε0 = {gd.epsilon0:.4g} per iteration against the "
        f"server (local guarantee over T={cfg.iterations}: {cfg.iterations * gd.epsilon0:.4g}); "
        "the central ε assumes a trusted shuffler (the server sees only the multiset of "
        "reports), which this simulation does not build",
        f"shuffle amplification (Feldman, McMillan, Talwar 2021, Thm 3.1) among at least "
        f"t = {gd.quorum} reports at δ/T = {gd.step_delta:.3g} per iteration, basic composition "
        "over T; an iteration with fewer reports releases nothing and is charged too",
        f"random projection k = {k} (of m = {params.m} items); "
        + (
            f"projected-gradient entries clipped to ±{gd.clip:.4g} (gddr_clip: biased)"
            if cfg.gddr_clip
            else f"projected-gradient entries within their exact bound ±{gd.clip:.4g} (no clipping)"
        )
        + "; implemented from the spec's summary, not the paper (constants not available)",
    ]


def lost_note(cohorts: list[str], lost_users: str = "dropouts") -> str:
    """Cohorts missing from the evaluation: lost for good (lost_users=dropouts), or, under
    lost_users=resume, gone with their restarts spent."""
    how = (
        "lost for good (lost_users=dropouts): their users were permanent dropouts from then on"
        if lost_users == "dropouts"
        else "died and could not be resumed (lost_users=resume, its restarts spent): their "
        "users were not evaluated"
    )
    return f"cohort(s) {', '.join(sorted(cohorts))} {how} and are not in the test MSE"


#: phases after which a resumed cohort's users have no Stage 2 left: what its restore brings back
_AFTER_TRAINING = ("finetune", "evaluate")


def restored_statement(losses: list[dict[str, Any]], missing: list[str]) -> str:
    """For the headline: cohorts that died in Stage 3 or in the evaluation, and what their
    users' result is made of (resumed from a checkpoint and the phase re-run, or missing)."""
    parts = []
    for x in losses:
        if x["role"] != "cohort" or x["phase"] not in _AFTER_TRAINING:
            continue
        if x["fate"] == "resumed" and x["member"] not in missing:
            redo = (
                "Stage 3 re-run on its checkpointed u_i"
                if x["phase"] == "finetune"
                else "evaluated again on its u_i checkpointed after Stage 3"
            )
            parts.append(
                f"cohort {x['member']} died at {x['phase']}: restored from its checkpoint and "
                f"{redo}, so its users' test error includes Stage 3 as everyone's"
            )
        else:
            parts.append(
                f"cohort {x['member']} died at {x['phase']}: its users are not in the test MSE"
            )
    return "; ".join(parts)


def _method_note(cfg: FederatedMFConfig, params: LflParams) -> str:
    if params.method == "stage1":
        return "stage-1-only baseline: V stays at its initialisation; nothing is released"
    if params.method == "ldp":
        return "LDP-level noise baseline: every device adds the full σ_v² to its own report"
    if cfg.mode == "faithful":
        worst = worst_case_variance(
            cfg.mode, params.method, params.n, cfg.omega, params.secagg.corrupt
        )
        return (
            f"faithful mode (the thesis): calibrated to a nominal ε={cfg.epsilon:g}; the server "
            "also sees Round 2, and the effective noise can fall to "
            f"{worst:.3f}·σ_v², so the ledger charges that worst case: the epsilon reported "
            "above is the true guarantee"
        )
    return (
        "corrected mode: effective noise >= σ_v² in every accepted outcome, so the nominal ε holds"
    )


def _gddr_metrics(cfg: FederatedMFConfig, params: LflParams) -> dict[str, Any]:
    gd = params.gddr
    return {
        "ldp_epsilon_per_iteration": gd.epsilon0,
        "ldp_epsilon": cfg.iterations * gd.epsilon0,
        "shuffle_quorum": gd.quorum,
        "projection_dim": int(gd.projection.shape[0]),
        "entry_clip": gd.clip,
        "report_scale": gd.scale,
    }


def _lr_source(cfg: FederatedMFConfig) -> str:
    """Where the server step γ came from: the user, GD-DR's constant or LFL's public rule."""
    if cfg.lr is not None:
        return "lr, given"
    if cfg.resolved_method() == "gd-dr":
        return "GD-DR's default"
    return "public rule of z, Δ, n, ω, R, p, T"


def outcome(
    cfg: FederatedMFConfig,
    params: LflParams,
    charged_epsilon: float,
    test_mse: float,
    history: list[dict[str, Any]],
    baselines: dict[str, float],
) -> Outcome:
    skipped = [row["iteration"] for row in history if row["skipped"]]
    metrics = {
        "test_mse": test_mse,
        "method": params.method,
        "mode": cfg.mode,
        "users": params.n,
        "items": params.m,
        "noise_multiplier": params.z,
        "dp_mechanism": cfg.dp_mechanism if params.method == "lfl" else None,
        "delta": params.delta,
        "skipped_iterations": skipped,
        "iterations": history,
        "secagg_degree": params.secagg.degree,
        "secagg_threshold": params.secagg.threshold,
        "secagg_threat_model": params.secagg.threat_model,
        "secagg_log2_security_bound": params.secagg.log2_security_failure,
        "secagg_log2_abort_bound": params.secagg.log2_correctness_failure,
        "threshold": params.threshold,
        "tolerated_dropout": cfg.omega,
        "secagg_mode": cfg.secagg_mode,
        "epsilon_nominal": cfg.epsilon,
        "epsilon_worst_case": charged_epsilon,
        **baselines,
        # what rayfed report draws beside the learning curve: each baseline's metric, the
        # per-round value it compares with, and its name (the report guesses none)
        "baselines": {
            f"{method}_test_mse": {"of": "test_mse", "label": METHOD_NAMES[method]}
            for method in ("stage1", "central")
            if f"{method}_test_mse" in baselines
        },
        "learning_curve": [row["test_mse"] for row in history],
        "server_lr": params.server_lr,
        "server_lr_source": None if params.server_lr is None else _lr_source(cfg),
    }
    if params.gddr is not None:  # it runs no secure aggregation and draws no Gaussian
        for unused in (
            "secagg_degree",
            "secagg_threshold",
            "secagg_threat_model",
            "secagg_log2_security_bound",
            "secagg_log2_abort_bound",
            "secagg_mode",
            "noise_multiplier",
        ):
            metrics[unused] = None
        metrics.update(_gddr_metrics(cfg, params))
    headline = f"{METHOD_NAMES[params.method]} test MSE {test_mse:.4f} ({params.n} users, {params.m} items)"
    reported = [row["u1"] for row in history if row.get("u1") is not None]
    if reported and min(reported) < params.n:  # dropouts: say how many users each update had
        low, high = min(reported), max(reported)
        span = f"{low:,}" if low == high else f"{low:,} to {high:,}"
        headline += f"; {span} of the {params.n:,} users reported per iteration"
    if params.method in ("lfl", "ldp"):
        headline += f"; Round-1 secure aggregation: threat model {params.secagg.threat_model}"
        if cfg.secagg_mode != "secure":  # the model is what the parameters are sized for
            headline += f" [{cfg.secagg_mode} mode, NOT secure]"
    if params.ddp is not None:
        p = params.ddp
        metrics.update(
            bits=p.bits,
            gamma=p.gamma,
            padded_dim=p.padded_dim,
            l2_sensitivity_integer=p.l2_bound,
            inflation_bound=p.inflation_bound,
            modular_clip_bound=p.modular_clip_bound(),
            share_variance=params.releases.round1.mechanism.variance,
            removal_levels=list(params.levels),
        )
    if params.clipped is not None:
        metrics["clipped"] = params.clipped.to_dict()
        if params.clipped.count:
            headline += f"; {params.clipped.statement()}"
    if skipped:
        headline += f"; {len(skipped)} iteration(s) skipped below threshold"
    details = []
    if baselines:
        details = [
            "baselines (same run, evaluation only): Stage 1 only "
            f"{baselines['stage1_test_mse']:.4f}, central non-private SGD "
            f"{baselines['central_test_mse']:.4f}",
            "test MSE by iteration: "
            + " ".join(f"{row['test_mse']:.3f}" for row in history)
            + f" (server step γ = {params.server_lr:.4g}, {_lr_source(cfg)})",
        ]
    table = (
        pa.Table.from_pylist([{k: r.get(k) for k in ITERATION_COLUMNS} for r in history])
        if history
        else pa.table({"iteration": pa.array([], pa.int64())})
    )
    return Outcome(
        tables={"iterations": table}, metrics=metrics, headline=headline, details=details
    )
