"""Everything ``secure-sum`` resolves at planning time, handed to the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.dropout import DropoutSchedule
from rayfed.errors import ConfigError
from rayfed.privacy import Clipped
from rayfed.protocols.secure_sum.config import SecureSumConfig
from rayfed.secagg import FixedPoint, SecAggParams, check_params, find_params
from rayfed.secagg.hierarchy import place_aggregators, split_groups


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
    #: hierarchy=revealed|secure: each group's registry (contiguous runs of ``registry``) and its
    #: graph and threshold from the finder for its size; the aggregators' second sum (secure)
    group_registries: tuple = ()
    group_secagg: tuple = ()
    top_secagg: SecAggParams | None = None
    #: hierarchy=secure: group g's aggregator runs on cohort ``aggregator_hosts[g]``
    aggregator_hosts: tuple = ()


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


def hierarchy_params(cfg: SecureSumConfig, registry: np.ndarray):
    """``hierarchy``'s groups (contiguous, sizes as equal as possible), each one's parameters from
    the finder for its own size (a size the finder cannot serve is a ConfigError naming
    ``groups``), and the aggregators' second sum: a complete graph over the G aggregators, which
    the trust model assumes online and colluding with nobody (no dropout, no corrupt share)."""
    groups = split_groups(registry, cfg.groups)
    by_size: dict[int, SecAggParams] = {}
    for g in groups:
        if g.size not in by_size:
            try:
                by_size[g.size] = secagg_params(cfg, int(g.size))
            except ConfigError as err:
                raise ConfigError(
                    "groups",
                    f"a group of {g.size} users has no SecAgg parameters ({err})",
                    "fewer groups (larger groups), or hierarchy=none",
                ) from err
    top = None
    if cfg.hierarchy == "secure":
        top = find_params(cfg.groups, dropout=0.0, corrupt=0.0, graph="complete")
    return tuple(groups), tuple(by_size[g.size] for g in groups), top


def aggregator_hosts(cfg: SecureSumConfig, groups, cohorts: dict) -> list[str]:
    """``hierarchy=secure``: each group's aggregator on a cohort holding none of its users, a
    different cohort per group (:func:`~rayfed.secagg.hierarchy.place_aggregators`); ConfigError
    naming ``groups`` when the cohorts allow no such placement."""
    holders = {name: t.column("user_id").to_numpy() for name, t in cohorts.items()}
    try:
        return place_aggregators(groups, holders)
    except ValueError as err:
        raise ConfigError(
            "groups",
            f"{cfg.groups} groups over {len(holders)} cohorts leave an aggregator no cohort of its "
            f"own holding none of its group's users ({err})",
            f"more cohorts (e.g. cohorts={cfg.groups + 2}), or fewer groups",
        ) from err
