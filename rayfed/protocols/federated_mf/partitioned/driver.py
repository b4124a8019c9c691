"""The rounds of ``federated-mf``'s VFL and HFL settings: T rounds of T' local DP-SGD steps at
every party and the server's average (of U in VFL, of V in HFL), then fine-tuning and evaluation."""

from __future__ import annotations

from rayfed.federation import PerMember
from rayfed.mf.training import step_rates
from rayfed.privacy import Measurement
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.partitioned import report
from rayfed.protocols.federated_mf.partitioned.baselines import objpert_step, sgld_local_step
from rayfed.protocols.federated_mf.partitioned.params import PartitionedParams, SgldParams
from rayfed.protocols.federated_mf.partitioned.steps import (
    average_step,
    hfl_evaluate_step,
    hfl_finetune_step,
    hfl_local_step,
    hfl_pretrain_step,
    init_u_step,
    vfl_evaluate_step,
    vfl_finetune_step,
    vfl_init_step,
    vfl_local_step,
)
from rayfed.protocols.federated_mf.steps import init_v_step


def drive(fed, cfg: FederatedMFConfig, plan: Plan) -> Outcome:
    if plan.params.baseline is not None:
        return _drive_baseline(fed, cfg, plan.params)
    if cfg.setting == "vfl":
        return _drive_vfl(fed, cfg, plan.params)
    return _drive_hfl(fed, cfg, plan.params)


def _rates(cfg: FederatedMFConfig, params: PartitionedParams, t: int):
    """Round t's learning rates: the resolved start, or its decay to the end over all T·T' steps."""
    total = cfg.iterations * cfg.local_steps
    return step_rates(params.lr, params.lr_end, t * cfg.local_steps, cfg.local_steps, total)


def _note_sampling(fed, cfg: FederatedMFConfig, params: PartitionedParams) -> None:
    note = report.sampling_note(cfg, params)
    if note is not None:
        fed.note(note)


def _charge(fed, release: Measurement | None, steps: int) -> None:
    """Every party's ``steps`` draws of ``release``, before they are drawn; nothing with
    ``noise=none`` (no release: no noise is drawn and nothing is DP)."""
    if release is None:
        return
    fed.charge([release.charge(k, times=steps) for k in fed.parties.names])


# --- VFL -------------------------------------------------------------------------------------------
def _init_vfl(fed, cfg: FederatedMFConfig, params: PartitionedParams):
    """The server's initial U (returned, to broadcast) and every party's V_Fk and trimming."""
    u_msg = fed.coordinator.run(
        init_u_step, n=params.n, p=cfg.rank, mean=params.mean, bound=cfg.bound, phase="init_u"
    )
    fed.parties.run(
        vfl_init_step,
        p=cfg.rank,
        mean=params.mean,
        bound=cfg.bound,
        trim=params.trim,
        phase="init_v",
    )
    return u_msg.single()


def _drive_vfl(fed, cfg: FederatedMFConfig, params: PartitionedParams) -> Outcome:
    u_arg = _vfl_rounds(fed, cfg, params, _init_vfl(fed, cfg, params))
    if cfg.finetune_steps:
        _vfl_finetune(fed, cfg, params, u_arg)
    return _evaluate_vfl(fed, cfg, params)


def _evaluate_vfl(fed, cfg: FederatedMFConfig, params: PartitionedParams) -> Outcome:
    parts = fed.get(fed.parties.run(vfl_evaluate_step, phase="evaluate"))
    fed.note(report.vfl_noise_note(cfg, params))
    if params.baseline is None:
        fed.note(report.rate_note(params))
    _note_sampling(fed, cfg, params)
    fed.note(report.EVALUATION_NOTE)
    return report.outcome(cfg, params, parts)


def _vfl_rounds(fed, cfg: FederatedMFConfig, params: PartitionedParams, u_arg):
    """T rounds; returns the U each party continues from: the average (VFL), or its own U^(k)
    (the local-only baseline)."""
    names = fed.parties.names
    shares = PerMember({k: params.shares[k] for k in names})
    for t in range(cfg.iterations):
        with fed.round(t):
            _charge(fed, params.releases.local, cfg.local_steps)
            uploads = fed.parties.run(
                vfl_local_step,
                u_arg,
                round=t,
                steps=cfg.local_steps,
                lr=_rates(cfg, params, t),
                rate=cfg.sampling_rate,
                release=params.releases.local,
                bound=cfg.bound,
                m_share=shares,
                sampled=params.sampled,
                phase="local_steps",
            )
            if params.method == "vfl":
                weights = {k: params.shares[k] for k in names}
                u_arg = fed.coordinator.run(
                    average_step,
                    uploads,
                    weights=weights,
                    name="user_embeddings",
                    phase="average_u",
                ).single()
            else:  # local-only: each party continues from its own U^(k)
                u_arg = PerMember(uploads)
    return u_arg


