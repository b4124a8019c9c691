"""The rounds of ``federated-mf``'s LFL setting: Stage 1, T two-round iterations (Round 1 through
secure aggregation, Round 2's noise replacement, the server's update), Stage 3 and evaluation."""

from __future__ import annotations

import dataclasses
from typing import Any

from rayfed.errors import BelowThreshold
from rayfed.mf.lfl import applied_variance, colluding_variance, noise_shares, removal_variance
from rayfed.privacy.distributed import level
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.lfl import report
from rayfed.protocols.federated_mf.lfl.params import LflParams
from rayfed.protocols.federated_mf.lfl.plan import CORRUPT_FRACTION
from rayfed.protocols.federated_mf.lfl.steps import (
    checkpoint_step,
    current_v_step,
    evaluate_step,
    finetune_step,
    gddr_report_step,
    gddr_update_step,
    lfl_round1_inputs,
    lfl_round2_removal_step,
    lfl_round2_step,
    restore_step,
    stopped_here_step,
    update_v_ring_step,
    update_v_step,
)
from rayfed.protocols.federated_mf.steps import central_test_mse, init_v_step, pretrain_step
from rayfed.secagg import make_spec, secure_sum


def drive(fed, cfg: FederatedMFConfig, plan: Plan) -> Outcome:
    params: LflParams = plan.params
    v_msg = fed.coordinator.run(
        init_v_step, m=params.m, p=cfg.rank, mean=params.mean, bound=cfg.bound, phase="init_v"
    )
    fed.cohorts.run(
        pretrain_step,
        v_msg.single(),
        p=cfg.rank,
        mean=params.mean,
        steps=cfg.pretrain_steps,
        lr=cfg.local_lr,
        bound=cfg.bound,
        phase="pretrain",
    )
    if cfg.lost_users == "resume":  # u_i changes only in Stages 1 and 3: one checkpoint holds
        fed.cohorts.checkpoint(checkpoint_step, restore_step)
    history: list[dict[str, Any]] = []
    baselines: dict[str, float] = {}
    if params.method in ("lfl", "ldp", "gd-dr"):
        # evaluation only, in the same run: where Stage 1 alone ends, and the central optimum
        baselines["stage1_test_mse"] = _stopped_here(fed, cfg, v_msg)
        baselines["central_test_mse"] = central_test_mse(
            plan.evaluation, rank=cfg.rank, seed=fed.seed
        )
        iterations = _gddr_iterations if params.method == "gd-dr" else _iterations
        v_msg, history = iterations(fed, cfg, params, v_msg)
    for note in report.notes(cfg, params):
        fed.note(note)
    # lost_users=resume: a cohort lost in Stage 3 or in the evaluation is restarted, restored
    # from its checkpoint and asked again, so its users' result includes Stage 3 as everyone's
    # (the checkpoint after Stage 3 is what an evaluation re-run restores)
    again = "retry" if cfg.lost_users == "resume" else "drop"
    fed.cohorts.run(
        finetune_step,
        v_msg.single(),
        steps=cfg.finetune_steps,
        lr=cfg.local_lr,
        bound=cfg.bound,
        phase="finetune",
        on_failure=again,
    )
    if cfg.lost_users == "resume":
        fed.cohorts.checkpoint(checkpoint_step, restore_step)
    evaluated = fed.cohorts.run(evaluate_step, v_msg.single(), phase="evaluate", on_failure=again)
    if evaluated.failed:
        fed.note(report.lost_note(evaluated.failed, cfg.lost_users))
    # evaluation only, outside the guarantee: no default picks γ on it (the default γ is the
    # public rule, lfl.plan.server_lr, which reads no rating; a tuning run picks on a public
    # stand-in: federated_mf.tuning)
    if history:
        trained = fed.cohorts.run(
            evaluate_step, v_msg.single(), split="train", phase="evaluate", on_failure=again
        )
        baselines["train_mse"] = _mean(fed.get(trained))
    outcome = report.outcome(
        cfg, params, plan.privacy.budget.epsilon, _mean(fed.get(evaluated)), history, baselines
    )
    outcome.metrics["lost_cohorts"] = sorted(evaluated.failed)
    outcome.metrics["server_shards"] = max(1, len(fed.shards))
    restored = report.restored_statement(fed.losses(), evaluated.failed)
    if restored:
        outcome.headline += f"; {restored}"
    return outcome


