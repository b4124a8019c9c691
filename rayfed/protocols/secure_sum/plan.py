"""Planning ``secure-sum``: the users (synthetic ids, or a file's rows) dealt to cohorts, the
neighbour graph, threshold and encoding — checked before any actor starts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayfed.actors.base import StepContext
from rayfed.data import load_table, per_user, require_clean, require_columns
from rayfed.errors import ConfigError, DataError
from rayfed.privacy import Clipped, Interval, PrivacyDeclaration, enforce
from rayfed.protocols.base import Plan
from rayfed.protocols.secure_sum import dp as private
from rayfed.protocols.secure_sum.config import SecureSumConfig
from rayfed.protocols.secure_sum.params import (
    Evaluation,
    Params,
    aggregator_hosts,
    hierarchy_params,
    secagg_params,
)
from rayfed.protocols.secure_sum.report import private_statement, statement
from rayfed.protocols.secure_sum.steps import synthetic_inputs
from rayfed.secagg import FixedPoint, SecAggParams
from rayfed.secagg.client import chunk_rows
from rayfed.sizing import cohorts_adjusted, default_cohorts, default_server_shards

MAX_COMPLETE_BYTES = 4 << 30


def data_bytes(cfg: SecureSumConfig) -> int:
    """Every user's ids, positions, drop codes, keys and shares; synthetic inputs stream (the
    cohorts and the reference generate, encode and mask a chunk of users at a time: a chunk's
    floats, words and temporaries, a few copies), except in private mean estimation, whose rows
    live in the cohorts' tables (float64 and two word arrays per user). The complete graph's
    share tables are checked in plan."""
    if cfg.data.path is not None:
        return 0
    per_user = 512 + (cfg.dim * 8 * 3 if cfg.dp_mechanism != "none" else 0)
    chunk = min(cfg.users, chunk_rows(cfg.dim)) * cfg.dim * 8
    return cfg.users * per_user + 8 * chunk


def plan(cfg: SecureSumConfig, seed: int) -> Plan:
    if cfg.dp_mechanism != "none":
        return _private_plan(cfg, seed)
    table, columns = _users(cfg)
    inside, clipped = _in_domain(cfg, table, columns)
    n = table.num_rows
    dim = len(columns) or cfg.dim
    n_cohorts = default_cohorts(n, cfg.cohorts)
    cohorts = per_user(inside, cfg.data.key or "user_id", n_cohorts)
    key = cfg.data.key or "user_id"
    schedule = cfg.schedule(
        {name: t.column("user_id").to_numpy() for name, t in cohorts.items()},
        (table.column(key).to_numpy(), table) if cfg.data.path is not None else None,
        cfg.rounds,
    )
    registry = np.sort(table.column(key).to_numpy())
    groups, group_secagg, top, hosts = (), (), None, None
    if cfg.hierarchy != "none":
        groups, group_secagg, top = hierarchy_params(cfg, registry)
        if cfg.hierarchy == "secure":
            hosts = aggregator_hosts(cfg, groups, cohorts)
        secagg = group_secagg[0]  # the largest group's (sizes differ by at most one)
        _check_params(cfg, secagg, int(groups[0].size), n_cohorts)
    else:
        secagg = secagg_params(cfg, n)
        _check_params(cfg, secagg, n, n_cohorts)
    encoding = FixedPoint.choose(n, cfg.clip, cfg.frac_bits, cfg.modulus_bits)
    return Plan(
        privacy=PrivacyDeclaration.none(statement(cfg, hosts)),
        cohorts={name: (t, {}) for name, t in cohorts.items()},
        rounds=cfg.rounds,
        inputs=schedule.notes,
        adjusted=cohorts_adjusted(n, cfg.cohorts, n_cohorts),
        cohort_restarts=cfg.rounds,  # a cohort's state lives for one round: restart it
        server_shards=_server_shards(cfg),
        evaluation=Evaluation(table=table if columns else None),  # the raw values: both references
        params=Params(
            registry=registry,
            secagg=secagg,
            encoding=encoding,
            dim=dim,
            columns=columns,
            schedule=schedule,
            clipped=clipped,
            group_registries=groups,
            group_secagg=group_secagg,
            top_secagg=top,
            aggregator_hosts=tuple(hosts or ()),
        ),
    )


def _server_shards(cfg: SecureSumConfig) -> int:
    """The shards of a flat round; a hierarchy's group rounds are served by the coordinator and
    the group aggregators, so shards would start and never be asked anything."""
    if cfg.hierarchy == "none":
        return default_server_shards(cfg.server_shards)
    if cfg.server_shards not in ("auto", 1):
        raise ConfigError(
            "server_shards",
            f"{cfg.server_shards} shards with hierarchy={cfg.hierarchy}: the group rounds do "
            "not run on server shards",
            "server_shards=1 (or auto), or hierarchy=none",
        )
    return 1


def _private_plan(cfg: SecureSumConfig, seed: int) -> Plan:
    """Private mean estimation (:mod:`rayfed.protocols.secure_sum.dp`): the synthetic rows,
    clipped to ℓ2 norm ``clip``, in the cohorts' tables (the declared data the conformance
    suite's neighbours move); every cohort registers its users (a user without a row holds the
    zero row)."""
    n = cfg.users
    ids = np.arange(n, dtype=np.int64)
    secagg = secagg_params(cfg, n)
    n_cohorts = default_cohorts(n, cfg.cohorts)
    _check_params(cfg, secagg, n, n_cohorts)
    dp = private.plan_dp(cfg, n, secagg, cfg.dim, seed)
    ctx = StepContext(name="plan", role="driver", seed=seed)
    x, n_clipped = private.clip_rows(synthetic_inputs(ctx, 0, ids, cfg.dim, cfg.clip), cfg.clip)
    table = private.rows_table(ids, x, dp.columns)
    cohorts = per_user(table, "user_id", n_cohorts)
    schedule = cfg.schedule(
        {name: t.column("user_id").to_numpy() for name, t in cohorts.items()}, rounds=cfg.rounds
    )
    return Plan(
        privacy=private.declaration(cfg, dp, private_statement(cfg, dp)),
        cohorts={
            name: (t, {"users": np.sort(t.column("user_id").to_numpy())})
            for name, t in cohorts.items()
        },
        rounds=cfg.rounds,
        inputs=schedule.notes,
        adjusted=cohorts_adjusted(n, cfg.cohorts, n_cohorts),
        cohort_restarts=cfg.rounds,
        server_shards=default_server_shards(cfg.server_shards),
        evaluation=Evaluation(table=table),
        params=Params(
            registry=ids,
            secagg=secagg,
            encoding=private.encoding(cfg, n, dp),
            dim=cfg.dim,
            columns=[],
            schedule=schedule,
            dp=dp,
            rows_clipped=n_clipped,
        ),
    )


def _users(cfg: SecureSumConfig) -> tuple[pa.Table, list[str]]:
    """(one row per user, the value columns): synthetic ids and no columns, or a data file's rows
    and its numeric columns (``data.columns.values``, default: all but the key)."""
    if cfg.data.path is None:
        return pa.table({"user_id": np.arange(cfg.users, dtype=np.int64)}), []
    if cfg.data.key is None:
        raise ConfigError(
            "data.key",
            "a data file needs the user key column",
            "e.g. --set data.key=user_id",
        )
    table = load_table(cfg.data.path, cfg.data.format)
    require_columns(table, [cfg.data.key], "data.key")
    columns = (cfg.data.columns or {}).get("values") or [
        c for c in table.column_names if c != cfg.data.key
    ]
    require_columns(table, columns, "data.columns.values")
    require_clean(table, columns, "data.columns.values", numeric=True)
    keys = table.column(cfg.data.key).to_numpy()
    if np.unique(keys).size != keys.size:
        raise DataError(
            "data.key", "one row per user is expected", "aggregate the rows per user first"
        )
    return table, columns


def _in_domain(
    cfg: SecureSumConfig, table: pa.Table, columns: list[str]
) -> tuple[pa.Table, Clipped | None]:
    """A data file's values in [-clip, clip], the range the fixed-point encoding holds: refused
    (``out_of_domain=refuse``, a DataError naming the column) or clipped and counted — the users'
    table then holds the clipped values, so nothing downstream clips in silence. Synthetic
    inputs are drawn inside it (None)."""
    if not columns:
        return table, None
    values = np.column_stack([table.column(c).to_numpy() for c in columns])
    largest = float(np.max(np.abs(values))) if values.size else 0.0
    x, clipped = enforce(
        values,
        Interval(-cfg.clip, cfg.clip, len(columns)),
        cfg.out_of_domain,
        field="data",
        option="out_of_domain",
        columns=columns,
        widen=f"set clip >= {largest:g} (the largest |value|; clip is {cfg.clip:g})",
    )
    if not clipped.count:
        return table, clipped  # the values as given, not converted
    for j, c in enumerate(columns):
        table = table.set_column(table.column_names.index(c), c, pa.array(x[:, j]))
    return table, clipped


def _check_params(cfg: SecureSumConfig, params: SecAggParams, n: int, n_cohorts: int) -> None:
    """Weak overrides and complete graphs too large for memory are errors before any actor starts."""
    weak = params.log2_security_failure > -cfg.sigma or params.log2_correctness_failure > -cfg.eta
    if weak and not cfg.allow_weak_params:
        field = "threshold" if cfg.threshold is not None else "degree"
        raise ConfigError(
            field,
            f"degree {params.degree} / threshold {params.threshold} miss the bounds: "
            f"log2 P[security failure] = {params.log2_security_failure:.1f} (need <= -{cfg.sigma:g}), "
            f"log2 P[abort] = {params.log2_correctness_failure:.1f} (need <= -{cfg.eta:g})",
            "drop the override"
            + (
                " (threat_model=malicious admits no weak setting)"
                if cfg.threat_model == "malicious"
                else ", or set allow_weak_params=true to measure a weak setting"
            ),
        )
    if params.complete and cfg.mode in ("secure", "simulation"):
        per_cohort = -(-n // n_cohorts) * n * 13 * 8 * 2
        if per_cohort > MAX_COMPLETE_BYTES:
            raise ConfigError(
                "graph",
                f"the complete graph with {n:,} users needs ~{per_cohort / 2**30:.1f} GiB of "
                "Shamir shares per cohort",
                f"at most {MAX_COMPLETE_BYTES >> 30} GiB: graph=harary, "
                "more cohorts, or fewer users",
            )