def _vfl_finetune(fed, cfg: FederatedMFConfig, params: PartitionedParams, u_arg) -> None:
    """κ noisy steps on each V_Fk with U frozen: published, so charged."""
    names = fed.parties.names
    _charge(fed, params.releases.finetune, cfg.finetune_steps)
    fed.parties.run(
        vfl_finetune_step,
        u_arg,
        steps=cfg.finetune_steps,
        lr=params.lr if params.lr_end is None else params.lr_end,
        rate=cfg.sampling_rate,
        release=params.releases.finetune,
        bound=cfg.bound,
        m_share=PerMember({k: params.shares[k] for k in names}),
        sampled=params.sampled,
        phase="finetune",
    )


# --- VFL's central literature baselines (s = 1) -----------------------------------------------------
def _drive_baseline(fed, cfg: FederatedMFConfig, params: PartitionedParams) -> Outcome:
    """DP-SGLD (T rounds of T' steps, each round's release charged as in VFL) or ObjPertb (K
    alternations, each V-solve charged ε_k), from VFL's initial U and V and trimming."""
    u_arg = _init_vfl(fed, cfg, params)
    if isinstance(params.baseline, SgldParams):
        _sgld_rounds(fed, cfg, params, u_arg)
    else:
        _objpert_rounds(fed, cfg, params, u_arg)
    for note in report.baseline_notes(cfg, params):
        fed.note(note)
    return _evaluate_vfl(fed, cfg, params)


def _sgld_rounds(fed, cfg: FederatedMFConfig, params: PartitionedParams, u_arg) -> None:
    sgld = params.baseline
    for t in range(cfg.iterations):
        with fed.round(t):
            _charge(fed, params.releases.local, cfg.local_steps)
            uploads = fed.parties.run(
                sgld_local_step,
                u_arg,
                round=t,
                steps=cfg.local_steps,
                eta=sgld.step,
                rate=cfg.sampling_rate,
                release=params.releases.local,
                bound=cfg.bound,
                sampled=params.sampled,
                phase="local_steps",
            )
            u_arg = PerMember(uploads)


def _objpert_rounds(fed, cfg: FederatedMFConfig, params: PartitionedParams, u_arg) -> None:
    objpert = params.baseline
    for k in range(objpert.alternations):
        with fed.round(k):
            _charge(fed, params.releases.local, 1)
            fed.parties.run(
                objpert_step,
                u_arg if k == 0 else None,
                round=k,
                reg=objpert.reg,
                release=params.releases.local,
                bound=cfg.bound,
                phase="v_solve",
            )


# --- HFL -------------------------------------------------------------------------------------------
def _drive_hfl(fed, cfg: FederatedMFConfig, params: PartitionedParams) -> Outcome:
    v_msg = fed.coordinator.run(
        init_v_step, m=params.m, p=cfg.rank, mean=params.mean, bound=cfg.bound, phase="init_v"
    )
    fed.parties.run(
        hfl_pretrain_step,
        v_msg.single(),
        p=cfg.rank,
        mean=params.mean,
        steps=cfg.pretrain_steps,
        lr=cfg.local_lr,
        bound=cfg.bound,
        trim=params.trim,
        phase="pretrain",
    )
    if params.method == "hfl":
        v_msg = _hfl_rounds(fed, cfg, params, v_msg)
    else:
        fed.note(report.LOCAL_NOTE)
    fed.parties.run(
        hfl_finetune_step,
        v_msg.single(),
        steps=cfg.finetune_steps,
        lr=cfg.local_lr,
        bound=cfg.bound,
        phase="finetune",
    )
    parts = fed.get(fed.parties.run(hfl_evaluate_step, phase="evaluate"))
    if params.method == "hfl":
        fed.note(report.rate_note(params))
    if params.rating_gap:
        fed.note(report.RATING_GAP_NOTE)
    if params.privacy_unit == "rating":
        _note_sampling(fed, cfg, params)
    if params.z is None:
        fed.note(report.NOT_PRIVATE_NOTE)
    fed.note(report.EVALUATION_NOTE)
    return report.outcome(cfg, params, parts)


def _hfl_rounds(fed, cfg: FederatedMFConfig, params: PartitionedParams, v_msg):
    """T rounds of DP-SGD on every party's copy of V and the server's weighted average."""
    names = fed.parties.names
    weights = {k: params.shares[k] for k in names}
    for t in range(cfg.iterations):
        with fed.round(t):
            _charge(fed, params.releases.local, cfg.local_steps)
            uploads = fed.parties.run(
                hfl_local_step,
                v_msg.single(),
                round=t,
                steps=cfg.local_steps,
                lr=_rates(cfg, params, t),
                rate=cfg.sampling_rate,
                release=params.releases.local,
                bound=cfg.bound,
                sampled=params.sampled,
                phase="local_steps",
            )
            v_msg = fed.coordinator.run(
                average_step, uploads, weights=weights, name="item_embeddings", phase="average_v"
            )
    return v_msg
