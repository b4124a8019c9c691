"""Planning ``vfl-primitives``: the data (spec §4.1's synthetic data for the task, or a file
split by data.columns) dealt to the servers and, user-level, clipped into the declared bounds;
the checks of the task's family; its parameters and every release (a Measurement from its
domain, the neighbour relation and its mechanism) — before any actor starts.

What a release protects is the task's choice (``neighbours``): by default one user's data at one
server, replaced by anything in the declared bounds (values in [lo, hi], rows of a server's block
in the ℓ2 ball of radius C, labels in [lo, hi]), so every sensitivity is the domain's diameter;
or, with ``neighbours=paper``, the paper's event-level / ν-bounded neighbours (one entry moves by
at most 1, one row, value or label by at most ν), named as such in the statement and headline.
The clustering tasks are user-level already (the paper's neighbours there are a full row in the
ball of radius Δ)."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.clustering.dplsf import dplsf_centers, dplsf_event
from rayfed.data import even_groups, load_table, require_clean, sort_by_key, vertical
from rayfed.data.scaling import features_of
from rayfed.errors import ConfigError, DataError
from rayfed.ldp.patterns import bias, rr_measurement
from rayfed.privacy import (
    Ball,
    Budget,
    Clipped,
    DataDomain,
    Declared,
    Field,
    Gaussian,
    Interval,
    Laplace,
    Measurement,
    Neighbours,
    OneHot,
    PrivacyDeclaration,
    PublicMap,
    Subroutine,
    Unbounded,
    enforce,
    gaussian_noise_multiplier,
)
from rayfed.protocols.base import Plan
from rayfed.protocols.vfl_primitives.config import (
    CLUSTER_TASKS,
    DEFAULT_LABEL_BOUNDS,
    DEFAULT_VALUE_BOUNDS,
    MOMENT_TASKS,
    PATTERN_TASKS,
    SKETCH_TASKS,
    VflPrimitivesConfig,
)
from rayfed.protocols.vfl_primitives.params import (
    ClusteringParams,
    L1Params,
    LpParams,
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
#: user-level: one user's data at one server replaced by any other in the declared domain
USER = Neighbours("replace_one", "user's data", at_one_party=True)
PARALLEL = (
    "each server's messages depend only on its own data (and public values), so the servers' "
    "scopes compose in parallel"
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


def _check_rank_and_clusters(cfg: VflPrimitivesConfig, m: int, d: int) -> None:
    """ConfigError naming ``k`` where the evaluation after the release would have no baseline
    to compare with (checked here, before any budget is spent): k clusters for k or fewer users
    (the non-private cost is 0), or a rank k >= d (A_k = A: the best error is 0)."""
    if cfg.task in ("kmeans", "kmedian") and cfg.k >= m:
        raise ConfigError(
            "k",
            f"{cfg.k} clusters for {m} users: every user can be its own center, so the "
            "non-private cost the result is measured against is 0",
            f"k < {m} (the users), or more users",
        )
    if cfg.task == "lowrank" and cfg.k >= d:
        raise ConfigError(
            "k",
            f"rank {cfg.k} for {d} attributes: the top-{cfg.k} subspace is the whole space "
            "(A_k = A), so there is nothing to estimate and no error to compare",
            f"k < {d} (the attributes), or more dims",
        )


def plan(cfg: VflPrimitivesConfig, seed: int) -> Plan:
    table, groups, label = load_data(cfg, seed)
    raw = table
    table, clipped = enforce_domain(cfg, table, groups, label)
    order = list(groups)
    m = table.num_rows
    _check_rank_and_clusters(cfg, m, sum(len(c) for c in groups.values()))
    relation = relation_of(cfg)
    params = _params(cfg, seed, groups, label, m, relation, clipped)
    _check_pattern_space(cfg, params)
    parties = {
        p: (t, {"columns": groups[p]}) for p, t in vertical(table, groups, cfg.data.key).items()
    }
    if label is not None:
        parties[LABEL_SERVER] = (table.select([label]), {"columns": [label]})
    truth = None
    if cfg.evaluate:
        columns = [c for p in order for c in groups[p]]
        truth = Truth(
            a=features_of(table, columns),
            b=table.column(label).to_numpy().astype(np.float64) if label else None,
            unclipped=features_of(raw, columns) if raw is not table else None,
        )
    gaussian = cfg.task in SKETCH_TASKS
    # a pattern task's counting is a second round, except in non-interactive lp-moment
    two_rounds = cfg.task in PATTERN_TASKS and cfg.interaction == "interactive"
    return Plan(
        privacy=PrivacyDeclaration(
            budget=Budget(cfg.epsilon, cfg.delta if gaussian else 0.0),
            # the user-level Gaussian is calibrated against the tightest accountant; the paper's
            # mode keeps its RDP calibration (results as before, bit for bit)
            accountant=("tightest" if cfg.user_level() else "rdp") if gaussian else "pure",
            relation=relation,
            composition="parallel",
            statement=statement(cfg),
            measurements=measurements(params),
            data=_data_domain(cfg, groups, label, relation),
        ),
        parties=parties,
        rounds=2 if two_rounds else 1,
        evaluation=truth,
        params=params,
    )


# --- what is protected -----------------------------------------------------------------------------
def relation_of(cfg: VflPrimitivesConfig) -> Neighbours:
    """User-level (:data:`USER`), or the paper's bounded move: one entry by 1 (l1/lp-moment),
    one row, value or label by ν (the sketch tasks)."""
    if cfg.user_level():
        return USER
    if cfg.task in ("l1-moment", "lp-moment"):
        return Neighbours(
            "replace_one",
            "user's entry (the paper's event-level neighbours, NOT user-level)",
            at_one_party=True,
            within=1.0,
        )
    what = {"l2-moment": "value", "lowrank": "row", "regression": "row or label"}[cfg.task]
    return Neighbours(
        "replace_one",
        f"user's {what} (the paper's ν-bounded neighbours, NOT user-level)",
        at_one_party=True,
        within=cfg.nu,
    )


def value_bounds(cfg: VflPrimitivesConfig) -> tuple[float, float]:
    """[lo, hi] of a moment task's values (user-level): given, or the task's default."""
    lo, hi = cfg.value_bounds or DEFAULT_VALUE_BOUNDS[cfg.task]
    return (int(lo), int(hi)) if cfg.task != "l2-moment" else (float(lo), float(hi))


def label_bounds(cfg: VflPrimitivesConfig) -> tuple[float, float]:
    lo, hi = cfg.label_bounds or DEFAULT_LABEL_BOUNDS
    return float(lo), float(hi)


def domain_text(cfg: VflPrimitivesConfig) -> str:
    """The declared domain a user-level guarantee holds on, or the paper's move, in a few
    words (the headline's tag)."""
    if not cfg.user_level():
        if cfg.task in ("l1-moment", "lp-moment"):
            return "paper's neighbours, NOT user-level: one entry moves by at most 1"
        what = {"l2-moment": "a value", "lowrank": "a row", "regression": "a row or label"}[
            cfg.task
        ]
        return f"paper's neighbours, NOT user-level: {what} moves by at most ν = {cfg.nu:g}"
    if cfg.task in MOMENT_TASKS:
        lo, hi = value_bounds(cfg)
        return f"user-level: x ∈ [{lo:g}, {hi:g}]"
    if cfg.task in CLUSTER_TASKS:
        return f"user-level: ‖A[i]‖₂ <= Δ = {cfg.radius:g}"
    text = f"user-level: ‖A^(j)[i]‖₂ <= {cfg.row_radius:g}"
    if cfg.task == "regression":
        lo, hi = label_bounds(cfg)
        text += f", b ∈ [{lo:g}, {hi:g}]"
    return text


def statement(cfg: VflPrimitivesConfig) -> str:
    if cfg.baseline == "central":
        return CENTRAL_STATEMENT
    if cfg.user_level():
        clipped = cfg.task not in CLUSTER_TASKS and cfg.out_of_domain == "clip"
        outside = "clipped into it" if clipped else "refused"
        return (
            f"DP in VFL (Def. 1.2), user-level ({domain_text(cfg).split(': ', 1)[1]}, data "
            f"outside {outside}): one user's data at one server replaced by any other in the "
            f"declared domain; {PARALLEL}"
        )
    return (
        f"DP in VFL (Def. 1.2) for the paper's neighbours, NOT user-level "
        f"({domain_text(cfg).split(': ', 1)[1]}): a user whose data moves further is protected "
        f"only at ε times the move over that bound (group privacy); {PARALLEL}"
    )


# --- the data: bounds enforced where it enters --------------------------------------------------
def enforce_domain(
    cfg: VflPrimitivesConfig, table: pa.Table, groups: dict[str, list[str]], label: str | None
) -> tuple[pa.Table, tuple[Clipped, ...]]:
    """User-level tasks with declared bounds: the data clipped into them, counted (or refused,
    ``out_of_domain=refuse``) — every server's values (moments), every server's block of a row
    (lowrank, regression: each server clips its own part), the labels. The servers' tables then
    hold the clipped data, so nothing downstream clips in silence. Other tasks: as given."""
    if not cfg.user_level() or cfg.task in CLUSTER_TASKS:
        return table, ()
    policy, out = cfg.out_of_domain, []
    if cfg.task in MOMENT_TASKS:
        columns = [c for p in groups for c in groups[p]]
        lo, hi = value_bounds(cfg)
        values, clipped = enforce(
            features_of(table, columns),
            Interval(lo, hi),
            policy,
            "data",
            "out_of_domain",
            columns=columns,
            widen="widen value_bounds",
        )
        out.append(clipped)
        if clipped.count:
            table = _replaced(table, columns, values, integral=_integral(lo, hi))
    else:
        for party, cols in groups.items():
            block, clipped = enforce(
                features_of(table, cols),
                Ball(cfg.row_radius, 2, len(cols)),
                policy,
                f"data.columns.{party}",
                "out_of_domain",
                widen="raise row_radius",
            )
            out.append(clipped)
            if clipped.count:  # a row scaled onto the ball: no longer integers
                table = _replaced(table, cols, block, integral=False)
    if label is not None:
        lo, hi = label_bounds(cfg)
        b, clipped = enforce(
            table.column(label).to_numpy().astype(np.float64),
            Interval(lo, hi),
            policy,
            "label",
            "out_of_domain",
            widen="widen label_bounds",
        )
        out.append(clipped)
        if clipped.count:
            table = _replaced(table, [label], b[:, None], integral=_integral(lo, hi))
    return table, tuple(out)


def _integral(lo: float, hi: float) -> bool:
    """An interval clip keeps integers integers when both its bounds are integers."""
    return float(lo).is_integer() and float(hi).is_integer()


def _replaced(
    table: pa.Table, columns: list[str], values: np.ndarray, *, integral: bool
) -> pa.Table:
    """``table`` with ``columns`` holding the clipped ``values``: an integer column stays
    integer only where the clip keeps integers (``integral``: an interval with integer
    bounds), else it becomes float64 — a cast back would truncate the clipped values."""
    for i, col in enumerate(columns):
        kind = table.schema.field(col).type
        column = values[:, i]
        if pa.types.is_integer(kind) and integral:
            array = pa.array(column.astype(np.int64)).cast(kind)
        elif pa.types.is_integer(kind):
            array = pa.array(column.astype(np.float64))
        else:
            array = pa.array(column).cast(kind)
        table = table.set_column(table.schema.get_field_index(col), col, array)
    return table


def _data_domain(
    cfg: VflPrimitivesConfig,
    groups: dict[str, list[str]],
    label: str | None,
    relation: Neighbours,
) -> DataDomain:
    """Where one user's data lives in the servers' tables, and its declared domain (the
    paper's neighbours: unbounded data, a bounded move)."""
    paper = relation.within is not None
    fields = []
    for cols in groups.values():
        if cfg.task in CLUSTER_TASKS:
            domain = Ball(cfg.radius, 2, len(cols))
        elif paper:
            domain = Unbounded(len(cols))
        elif cfg.task in MOMENT_TASKS:
            domain = Interval(*value_bounds(cfg))
        else:
            domain = Ball(cfg.row_radius, 2, len(cols))
        fields.append(Field(tuple(cols), domain))
    if label is not None:
        fields.append(Field((label,), Unbounded() if paper else Interval(*label_bounds(cfg))))
    return DataDomain(tuple(fields), key=cfg.data.key, partition="vertical")


# --- parameters and releases -----------------------------------------------------------------------
def measurements(params: Params) -> tuple[Measurement, ...]:
    """Every release the driver will charge, in the params' order."""
    if isinstance(params, LpParams):
        return (*params.vectors.values(), *params.counting.values())
    if isinstance(params, (L1Params, SketchParams, PerturbationParams)):
        return tuple(params.releases.values())
    assert isinstance(params, ClusteringParams)
    later = (params.central,) if params.central is not None else params.counting.values()
    return (*params.local.values(), *later)


def _params(
    cfg: VflPrimitivesConfig,
    seed: int,
    groups: dict[str, list[str]],
    label: str | None,
    m: int,
    relation: Neighbours,
    clipped: tuple[Clipped, ...],
) -> Params:
    """The task family's parameters and releases; the sketch tasks draw G until it passes
    Lemma E.2's test."""
    order = list(groups)
    d = sum(len(c) for c in groups.values())
    common = dict(order=order, users=m, protects=domain_text(cfg), clipped=clipped)
    if cfg.task in CLUSTER_TASKS:
        return _clustering_params(cfg, groups, relation, common)
    paper = relation.within is not None

    def domain(cols: list[str]):
        """One user's data at one server: its value (moments) or its block of a row."""
        if paper:
            return Unbounded(len(cols))
        if cfg.task in MOMENT_TASKS:
            return Interval(*value_bounds(cfg))
        return Ball(cfg.row_radius, 2, len(cols))

    if cfg.task == "l1-moment":
        releases = {
            p: Measurement(f"{p}: ℓ1 norm + Laplace", Laplace(cfg.epsilon), domain(c), relation)
            for p, c in groups.items()
        }
        return L1Params(**common, releases=releases)
    if cfg.task == "lp-moment":
        return _lp_params(cfg, groups, m, relation, domain, common)
    accountant = "rdp" if paper else "tightest"
    z = gaussian_noise_multiplier(
        cfg.epsilon, cfg.delta, steps=1, relation="replace_one", accountant=accountant
    )
    if cfg.baseline == "input-perturbation":  # no sketch: the rows themselves
        releases = {
            p: Measurement(f"{p}: input perturbation (Gaussian)", Gaussian(z), domain(c), relation)
            for p, c in groups.items()
        }
        sensitivity = releases[order[0]].sensitivity
        return PerturbationParams(
            **common,
            widths=[len(groups[p]) for p in order],
            sensitivity=sensitivity,
            z=z,
            sigma=z * sensitivity,
            releases=releases,
        )
    s = sketch_size(cfg, d)
    attempt, _ = passing_sketch(seed, s, m)
    sketch = PublicMap(
        column_norm_bound(s, m),
        f"the public sketch G (s = {s}), redrawn until every column norm is <= √s + 4√ln m "
        "(Lemma E.2)",
    )
    releases = {
        p: Measurement(f"{p}: Gaussian sketch", Gaussian(z), domain(c), relation, through=sketch)
        for p, c in groups.items()
    }
    label_sigma = None
    if label is not None:
        labels = Unbounded() if paper else Interval(*label_bounds(cfg))
        release = Measurement(
            f"{LABEL_SERVER}: Gaussian sketch of the labels",
            Gaussian(z),
            labels,
            relation,
            through=sketch,
        )
        releases[LABEL_SERVER] = release
        label_sigma = z * release.sensitivity
    sensitivity = releases[order[0]].sensitivity
    return SketchParams(
        **common,
        s=s,
        attempt=attempt,
        sensitivity=sensitivity,
        z=z,
        sigma=z * sensitivity,  # what the Gaussian release adds per entry
        releases=releases,
        label_sigma=label_sigma,
    )


def _clustering_params(cfg, groups, relation, common) -> ClusteringParams:
    """Alg. 3's releases: each server's local clustering (ε/2) of its block, then the pattern
    counting of its labels (ε/2), or the curator's histogram (baseline=central, run-wide)."""
    order = list(groups)
    index = {c: i for i, c in enumerate(c for cols in groups.values() for c in cols)}
    positions = [[index[c] for c in groups[p]] for p in order]
    # DPLSF on the block scaled by 1/Δ into [-1, 1]^d: ε/2 under replace-one neighbours (run at
    # ε/4, its event composed twice: a replacement is a removal and an addition)
    local = {
        p: Measurement(
            f"{p}: local DPLSF (ε/2, replace-one)",
            Subroutine(
                functools.partial(dplsf_centers, epsilon=cfg.epsilon / 2, replace_one=True),
                dplsf_event(cfg.epsilon / 2, len(cols), replace_one=True),
                for_relation="replace_one",
            ),
            Ball(1.0, 2, len(cols)),
            relation,
            declared=Declared(
                1,
                "DPLSF is DP for one point of [-1, 1]^d added or removed (discrete-Laplace tree "
                "counts, Laplace leaf sums of ℓ1 sensitivity d); a replaced user is a removal and "
                "an addition: run at ε/4, charged twice",
            ),
        )
        for p, cols in groups.items()
    }
    if cfg.baseline == "central":
        central = Measurement(
            "central Laplace histogram (trusted curator, ε/2)",
            Laplace(cfg.epsilon / 2),
            OneHot(cfg.k ** len(order)),  # a user's cell of the joint label histogram
            relation,
        )
        return ClusteringParams(
            **common, dims=len(index), positions=positions, local=local, central=central
        )
    eps_prime = bias(cfg.epsilon / 2, cfg.calibration)
    counting = {
        p: rr_measurement(
            f"{p}: pattern counting of the labels (randomized response)", eps_prime, cfg.k, relation
        )
        for p in order
    }
    return ClusteringParams(
        **common,
        dims=len(index),
        positions=positions,
        local=local,
        eps_prime=eps_prime,
        counting=counting,
    )


def _lp_params(cfg, groups, m, relation, domain, common) -> LpParams:
    """Alg. 2's public constants scaled by the per-entry sensitivity (its Laplace noise's unit),
    the pattern bound M — given, or the theorem's, user-level at most hi: no value exceeds it —
    and each server's two releases."""
    vectors = {
        p: Measurement(
            f"{p}: per-entry Laplace (ε/2)", Laplace(cfg.epsilon / 2), domain(c), relation
        )
        for p, c in groups.items()
    }
    unit = vectors[next(iter(groups))].sensitivity
    _, tau, theorem_m = lp_constants(len(groups), m, cfg.epsilon, cfg.alpha, unit)
    big_m = theorem_m if relation.within is not None else min(theorem_m, value_bounds(cfg)[1])
    big_m = cfg.bound or big_m
    eps_prime = bias(cfg.epsilon / 2, cfg.calibration)
    counting = {
        p: rr_measurement(
            f"{p}: pattern counting (randomized response)", eps_prime, big_m + 1, relation
        )
        for p in groups
    }
    return LpParams(
        **common,
        unit=unit,
        tau=tau,
        big_m=big_m,
        theorem_m=theorem_m,
        eps_prime=eps_prime,
        vectors=vectors,
        counting=counting,
    )


def _check_pattern_space(cfg: VflPrimitivesConfig, params: Params) -> None:
    """The CC estimates a count for every pattern: refuse k^v or (M+1)^v above MAX_PATTERNS."""
    v = len(params.order)
    if cfg.task in CLUSTER_TASKS and cfg.k**v > MAX_PATTERNS:
        raise ConfigError(
            "k",
            f"k^v = {cfg.k}^{v} = {cfg.k**v:,} grid cells, above {MAX_PATTERNS:,} (the CC holds "
            "m x k bits per server and k^v counts)",
            "fewer clusters or servers",
        )
    if isinstance(params, LpParams) and (params.big_m + 1) ** v > MAX_PATTERNS:
        size = params.big_m + 1
        hint = "set bound (M) lower: the theorem's M is impractical (spec §2.5)"
        if cfg.user_level() and cfg.bound is None:
            hint = (
                "set bound (M) or value_bounds lower (user-level, M is at most the largest value)"
            )
        raise ConfigError("bound", f"(M+1)^v = {size}^{v} patterns, above {MAX_PATTERNS:,}", hint)


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
    holders = [p for p, cols in groups.items() if label is not None and label in cols]
    if holders:  # the model would predict the label from itself
        raise ConfigError(
            "label",
            f"the label column {label!r} is also a feature (data.columns.{holders[0]})",
            f"drop {label!r} from data.columns.{holders[0]}, or name another label column",
        )
    if label is not None and label == cfg.data.key:
        raise ConfigError(
            "label", f"the label column {label!r} is the key (data.key)", "another label column"
        )
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
