"""What a ``pattern-count`` run reports: the counts table, metrics, headline and privacy notes."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.ldp.patterns import exact_loss, per_user_variance_constant
from rayfed.protocols.base import Outcome
from rayfed.protocols.pattern_count.config import PatternCountConfig
from rayfed.protocols.pattern_count.params import Params


def notes(cfg: PatternCountConfig, params: Params, *, evaluated: bool) -> list[str]:
    loss = exact_loss(params.eps_prime)
    out = [
        f"paper calibration ε'=ε/16: the paper claims ε={cfg.epsilon:g} per party (8ε' per bit); "
        f"the exact loss, reported above, is {loss:.4f}"
        if cfg.calibration == "paper"
        else f"exact calibration ε'=tanh(ε/4)/2 (not in the paper): exact loss {loss:.4f} per party",
        f"a user whose values change at all {len(params.order)} parties: "
        f"ε = {len(params.order) * loss:.4f} (sequential)",
    ]
    if params.outside:
        out.append(
            f"values outside the declared domains were encoded as all-zero: {params.outside}"
        )
    if evaluated:
        out.append(
            "the columns true_count, error and predicted_sd are computed from the raw data outside "
            "the protocol and are not private"
        )
    return out


def outcome(cfg: PatternCountConfig, params: Params, raw: np.ndarray, evaluation) -> Outcome:
    order, labels, patterns = params.order, params.labels, params.patterns
    m, v = params.users, len(order)
    if patterns is None:
        index = np.array(
            list(itertools.product(*(range(len(lab)) for lab in labels))), dtype=np.int64
        ).reshape(-1, v)
        raw = raw.reshape(-1)
    else:
        index = patterns
    c = per_user_variance_constant(params.eps_prime)
    columns: dict[str, Any] = {p: [labels[j][i] for i in index[:, j]] for j, p in enumerate(order)}
    columns["estimate"] = np.maximum(raw, 0.0)
    columns["raw"] = raw
    columns["sd_bound"] = np.full(len(raw), math.sqrt(m * ((c + 1) ** v / cfg.sample_rate - 1)))
    metrics: dict[str, Any] = {
        "users": m,
        "parties": v,
        "patterns": len(raw),
        "eps_prime": params.eps_prime,
        "exact_epsilon_per_party": exact_loss(params.eps_prime),
        "users_sent": params.sent,
        "bits_per_party": {p: len(labels[j]) * params.sent for j, p in enumerate(order)},
    }
    headline = f"{len(raw)} pattern counts over {v} parties and {m:,} users"
    if evaluation is not None:
        true = np.asarray(evaluation.true).reshape(-1)
        sd = np.sqrt(np.asarray(evaluation.variance).reshape(-1))
        columns.update(true_count=true, error=raw - true, predicted_sd=sd)
        metrics.update(
            max_abs_error=float(np.max(np.abs(raw - true))),
            rmse=float(np.sqrt(np.mean((raw - true) ** 2))),
            mean_predicted_sd=float(sd.mean()),
        )
        headline += (
            f"; max |error| {metrics['max_abs_error']:.1f} "
            f"(predicted sd ~{metrics['mean_predicted_sd']:.1f})"
        )
    return Outcome(tables={"counts": pa.table(columns)}, metrics=metrics, headline=headline)
