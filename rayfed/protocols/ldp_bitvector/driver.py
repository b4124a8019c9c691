"""The round of ``ldp-bitvector``: the custodians encode (or a trusted party runs a baseline), the
collector estimates the distance matrix and clusters."""

from __future__ import annotations

from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.ldp_bitvector import report
from rayfed.protocols.ldp_bitvector.config import BASELINES, LdpBitvectorConfig
from rayfed.protocols.ldp_bitvector.params import Params
from rayfed.protocols.ldp_bitvector.steps import (
    Clusters,
    baseline_step,
    collector_step,
    decomposition_collector_step,
    encode_step,
    exact_step,
    pair_step,
)


def drive(fed, cfg: LdpBitvectorConfig, plan: Plan) -> Outcome:
    params: Params = plan.params
    with fed.round(0):
        if cfg.method in BASELINES:
            out = fed.parties.call(
                baseline_step,
                method=cfg.method,
                k=cfg.k,
                sigma=cfg.adp_sigma,
                q=cfg.rsp_dims,
                phase="baseline",
            )
        elif params.decomposition:
            out = _decomposition(fed, cfg, params)
        else:
            out = _encode_and_collect(fed, cfg, params)
    for note in report.notes(cfg, params, plan.privacy.budget.epsilon):
        fed.note(note)
    truth = plan.evaluation.labels if plan.evaluation is not None else None
    return report.outcome(cfg, params, out, plan.privacy.budget.epsilon, truth)


def _eps(cfg: LdpBitvectorConfig) -> float | None:
    """The per-bit ε of the randomized response; None: the noise-free encodings."""
    return cfg.epsilon if cfg.encoding == "dpbv" else None


def _encode_and_collect(fed, cfg: LdpBitvectorConfig, params: Params) -> Clusters:
    eps = _eps(cfg)
    if cfg.encoding == "exact":
        sent = fed.parties.run(exact_step, phase="values")
    else:
        releases = params.releases  # empty for the noise-free BV
        if releases:
            fed.charge([releases[p].charge(p) for p in params.order])
        sent = fed.parties.run(
            encode_step,
            releases=releases,
            t=cfg.half_width,
            round=0,
            phase="encode",
        )
    return fed.coordinator.call(
        collector_step,
        sent,
        order=params.order,
        horizontal=cfg.partition == "horizontal",
        encoding=cfg.encoding,
        bits=cfg.bits,
        mu=params.mu,
        eps=eps,
        consistence=params.consistence,
        clustering=params.clustering,
        phase="collect",
    )


def _decomposition(fed, cfg: LdpBitvectorConfig, params: Params) -> Clusters:
    """Alice sends her values in the clear (she is the analyst), Bob the pair codes of u and v."""
    alice, bob = params.order
    release = params.releases.get(bob)  # None: the noise-free BV
    if release is not None:
        fed.charge([release.charge(bob)])
    exact = fed.parties.run(exact_step, members=[alice], phase="alice-values")
    codes = fed.parties.run(pair_step, release=release, round=0, members=[bob], phase="pair-codes")
    return fed.coordinator.call(
        decomposition_collector_step,
        exact.single(),
        codes.single(),
        bits=cfg.bits,
        pair_mu=params.pair_mu,
        eps=_eps(cfg),
        clustering=params.clustering,
        phase="collect",
    )
