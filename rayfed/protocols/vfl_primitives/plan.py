"""Planning ``vfl-primitives``: the data (spec §4.1's synthetic data for the task, or a file
split by data.columns) dealt to the servers, the checks of the task's family, its parameters and
the budget — before any actor starts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.data import even_groups, load_table, require_clean, sort_by_key, vertical
from rayfed.data.scaling import features_of
from rayfed.errors import ConfigError, DataError
from rayfed.privacy import Budget, Neighbours, PrivacyDeclaration, gaussian_noise_multiplier
from rayfed.protocols.base import Plan
from rayfed.protocols.vfl_primitives.config import (
    CLUSTER_TASKS,
    PATTERN_TASKS,
    SKETCH_TASKS,
    VflPrimitivesConfig,
)
from rayfed.protocols.vfl_primitives.params import (
    ClusteringParams,
    Params,
    PerturbationParams,
    SketchParams,
    Truth,
    column_norm_bound,
    lp_constants,
    sketch_size,
)
from rayfed.protocols.vfl_primitives.sketches import LABEL_SERVER, passing_sketch

MAX_PATTERNS = 4_000_000  # (M+1)^v or k^v estimated counts; the CC holds m x pattern-domain bits
DEFAULT_DIMS = {"kmeans": 6, "kmedian": 6, "lowrank": 20, "regression": 10}
STATEMENT = (
    "DP in VFL (Def. 1.2): one server's data changes, in one user; each server's messages depend "
    "only on its own data (and public values), so the servers' scopes compose in parallel"
)
CENTRAL_STATEMENT = (
    "central DP with a TRUSTED CURATOR (baseline=central, spec §4.4): one server's data changes, "
    "in one user; the servers' local centers are DP, but they send their labels in the clear to "
    "the CC, whose Laplace histogram (run-wide scope) is DP — the servers' messages are not, so "
    "this is not DP in VFL"
)


def data_bytes(cfg: VflPrimitivesConfig) -> int:
    """The users x d matrix and its per-server copies, and for the sketch tasks the s x d
    noisy sketches and the s-row blocks of the shared sketch G."""
    users = 0 if cfg.data.path is not None else cfg.users
    d = cfg.dims or DEFAULT_DIMS.get(cfg.task, 1)
    s = sketch_size(cfg, d) if cfg.task in SKETCH_TASKS else 0
    return users * d * 8 * 4 + s * (d + 1024) * 8 * (cfg.parties + 1)


def plan(cfg: VflPrimitivesConfig, seed: int) -> Plan:
    table, groups, label = load_data(cfg, seed)
    order = list(groups)
    m = table.num_rows
    _check_pattern_space(cfg, len(order), m)
    params = _params(cfg, seed, groups, m)
    parties = {
        p: (t, {"columns": groups[p]}) for p, t in vertical(table, groups, cfg.data.key).items()
    }
    if label is not None:
        parties[LABEL_SERVER] = (table.select([label]), {"columns": [label]})
    truth = None
    if cfg.evaluate:
        truth = Truth(
            a=features_of(table, [c for p in order for c in groups[p]]),
            b=table.column(label).to_numpy().astype(np.float64) if label else None,
        )
    gaussian = cfg.task in SKETCH_TASKS
    # a pattern task's counting is a second round, except in non-interactive lp-moment
    two_rounds = cfg.task in PATTERN_TASKS and cfg.interaction == "interactive"
    return Plan(
        privacy=PrivacyDeclaration(
            budget=Budget(cfg.epsilon, cfg.delta if gaussian else 0.0),
            accountant="rdp" if gaussian else "pure",
            relation=Neighbours("replace_one", "user's data", at_one_party=True),
            composition="parallel",
            statement=CENTRAL_STATEMENT if cfg.baseline == "central" else STATEMENT,
        ),
        parties=parties,
        rounds=2 if two_rounds else 1,
        evaluation=truth,
        params=params,
    )


def _params(cfg: VflPrimitivesConfig, seed: int, groups: dict[str, list[str]], m: int) -> Params:
    """The task family's parameters; the sketch tasks draw G until it passes Lemma E.2's test."""
    order = list(groups)
    d = sum(len(c) for c in groups.values())
    if cfg.task in CLUSTER_TASKS:
        index = {c: i for i, c in enumerate(c for cols in groups.values() for c in cols)}
        positions = [[index[c] for c in groups[p]] for p in order]
        return ClusteringParams(order=order, users=m, dims=d, positions=positions)
    if cfg.task not in SKETCH_TASKS:
        return Params(order=order, users=m)
    z = gaussian_noise_multiplier(cfg.epsilon, cfg.delta, steps=1, relation="replace_one")
    if cfg.baseline == "input-perturbation":  # no sketch: the rows themselves, sensitivity ν
        return PerturbationParams(
            order=order,
            users=m,
            widths=[len(groups[p]) for p in order],
            sensitivity=cfg.nu,
            z=z,
            sigma=z * cfg.nu,
        )
    s = sketch_size(cfg, d)
    attempt, _ = passing_sketch(seed, s, m)
    sensitivity = cfg.nu * column_norm_bound(s, m)
    return SketchParams(
        order=order,
        users=m,
        s=s,
        attempt=attempt,
        sensitivity=sensitivity,
        z=z,
        sigma=z * sensitivity,  # what gaussian(noise_multiplier=z) adds
    )


def _check_pattern_space(cfg: VflPrimitivesConfig, v: int, m: int) -> None:
    """The CC estimates a count for every pattern: refuse k^v or (M+1)^v above MAX_PATTERNS."""
    if cfg.task in CLUSTER_TASKS and cfg.k**v > MAX_PATTERNS:
        raise ConfigError(
            "k",
            f"k^v = {cfg.k}^{v} = {cfg.k**v:,} grid cells, above {MAX_PATTERNS:,} (the CC holds "
            "m x k bits per server and k^v counts)",
            "fewer clusters or servers",
        )
    if cfg.task == "lp-moment":
        size = (cfg.bound or lp_constants(v, m, cfg.epsilon, cfg.alpha)[2]) + 1
        if size**v > MAX_PATTERNS:
            raise ConfigError(
                "bound",
                f"(M+1)^v = {size}^{v} patterns, above {MAX_PATTERNS:,}",
                "set bound (M) lower: the theorem's M is impractical (spec §2.5)",
            )


# --- data ------------------------------------------------------------------------------------------
def synthetic_data(cfg: VflPrimitivesConfig, seed: int) -> tuple[pa.Table, dict[str, list[str]]]:
    """Spec §4.1's synthetic data for the task, and its column split over the servers."""
    gen = rng.stream(seed, "synthetic", 0, f"vfl-primitives/{cfg.task}")
    m, v = cfg.users, cfg.parties
    cols: dict[str, np.ndarray] = {"user_id": np.arange(m, dtype=np.int64)}
    if cfg.task in ("l1-moment", "lp-moment", "l2-moment"):
        for j in range(v):
            cols[f"x{j}"] = _moment_column(cfg.task, gen, m, heavy=j == 0)
        return pa.table(cols), {f"p{j}": [f"x{j}"] for j in range(v)}
    d = cfg.dims or DEFAULT_DIMS[cfg.task]
    if cfg.task in CLUSTER_TASKS:
        centers = gen.uniform(-1, 1, (cfg.k, d))
        a = centers[gen.integers(0, cfg.k, m)] + gen.normal(0, 0.15, (m, d))
        a *= cfg.radius / np.linalg.norm(a, axis=1).max()
    elif cfg.task == "lowrank":
        a = gen.normal(0, 1, (m, cfg.k)) @ gen.normal(0, 1, (cfg.k, d)) + gen.normal(0, 0.3, (m, d))
        a /= np.linalg.norm(a, axis=1).max()
    else:
        a = gen.normal(0, 1, (m, d))
        a /= np.linalg.norm(a, axis=1).max()
        b = np.clip(a @ gen.normal(0, 3, d) + gen.normal(0, 0.1, m), -1, 1)
        cols["y"] = b
    names = [f"a{i}" for i in range(d)]
    cols.update({name: a[:, i] for i, name in enumerate(names)})
    return pa.table(cols), even_groups(names, v)