def _mean(parts: dict[str, tuple[float, int]]) -> float:
    """The test MSE from the cohorts' (squared error, count) pairs."""
    return sum(s for s, _ in parts.values()) / max(1, sum(c for _, c in parts.values()))


def _stopped_here(fed, cfg: FederatedMFConfig, v_msg) -> float:
    """Evaluation only: the test MSE had training stopped at the coordinator's current V (Stage 3
    on copies); a cohort that is gone is left out of the point."""
    parts = fed.cohorts.run(
        stopped_here_step,
        v_msg.single(),
        steps=cfg.finetune_steps,
        lr=cfg.local_lr,
        bound=cfg.bound,
        phase="learning_curve",
        on_failure="drop",
    )
    return _mean(fed.get(parts))


def _iterations(fed, cfg: FederatedMFConfig, params: LflParams, v_msg):
    """Stage 2: T iterations, each charged before its noise is drawn (a skipped one too)."""
    history = []
    for t in range(cfg.iterations):
        with fed.round(t):
            fed.charge([params.releases.round1.charge("run")])
            v_msg, row = _iteration(fed, cfg, params, t, v_msg)
            row["test_mse"] = _stopped_here(fed, cfg, v_msg)
            fed.record(
                survivors_round1=row.get("u1", 0),
                survivors_round2=row.get("u2", 0),
                skipped=int(row["skipped"]),
                test_mse=row["test_mse"],
            )
        history.append(row)
    return v_msg, history


def _gddr_iterations(fed, cfg: FederatedMFConfig, params: LflParams, v_msg):
    """GD-DR's T iterations: every online user sends one ε0-LDP report and takes a local step
    on u_i; the server updates V from the reports if at least t arrived (else the shuffler
    releases nothing and V stays). Each iteration is charged before its reports are drawn."""
    gd = params.gddr
    history = []
    for t in range(cfg.iterations):
        with fed.round(t):
            fed.charge([params.releases.reports.charge("run")])
            reports = fed.cohorts.run(
                gddr_report_step,
                v_msg.single(),
                round=t,
                params=gd,
                release=params.releases.reports,
                schedule=params.schedule,
                lr=cfg.local_lr,
                bound=cfg.bound,
                phase="ldp_reports",
                on_failure="drop",  # a cohort lost here: its users send no report
            )
            count = int(sum(len(r["y"]) for r in fed.get(reports).values()))
            row: dict[str, Any] = {"iteration": t, "skipped": count < gd.quorum, "u1": count}
            if row["skipped"]:
                row["reason"] = f"{count} reports < t = {gd.quorum}"
                v_msg = fed.coordinator.run(current_v_step, phase="keep_v")
            else:
                v_msg = fed.coordinator.run(
                    gddr_update_step,
                    reports,
                    params=gd,
                    lr=params.server_lr,
                    bound=cfg.bound,
                    phase="update_v",
                )
            if cfg.lost_users == "resume":  # u_i moved: a restarted cohort resumes from here
                fed.cohorts.checkpoint(checkpoint_step, restore_step)
            row["test_mse"] = _stopped_here(fed, cfg, v_msg)
            fed.record(reports=count, skipped=int(row["skipped"]), test_mse=row["test_mse"])
        history.append(row)
    return v_msg, history


