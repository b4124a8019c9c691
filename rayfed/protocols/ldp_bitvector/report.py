"""What an ``ldp-bitvector`` run reports: the labels table, metrics, headline and privacy notes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from sklearn.metrics import normalized_mutual_info_score

from rayfed.ldp import bitvector as bv
from rayfed.protocols.base import Outcome
from rayfed.protocols.ldp_bitvector.config import BASELINES, LdpBitvectorConfig
from rayfed.protocols.ldp_bitvector.params import Params
from rayfed.protocols.ldp_bitvector.steps import Clusters

ANCHORS_NOTE = (
    "the anchors are public parameters derived from the run seed (the collector may know "
    "them): the ε above, charged with their k_max, holds all the same; the paper's hiding "
    "of the anchors from the aggregator adds no DP guarantee and is not modelled"
)
VERTICAL_NOTE = (
    "vertical, non-decomposition: every custodian encodes its own attributes; the "
    "collector joins the codes on the record key"
)


def notes(cfg: LdpBitvectorConfig, params: Params, epsilon_per_record: float) -> list[str]:
    """The run's notes; ``epsilon_per_record`` is the declared ε of one record's codes."""
    if cfg.method in BASELINES:
        return [
            f"{cfg.method} is a baseline run by one trusted party on the raw data; it is not "
            "differentially private"
        ]
    if cfg.encoding != "dpbv":
        return [
            f"encoding={cfg.encoding}: no noise, not private (Table III's 'kCluster –' comparator)"
        ]
    eps, k_max = cfg.epsilon, _k_max(params)
    claim = (
        f"the paper claims ({eps:g}, {bv.paper_delta(eps, cfg.bits):.3g})-LDP per value "
        f"(Thm 4, Eq. 10); that δ is wrong: two codes {k_max} bits apart have hockey-stick δ "
        f"{bv.hockey_stick(eps, k_max):.3g} at ε={eps:g}; "
    )
    if params.decomposition:
        # one of Bob's values changes u and v of every pair its record enters: its codes differ
        # in as many bits as the whole record's, so the per-value ε is the per-record one
        pairs = params.records - 1
        claim += (
            f"one of Bob's values enters u and v of all {pairs} pairs of its record, whose codes "
            f"can differ in 2·{pairs}·{k_max} = {2 * pairs * k_max} bits: the guarantee is pure "
            f"{epsilon_per_record:g}-LDP per value of Bob's, the same per record"
        )
    else:
        claim += (
            f"the guarantee is pure {k_max * eps:g}-LDP per value, "
            f"{epsilon_per_record:g} per record"
        )
    out = [claim, ANCHORS_NOTE]
    if cfg.partition == "vertical":
        out.append(VERTICAL_NOTE)
    if params.decomposition:
        out.append(
            "decomposition (Eq. 21–23): Alice's attributes are used exactly, as the analyst's "
            "own data; Bob encodes u and v of every pair, so each of his records is charged "
            f"for {params.records - 1} pairs"
        )
    return out


def _k_max(params: Params) -> int:
    """The most bits two values' codes can differ in: Bob's pair codes' in the decomposition
    (the attribute anchors are not used there), else the attribute codes'."""
    return params.pair_k_max if params.decomposition else params.k_max


def outcome(
    cfg: LdpBitvectorConfig,
    params: Params,
    out: Clusters,
    epsilon_per_record: float,
    truth: np.ndarray | None,
) -> Outcome:
    """``truth``: the records' true labels (for NMI), if the data has them."""
    order = np.argsort(np.asarray(out.records))
    labels = np.asarray(out.labels)[order]
    metrics: dict[str, Any] = {
        "method": cfg.method,
        "encoding": cfg.encoding,
        "records": params.records,
        "dims": params.dims,
        "clusters_found": int(len(set(labels.tolist()) - {-1})),
        "k_max": _k_max(params),
        "paper_delta": bv.paper_delta(cfg.epsilon, cfg.bits),
        "epsilon_per_record": epsilon_per_record,
    }
    how = cfg.method if cfg.method in BASELINES else f"{cfg.method} ({cfg.encoding})"
    headline = f"{how}: {metrics['clusters_found']} clusters over {len(labels):,} records"
    if truth is not None:
        metrics["nmi"] = float(normalized_mutual_info_score(truth, labels))
        headline += f"; NMI {metrics['nmi']:.3f}"
    if params.clipped is not None:
        metrics["clipped"] = params.clipped.count
        if params.clipped.count:
            headline += f"; {params.clipped.statement()}"
    return Outcome(
        tables={"labels": pa.table({"record": np.arange(len(labels)), "cluster": labels})},
        metrics=metrics,
        headline=headline,
    )