def _moment_column(task: str, gen: np.random.Generator, m: int, *, heavy: bool) -> np.ndarray:
    """One server's x^(j): N(0, 1) for l2-moment; else Poisson(2) counts, with 1 % heavy
    coordinates (200..400) on the first server."""
    if task == "l2-moment":
        return gen.normal(0.0, 1.0, m)
    x = gen.poisson(2.0, m)
    if heavy:
        chosen = gen.random(m) < 0.01
        x[chosen] = gen.integers(200, 401, int(chosen.sum()))
    return x.astype(np.int64)


def load_data(
    cfg: VflPrimitivesConfig, seed: int
) -> tuple[pa.Table, dict[str, list[str]], str | None]:
    """(table, server -> columns, label column or None)."""
    if cfg.data.path is None:
        table, groups = synthetic_data(cfg, seed)
        return table, groups, "y" if cfg.task == "regression" else None
    if cfg.data.columns is None:
        raise ConfigError(
            "data.columns", "name each server's columns", "e.g. {p0: [a, b], p1: [c]}"
        )
    table = sort_by_key(load_table(cfg.data.path, cfg.data.format), cfg.data.key)
    groups = {p: list(c) for p, c in cfg.data.columns.items()}
    label = cfg.label
    if cfg.task == "regression" and label is None:
        raise ConfigError("label", "regression needs the label column", "e.g. --set label=y")
    if label is not None and label not in table.column_names:
        raise DataError("label", f"column {label!r} is not in the data", table.column_names)
    vertical(table, groups, cfg.data.key)  # checks the columns exist and are disjoint
    require_clean(
        table,
        [c for cols in groups.values() for c in cols] + ([label] if label else []),
        numeric=True,
    )
    _check_file_values(cfg, table, groups)
    return table, groups, label


def _check_file_values(
    cfg: VflPrimitivesConfig, table: pa.Table, groups: dict[str, list[str]]
) -> None:
    for party, cols in groups.items():
        for col in cols:
            if not pa.types.is_integer(table.column(col).type) and not pa.types.is_floating(
                table.column(col).type
            ):
                raise DataError(
                    f"data.columns.{party}",
                    f"column {col!r} is not numeric",
                    "numeric columns only",
                )
    if cfg.task in ("l1-moment", "lp-moment"):
        for party, cols in groups.items():
            if len(cols) != 1:
                raise ConfigError(
                    f"data.columns.{party}", "a moment task takes one column per server"
                )
            x = table.column(cols[0]).to_numpy()
            if (x < 0).any() or not np.all(x == np.round(x)):
                raise DataError(
                    f"data.columns.{party}", f"{cols[0]!r} must hold non-negative integers"
                )
    if cfg.task in CLUSTER_TASKS:
        a = features_of(table, [c for cols in groups.values() for c in cols])
        worst = float(np.linalg.norm(a, axis=1).max())
        if worst > cfg.radius * (1 + 1e-9):
            raise DataError(
                "radius",
                f"a row has norm {worst:.4g} > Δ = {cfg.radius:g}",
                f"radius >= {worst:.4g}",
            )