def _iteration(fed, cfg: FederatedMFConfig, params: LflParams, t: int, v_msg):
    """One iteration: (the coordinator's V reply, the iteration's row). Below the threshold t it
    is skipped and V is broadcast unchanged."""
    # the integer mechanism's pipeline of this iteration: its rotation signs and rounding keyed
    # by t (never the same signs twice)
    pipeline = dataclasses.replace(params.ddp, round=t) if params.ddp is not None else None
    spec = make_spec(
        round=t,
        mode=cfg.secagg_mode,
        registry=params.registry,
        params=params.secagg,
        encoding=params.encoding,
        dim=pipeline.padded_dim if pipeline is not None else params.m * cfg.rank,
        tag=fed.run_id.encode(),
        dropout=params.schedule,
        min_survivors=params.threshold,  # secure aggregation itself aborts below t
        corrupt=CORRUPT_FRACTION,
    )
    v = fed.get(v_msg.single())
    row: dict[str, Any] = {"iteration": t, "skipped": False}
    try:
        agg = secure_sum(
            fed.cohorts,
            spec,
            lfl_round1_inputs,
            (v, params.releases.round1) + ((pipeline,) if pipeline is not None else ()),
            server=fed.coordinator,
            shards=fed.shards,
        )
    except BelowThreshold as err:
        row.update(skipped=True, reason=str(err))
        return fed.coordinator.run(current_v_step, phase="keep_v"), row
    u1 = int(agg.survivors.size)
    if u1 < params.threshold:
        row.update(skipped=True, reason=f"|U1| = {u1} < t = {params.threshold}")
        return fed.coordinator.run(current_v_step, phase="keep_v"), row
    if pipeline is not None:
        return _integer_update(fed, cfg, params, t, agg, pipeline, row), row
    # a malicious server's |U1| cannot be checked: the users' replacement is the worst case's
    # (|U1| = t), which they also enforce (lfl_round2_step)
    counted = params.threshold if cfg.threat_model == "malicious" else u1
    corrupt = params.secagg.corrupt
    zeta1, zeta2, beta = noise_shares(
        cfg.mode, params.method, params.n, cfg.omega, counted, corrupt
    )
    round2, u2 = _round2(fed, cfg, params, t, agg.survivors, zeta2)
    v_msg = fed.coordinator.run(
        update_v_step,
        agg.sum,
        round2,
        u1=u1,
        lr=params.server_lr,
        beta=beta,
        bound=cfg.bound,
        phase="update_v",
    )
    # f_eff: the best estimate of the server and its colluding users (what DP must cover);
    # f_applied: the update's own noise
    row.update(
        u1=u1,
        u2=u2,
        f_eff=colluding_variance(zeta1, zeta2, u1, u2, corrupt),
        f_applied=applied_variance(zeta1, zeta2, beta, u1, u2),
    )
    return v_msg, row


def _round2(fed, cfg: FederatedMFConfig, params: LflParams, t: int, survivors, zeta2):
    """(Round 2's replies, |U2|); no round when ζ2 = 0 (the LDP-level baseline)."""
    if zeta2 > 0:
        round2 = fed.cohorts.run(
            lfl_round2_step,
            survivors,
            round=t,
            width=params.m * cfg.rank,
            release=params.releases.round2,
            round1=params.releases.round1,
            zeta2=zeta2,
            dropout=cfg.dropout,
            phase="round2",
            on_failure="drop",  # a cohort lost here: its users are Round-2 dropouts
        )
        return round2, int(sum(len(r["ids"]) for r in fed.get(round2).values()))
    return {}, 0


def _integer_update(fed, cfg: FederatedMFConfig, params: LflParams, t: int, agg, pipeline, row):
    """The integer mechanism's Round 2 and update (fills ``row``): the survivors online remove
    their share components below the level of |U1| (none at |U1| < g_1: no Round 2), the
    coordinator decodes S1 + N2 and steps V. f_eff = f_applied: the noise left, in units of the
    target variance (removal reveals nothing about it)."""
    u1 = int(agg.survivors.size)
    corrupt = params.secagg.corrupt
    # the level of the honest count |U1| − c; a malicious server's |U1| cannot be checked, so
    # its users remove nothing (they refuse to themselves: lfl_round2_removal_step)
    checked = cfg.threat_model == "semi-honest"
    upto = level(params.levels, u1 - corrupt) if checked else 0
    round2, u2 = {}, 0
    if upto > 0:
        round2 = fed.cohorts.run(
            lfl_round2_removal_step,
            agg.survivors,
            round=t,
            release=params.releases.round2,
            round1=params.releases.round1,
            upto=upto,
            dropout=cfg.dropout,
            pipeline=pipeline,
            phase="round2",
            on_failure="drop",  # a cohort lost here: its users keep their whole share
        )
        u2 = int(sum(len(r["ids"]) for r in fed.get(round2).values()))
    v_msg = fed.coordinator.run(
        update_v_ring_step,
        agg.words,
        round2,
        pipeline=pipeline,
        u1=u1,
        lr=params.server_lr,
        bound=cfg.bound,
        phase="update_v",
    )
    f = removal_variance(
        params.releases.round1.mechanism.quorum, params.levels, upto, u1, u2, corrupt
    )
    row.update(u1=u1, u2=u2, f_eff=f, f_applied=f)
    return v_msg
