"""Everything ``secure-sum`` resolves at planning time, handed to the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.dropout import DropoutSchedule
from rayfed.privacy import Clipped
from rayfed.protocols.secure_sum.config import SecureSumConfig
from rayfed.secagg import FixedPoint, SecAggParams, check_params, find_params


@dataclass(frozen=True)
class Evaluation:
    """Ground truth: a data file's raw rows (None for synthetic inputs, which the reference
    regenerates), for the raw and clipped plaintext sums. Never sent to an actor."""

    table: pa.Table | None


@dataclass(frozen=True)
class Params:
    """The sorted user ids (the registry), the neighbour graph and threshold, the fixed-point
    encoding, the vector length, the value columns of a data file (empty: synthetic inputs) and
    the dropout schedule; what the data file's domain check clipped (None: synthetic inputs)."""

    registry: np.ndarray
    secagg: SecAggParams
    encoding: FixedPoint
    dim: int
    columns: list[str]
    #: who drops when: the rates, the lists and the population models, resolved (trace read,
    #: outage cohort named by its users)
    schedule: DropoutSchedule
    #: a data file's values moved into [-clip, clip] (out_of_domain=clip; a count of 0 otherwise)
    clipped: Clipped | None = None
    #: private mean estimation (dp_mechanism != none): the release and its pipeline
    dp: Any = None
    #: private mean estimation: the synthetic rows scaled down to ℓ2 norm clip
    rows_clipped: int = 0


def secagg_params(cfg: SecureSumConfig, n: int) -> SecAggParams:
    """The finder's graph and threshold for ``n`` users against the ``threat_model``'s server, or
    the overrides (the finder's value for the one not given) with their bounds computed."""
    found = find_params(
        n,
        dropout=cfg.tolerated_dropout,
        corrupt=cfg.corrupt_fraction,
        sigma=cfg.sigma,
        eta=cfg.eta,
        graph=cfg.graph,
        threat_model=cfg.threat_model,
    )
    if cfg.degree is None and cfg.threshold is None:
        return found
    return check_params(
        n,
        cfg.degree or found.degree,
        cfg.threshold or found.threshold,
        dropout=cfg.tolerated_dropout,
        corrupt=cfg.corrupt_fraction,
        threat_model=cfg.threat_model,
    )
