"""The DP VFL primitives beyond pattern counting — Cohen-Addad, Kacham, Mirrokni & Zhong,
"Differentially Private Vertical Federated Learning Primitives" (spec shared/specs/vfl-primitives.md).

One protocol, ``rayfed run vfl-primitives --set task=...``; v parties (servers) hold column blocks
of the same m users, the coordinator (CC) combines their messages. Privacy is DP in VFL (Def. 1.2):
one server's data changes, in one user, so the servers' scopes compose in parallel.

``task``:

* ``l1-moment`` — each server sends ‖x^(j)‖₁ + Lap(1/ε) (App. C); the CC sums.
* ``lp-moment`` — Alg. 2 as written: round 1, x^(j) + Lap(2/ε) per entry; the CC finds the heavy
  coordinates L and the bound M and sends them back (the algorithm is interactive, although the
  paper calls all its algorithms non-interactive); round 2, pattern counting (ε/2) on x^(j) with L
  zeroed. Estimate Σ_{i∈L} y_i^p + Σ_ρ count_ρ (Σρ)^p over patterns with Σρ <= M. At the
  theorem's M the light part's noise is astronomically large (spec §2.5): the result states its
  predicted sd; ``bound`` overrides M to exercise the mechanics.
* ``l2-moment`` — sketch-and-perturb (E.3): G x^(j) + N(0, σ_j²); the CC returns ‖Σ o^(j)‖²/s and the
  estimate debiased by Σσ_j² (the paper's raw estimator carries that bias).
* ``kmeans`` / ``kmedian`` — Alg. 3: each server's (ε/2)-DP clustering (DPLSF) labels its users;
  pattern counting (ε/2) on the labels weighs the k^v product grid; weighted k-means / k-median.
* ``lowrank`` — Alg. 4: the CC takes the top-k right singular vectors of [G A^(1) + N^(1) | …].
* ``regression`` — E.2: a label server adds G b + n; least squares on the noisy sketch, which is a
  sketched ridge regression with λ_j = σ_j² (reported).

The shared Gaussian sketch G (s x m) comes from a public seed and is redrawn until its largest
column norm is at most √s + 4√ln m (Lemma E.2), which bounds a server's ℓ₂ sensitivity by
ν(√s + 4√ln m); σ_j is calibrated with dp-accounting (RDP) for one Gaussian release at (ε, δ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from dp_accounting import dp_event

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.clustering import nearest, product_grid, squared_distances, weighted_kmeans
from rayfed.clustering.dplsf import dplsf, dplsf_event
from rayfed.config import DataConfig, option
from rayfed.data import even_groups, load_table, require_clean, sort_by_key, vertical
from rayfed.data.scaling import features_of
from rayfed.errors import ConfigError, DataError
from rayfed.ldp.patterns import (
    exact_loss,
    keep_probability,
    one_hot,
    per_user_variance_constant,
    rr_event,
)
from rayfed.privacy import (
    Budget,
    binary_randomized_response,
    check_budget,
    gaussian,
    gaussian_event,
    gaussian_noise_multiplier,
    laplace,
    laplace_event,
)
from rayfed.protocols.base import Outcome, Plan, Protocol, reject_inapplicable
from rayfed.protocols.pattern_count.steps import estimate_step

TASKS = ("l1-moment", "lp-moment", "l2-moment", "kmeans", "kmedian", "lowrank", "regression")
SKETCH_TASKS = ("l2-moment", "lowrank", "regression")
PATTERN_TASKS = ("lp-moment", "kmeans", "kmedian")  # count patterns (Alg. 1)
#: options only some tasks read: giving one to another task is an error, not silently ignored
TASK_OPTIONS = {
    "k": ("kmeans", "kmedian", "lowrank"),
    "radius": ("kmeans", "kmedian"),
    "p": ("lp-moment",),
    "bound": ("lp-moment",),
    "counts": ("lp-moment",),
    "alpha": ("lp-moment", *SKETCH_TASKS),
    "calibration": PATTERN_TASKS,
    "delta": SKETCH_TASKS,
    "nu": SKETCH_TASKS,
    "sketch_constant": SKETCH_TASKS,
    "sketch_size": SKETCH_TASKS,
    "label": ("regression",),
}
MAX_PATTERNS = 4_000_000  # (M+1)^v or k^v estimated counts; the CC holds m x pattern-domain bits
LABEL_SERVER = "labels"


@dataclass(frozen=True)
class VflPrimitivesConfig:
    """Options of ``rayfed run vfl-primitives``."""

    task: Literal[TASKS] = option("kmeans", "primitive: " + ", ".join(TASKS))
    epsilon: float = option(1.0, "privacy budget of each server (DP in VFL)", above=0)
    delta: float = option(
        1e-5, "δ of the Gaussian sketch tasks (l2-moment, lowrank, regression)", at_least=0, below=1
    )
    parties: int = option(
        2, "number of servers v (synthetic data, or to deal a file's columns)", at_least=1
    )
    users: int = option(20_000, "synthetic data: number of users m", at_least=1, size=True)
    dims: int | None = option(
        None, "synthetic data: attributes d (default per task: 6/20/10)", at_least=1, size=True
    )
    k: int = option(4, "kmeans/kmedian: clusters; lowrank: rank", at_least=1)
    p: float = option(2.0, "lp-moment: the power p (>= 1)", at_least=1)
    alpha: float = option(
        0.25,
        "accuracy α: lp-moment threshold; sketch size s = C·k/α², C·d/α², C/α²",
        above=0,
        below=1,
    )
    sketch_constant: float = option(1.0, "C of the sketch size", above=0)
    sketch_size: int | None = option(None, "s, overriding C and α", at_least=1, size=True)
    nu: float = option(
        1.0, "ν: how far one user's row (or label) may move (ℓ₂), sketch tasks", above=0
    )
    radius: float = option(
        1.0, "Δ: every user's full row has ‖A[i]‖₂ <= Δ (kmeans, kmedian)", above=0
    )
    bound: int | None = option(
        None, "lp-moment: override the pattern bound M (theorem: huge)", at_least=1
    )
    counts: Literal["clipped", "raw"] = option(
        "clipped", "lp-moment: pattern counts max(0, ·) as Alg. 2 (clipped) or unbiased (raw)"
    )
    calibration: Literal["paper", "exact"] = option(
        "paper", "pattern counting: ε'=ε/16 (paper; true loss ≈ ε/2) or ε'=tanh(ε/4)/2 (exact)"
    )
    label: str | None = option(None, "regression on a data file: the label column")
    evaluate: bool = option(True, "add errors against the non-private answer (not private)")
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        default = type(self)()
        for name, tasks in TASK_OPTIONS.items():
            if self.task not in tasks and getattr(self, name) != getattr(default, name):
                raise ConfigError(name, f"is not used by task={self.task}", f"tasks {tasks}")
        check_budget(self.epsilon, self.delta if self.task in SKETCH_TASKS else 0.0)
        if self.task in SKETCH_TASKS and self.delta <= 0:
            raise ConfigError("delta", "the Gaussian sketch needs δ > 0", "e.g. 1e-5")
        if self.task in ("lp-moment", "kmeans", "kmedian") and self.epsilon >= 8:
            raise ConfigError("epsilon", "pattern counting needs ε' = ε/16 < 1/2", "ε < 8")

    def eps_prime(self, epsilon: float) -> float:
        return epsilon / 16 if self.calibration == "paper" else math.tanh(epsilon / 4) / 2


# --- public arithmetic -----------------------------------------------------------------------------
def sketch_size(cfg: VflPrimitivesConfig, d: int) -> int:
    if cfg.sketch_size is not None:
        return cfg.sketch_size
    scale = {"l2-moment": 1, "lowrank": cfg.k, "regression": d}[cfg.task]
    return max(1, math.ceil(cfg.sketch_constant * scale / cfg.alpha**2))


def column_norm_bound(s: int, m: int) -> float:
    """Lemma E.2: max_i ‖G[:, i]‖₂ <= √s + 4√ln m with probability >= 1 - 1/m."""
    return math.sqrt(s) + 4 * math.sqrt(math.log(max(m, 2)))


def sketch_block(seed: int, attempt: int, s: int, start: int, stop: int) -> np.ndarray:
    """Columns start..stop of the shared sketch G (draw ``attempt``), from the public seed."""
    return rng.stream(seed, "sketch", attempt, ("gaussian-sketch", start)).standard_normal(
        (s, stop - start)
    )


SKETCH_CHUNK = 8192


def sketch_multiply(seed: int, attempt: int, s: int, a: np.ndarray) -> np.ndarray:
    """G·A without holding G: chunk by chunk of users."""
    out = np.zeros((s,) + a.shape[1:])
    for start in range(0, a.shape[0], SKETCH_CHUNK):
        stop = min(start + SKETCH_CHUNK, a.shape[0])
        out += sketch_block(seed, attempt, s, start, stop) @ a[start:stop]
    return out


def passing_sketch(seed: int, s: int, m: int, max_attempts: int = 100) -> tuple[int, float]:
    """The first draw of G whose column norms pass Lemma E.2's test (public and data-independent,
    so redrawing costs no privacy), and its largest column norm."""
    bound = column_norm_bound(s, m)
    for attempt in range(max_attempts):
        largest = max(
            float(
                np.sqrt(
                    (sketch_block(seed, attempt, s, a, min(a + SKETCH_CHUNK, m)) ** 2).sum(0)
                ).max()
            )
            for a in range(0, m, SKETCH_CHUNK)
        )
        if largest <= bound:
            return attempt, largest
    raise ConfigError(
        "sketch_size", f"no sketch passed the column-norm test in {max_attempts} draws"
    )


def lp_constants(v: int, m: int, eps: float, alpha: float) -> tuple[float, float, int]:
    """(B, τ, M) of Alg. 2 made explicit (spec §2.5): B = v(2/ε)ln(100mv), τ = B/α, M = ⌈τ + B⌉."""
    b = v * (2 / eps) * math.log(100 * m * v)
    tau = b / alpha
    return b, tau, math.ceil(tau + b)


def pattern_weights(size: int, v: int, p: float) -> np.ndarray:
    """(Σρ)^p for every pattern ρ in {0..size-1}^v (Alg. 2 sums over all of {0..M}^v)."""
    return np.indices((size,) * v).sum(axis=0).astype(np.float64) ** p


def cost(a: np.ndarray, centers: np.ndarray, p: float, weights: np.ndarray | None = None) -> float:
    """Σ_i w_i · min_c ‖a_i - c‖₂^p."""
    d2 = squared_distances(a, centers).min(axis=1)
    per = d2 if p == 2 else d2 ** (p / 2)
    return float(per.sum() if weights is None else weights @ per)


def weighted_kmedian(
    points: np.ndarray, weights: np.ndarray, k: int, gen: np.random.Generator, iterations: int = 30
) -> np.ndarray:
    """A weighted k-median heuristic: k-means++ start, then Lloyd steps whose center update is the
    weighted geometric median (Weiszfeld iterations)."""
    centers = weighted_kmeans(points, weights, k, gen, n_init=3)
    for _ in range(iterations):
        labels = nearest(points, centers)
        for c in range(k):
            mine = labels == c
            if not (mine.any() and weights[mine].sum() > 0):
                continue
            x, w, z = points[mine], weights[mine], centers[c]
            for _ in range(20):
                dist = np.maximum(np.linalg.norm(x - z, axis=1), 1e-12)
                z = (w / dist) @ x / (w / dist).sum()
            centers[c] = z
    return centers


# --- step functions: servers ----------------------------------------------------------------------
def _matrix(ctx: StepContext) -> np.ndarray:
    return features_of(ctx.table, ctx.meta["columns"])


def l1_step(ctx: StepContext, *, eps: float) -> Message:
    """Server: ‖x^(j)‖₁ + Lap(1/ε) (event-level sensitivity 1)."""
    total = np.array([_matrix(ctx).sum()])
    noisy, event = laplace(ctx.noise, total, l1_sensitivity=1, epsilon=eps)
    return Message("l1_norm", float(noisy[0]), dp_event=event)


def noisy_vector_step(ctx: StepContext, *, eps: float) -> Message:
    """Server (Alg. 2 round 1): y^(j) = x^(j) + Lap(2/ε) per entry (ε/2-DP, event-level)."""
    x = _matrix(ctx)[:, 0]
    noisy, event = laplace(ctx.noise, x, l1_sensitivity=1, epsilon=eps / 2)
    return Message("noisy_vector", noisy, dp_event=event)


def pattern_bits_step(
    ctx: StepContext, heavy: dict | None, *, size: int, eps_prime: float, round: int
) -> Message:
    """Server: one-hot of its per-user value (the local label, or x^(j) with the heavy coordinates L
    zeroed), per-bit randomized response; a value >= size encodes as all-zero."""
    if heavy is None:
        values = ctx.state["labels"]
    else:  # the CC's message: {"coordinator": {"L": ..., ...}}
        values = _matrix(ctx)[:, 0].astype(np.int64)
        values[heavy["coordinator"]["L"]] = 0
    values = np.where(values < size, values, -1)
    bits, event = binary_randomized_response(
        ctx.noise, one_hot(values, size), keep_probability=keep_probability(eps_prime), round=round
    )
    return Message(
        "rr_bits",
        {"bits": np.packbits(bits, axis=1), "users": int(values.size)},
        dp_event=dp_event.SelfComposedDpEvent(event, 2),
    )


def local_cluster_step(ctx: StepContext, *, k: int, eps: float, radius: float) -> Message:
    """Server: (ε)-DP local k-clustering (DPLSF on the block scaled by 1/Δ into [-1, 1], replace-one
    neighbours) and each user's nearest local center as its label."""
    x = _matrix(ctx) / radius
    centers, event, _ = dplsf(ctx.noise, x, k, eps, replace_one=True)
    ctx.state["labels"] = nearest(x, centers)
    return Message("local_centers", centers * radius, dp_event=event)


def sketch_step(ctx: StepContext, *, s: int, attempt: int, z: float, sensitivity: float) -> Message:
    """Server: G A^(j) + N(0, σ²) per entry, σ = z·Δ (the label server: G b + n)."""
    sketch = sketch_multiply(ctx.seed, attempt, s, _matrix(ctx))
    noisy, event = gaussian(ctx.noise, sketch, l2_sensitivity=sensitivity, noise_multiplier=z)
    return Message("noisy_sketch", noisy, dp_event=event)


# --- step functions: the coordinator --------------------------------------------------------------
def heavy_step(
    ctx: StepContext,
    ys: dict[str, np.ndarray],
    *,
    v: int,
    m: int,
    eps: float,
    alpha: float,
    bound: int | None,
    p: float,
) -> Message:
    """CC (Alg. 2): y = Σ y^(j); L = {i : y_i >= τ}; M; the heavy part Σ_{i∈L} y_i^p. Sends L, M."""
    y = np.sum([ys[name] for name in sorted(ys)], axis=0)
    _, tau, big_m = lp_constants(v, m, eps, alpha)
    heavy = np.flatnonzero(y >= tau)
    payload = {
        "L": heavy,
        "M": bound or big_m,
        "theorem_M": big_m,
        "heavy_part": float(np.sum(y[heavy] ** p)),
    }
    return Message("heavy_coordinates", payload, to="parties")


def combine_sketches_step(
    ctx: StepContext,
    sketches: dict[str, np.ndarray],
    *,
    order: list[str],
    task: str,
    k: int,
    s: int,
) -> dict:
    """CC: the sketch tasks' answers from the concatenated noisy sketches."""
    blocks = [np.asarray(sketches[p]) for p in order]
    if task == "l2-moment":
        total = np.sum(blocks, axis=0)
        return {"raw": float((total**2).sum() / s)}
    if task == "lowrank":
        _, _, vt = np.linalg.svd(np.hstack(blocks), full_matrices=False)
        return {"V": vt[:k].T}
    features = np.hstack(blocks)
    labels = np.asarray(sketches[LABEL_SERVER])[:, 0]
    return {"x": np.linalg.lstsq(features, labels, rcond=None)[0]}


# --- data -------------------------------------------------------------------------------------------
DEFAULT_DIMS = {"kmeans": 6, "kmedian": 6, "lowrank": 20, "regression": 10}


def synthetic_data(cfg: VflPrimitivesConfig, seed: int) -> tuple[pa.Table, dict[str, list[str]]]:
    """Spec §4.1's synthetic data for the task, and its column split over the servers."""
    gen = rng.stream(seed, "synthetic", 0, f"vfl-primitives/{cfg.task}")
    m, v = cfg.users, cfg.parties
    cols: dict[str, Any] = {"user_id": np.arange(m, dtype=np.int64)}
    if cfg.task in ("l1-moment", "lp-moment", "l2-moment"):
        for j in range(v):
            if cfg.task == "l2-moment":
                cols[f"x{j}"] = gen.normal(0.0, 1.0, m)
            else:
                x = gen.poisson(2.0, m)
                if j == 0:  # 1 % heavy coordinates on one server
                    heavy = gen.random(m) < 0.01
                    x[heavy] = gen.integers(200, 401, int(heavy.sum()))
                cols[f"x{j}"] = x.astype(np.int64)
        return pa.table(cols), {f"p{j}": [f"x{j}"] for j in range(v)}
    d = cfg.dims or DEFAULT_DIMS[cfg.task]
    if cfg.task in ("kmeans", "kmedian"):
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
    if cfg.task in ("kmeans", "kmedian"):
        a = features_of(table, [c for cols in groups.values() for c in cols])
        worst = float(np.linalg.norm(a, axis=1).max())
        if worst > cfg.radius * (1 + 1e-9):
            raise DataError(
                "radius",
                f"a row has norm {worst:.4g} > Δ = {cfg.radius:g}",
                f"radius >= {worst:.4g}",
            )


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


# --- the protocol -------------------------------------------------------------------------------------
class VflPrimitives(Protocol):
    name = "vfl-primitives"
    summary = (
        "DP VFL primitives: ℓ1/ℓp/ℓ2 moments, k-means/k-median, low-rank approximation, regression"
    )
    Config = VflPrimitivesConfig
    examples = (
        {"users": 2000},
        {"users": 2000, "task": "l1-moment"},
        {"users": 2000, "task": "lp-moment"},
        {"users": 2000, "task": "lowrank"},
        {"users": 2000, "task": "regression"},
    )

    def data_bytes(self, cfg: VflPrimitivesConfig) -> int:
        """The users x d matrix and its per-server copies, and for the sketch tasks the s x d
        noisy sketches and the s-row blocks of the shared sketch G."""
        users = 0 if cfg.data.path is not None else cfg.users
        d = cfg.dims or DEFAULT_DIMS.get(cfg.task, 1)
        s = sketch_size(cfg, d) if cfg.task in SKETCH_TASKS else 0
        return users * d * 8 * 4 + s * (d + 1024) * 8 * (cfg.parties + 1)

    def plan(self, cfg: VflPrimitivesConfig, seed: int) -> Plan:
        reject_inapplicable(cfg, ["label"], ["users", "dims"])
        table, groups, label = load_data(cfg, seed)
        order = list(groups)
        m = table.num_rows
        d = sum(len(c) for c in groups.values())
        index = {c: i for i, c in enumerate(c for cols in groups.values() for c in cols)}
        positions = [[index[c] for c in groups[p]] for p in order]
        info: dict[str, Any] = {"order": order, "users": m, "dims": d, "positions": positions}
        if cfg.task in ("kmeans", "kmedian") and cfg.k ** len(order) > MAX_PATTERNS:
            raise ConfigError(
                "k",
                f"k^v = {cfg.k}^{len(order)} = {cfg.k ** len(order):,} grid cells, above {MAX_PATTERNS:,} (the CC holds m x k bits per server and k^v counts)",
                "fewer clusters or servers",
            )
        if cfg.task == "lp-moment":
            size = (cfg.bound or lp_constants(len(order), m, cfg.epsilon, cfg.alpha)[2]) + 1
            if size ** len(order) > MAX_PATTERNS:
                raise ConfigError(
                    "bound",
                    f"(M+1)^v = {size}^{len(order)} patterns, above {MAX_PATTERNS:,}",
                    "set bound (M) lower: the theorem's M is impractical (spec §2.5)",
                )
        if cfg.task in SKETCH_TASKS:
            s = sketch_size(cfg, d)
            attempt, _ = passing_sketch(seed, s, m)
            z = gaussian_noise_multiplier(cfg.epsilon, cfg.delta, steps=1, relation="replace_one")
            sensitivity = cfg.nu * column_norm_bound(s, m)
            info.update(
                s=s,
                attempt=attempt,
                sensitivity=sensitivity,
                z=z,
                sigma=z * sensitivity,  # what gaussian(noise_multiplier=z) adds
            )
        parties = {
            p: (t, {"columns": groups[p]}) for p, t in vertical(table, groups, cfg.data.key).items()
        }
        if label is not None:
            parties[LABEL_SERVER] = (table.select([label]), {"columns": [label]})
        evaluation = None
        if cfg.evaluate:
            a = features_of(table, [c for p in order for c in groups[p]])
            evaluation = {
                "A": a,
                "b": table.column(label).to_numpy().astype(np.float64) if label else None,
            }
        gaussian = cfg.task in SKETCH_TASKS
        return Plan(
            budget=Budget(cfg.epsilon, cfg.delta if gaussian else 0.0),
            ledger=dict(
                accountant="rdp" if gaussian else "pure",
                relation="replace_one",
                composition="parallel",
                statement="DP in VFL (Def. 1.2): one server's data changes, in one user; each "
                "server's messages depend only on its own data (and public values), so the "
                "servers' scopes compose in parallel",
            ),
            parties=parties,
            rounds=2 if cfg.task in ("lp-moment", "kmeans", "kmedian") else 1,
            evaluation=evaluation,
            info=info,
        )

    def drive(self, fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
        task = cfg.task
        if task == "l1-moment":
            return self._l1(fed, cfg, plan)
        if task == "lp-moment":
            return self._lp(fed, cfg, plan)
        if task in ("kmeans", "kmedian"):
            return self._kcluster(fed, cfg, plan)
        return self._sketch(fed, cfg, plan)

    def _l1(self, fed, cfg, plan) -> Outcome:
        order = plan.info["order"]
        with fed.round(0):
            fed.charge([(p, "ℓ1 norm + Laplace", laplace_event(1, cfg.epsilon)) for p in order])
            norms = fed.get(fed.parties.run(l1_step, eps=cfg.epsilon, phase="l1"))
        estimate = math.fsum(norms.values())
        metrics = {
            "task": "l1-moment",
            "estimate": estimate,
            "predicted_sd": math.sqrt(2 * len(order)) / cfg.epsilon,
        }
        if plan.evaluation is not None:
            metrics["true"] = float(plan.evaluation["A"].sum())
            metrics["error"] = estimate - metrics["true"]
        return Outcome(
            tables={"result": pa.table({"estimate": [estimate]})},
            metrics=metrics,
            headline=f"ℓ1 moment ≈ {estimate:,.1f}",
        )

    def _pc(self, fed, cfg, order, heavy, size: int, eps: float, round: int):
        eps_prime = cfg.eps_prime(eps)
        fed.charge(
            [(p, "pattern counting (randomized response)", rr_event(eps_prime)) for p in order]
        )
        bits = fed.parties.run(
            pattern_bits_step,
            heavy,
            size=size,
            eps_prime=eps_prime,
            round=round,
            phase="pattern-counting",
            members=order,
        )
        counts = fed.one(
            fed.coordinator.run(
                estimate_step,
                bits,
                order=order,
                eps_prime=eps_prime,
                patterns=None,  # every pattern
                sample_rate=1.0,
                phase="counts",
            )
        )
        return np.asarray(counts), eps_prime

    def _lp(self, fed, cfg, plan) -> Outcome:
        order, v, m = plan.info["order"], len(plan.info["order"]), plan.info["users"]
        with fed.round(0):
            fed.charge(
                [(p, "per-entry Laplace (ε/2)", laplace_event(1, cfg.epsilon / 2)) for p in order]
            )
            ys = fed.parties.run(noisy_vector_step, eps=cfg.epsilon, phase="noisy-vectors")
            heavy_reply = fed.coordinator.run(
                heavy_step,
                ys,
                v=v,
                m=m,
                eps=cfg.epsilon,
                alpha=cfg.alpha,
                bound=cfg.bound,
                p=cfg.p,
                phase="heavy",
            )
            heavy = fed.one(heavy_reply)
        with fed.round(1):
            big_m = heavy["M"]
            counts, eps_prime = self._pc(
                fed, cfg, order, heavy_reply, big_m + 1, cfg.epsilon / 2, 1
            )
        weights = pattern_weights(big_m + 1, v, cfg.p)
        used = np.maximum(counts, 0.0) if cfg.counts == "clipped" else counts
        light = float((used * weights).sum())
        estimate = heavy["heavy_part"] + light
        c = per_user_variance_constant(eps_prime)
        predicted_sd = math.sqrt(m * c**v * float((weights**2).sum()))
        fed.note(
            "Alg. 2 is interactive: the CC sends the heavy set L back before round 2 (the paper calls "
            "its algorithms non-interactive); privacy holds by adaptive composition (ε/2 + ε/2)"
        )
        fed.note(
            f"pattern bound M = {big_m} ({'given' if cfg.bound else 'the theorem'}: theorem's M = {heavy['theorem_M']}); predicted sd of the light part {predicted_sd:.3g}"
        )
        fed.note(
            "Thm C.2's explicit bound omits a factor of about the number of patterns (spec §2.5)"
        )
        metrics: dict[str, Any] = {
            "task": "lp-moment",
            "p": cfg.p,
            "estimate": estimate,
            "heavy_part": heavy["heavy_part"],
            "light_part": light,
            "heavy_coordinates": int(len(heavy["L"])),
            "M": big_m,
            "theorem_M": heavy["theorem_M"],
            "light_part_predicted_sd": predicted_sd,
            "exact_epsilon_pattern_counting": exact_loss(eps_prime),
        }
        if plan.evaluation is not None:
            x = plan.evaluation["A"].sum(axis=1)
            true = float((x**cfg.p).sum())
            light_true = (
                float(np.delete(x, heavy["L"]) @ np.delete(x, heavy["L"]) ** (cfg.p - 1))
                if cfg.p != 1
                else float(np.delete(x, heavy["L"]).sum())
            )
            metrics.update(
                true=true, relative_error=(estimate - true) / true, light_part_true=light_true
            )
        return Outcome(
            tables={"result": pa.table({"estimate": [estimate]})},
            metrics=metrics,
            headline=f"ℓ{cfg.p:g} moment ≈ {estimate:.4g}",
        )

    def _kcluster(self, fed, cfg, plan) -> Outcome:
        order, k = plan.info["order"], cfg.k
        p = 2.0 if cfg.task == "kmeans" else 1.0
        with fed.round(0):
            fed.charge(
                [
                    (
                        q,
                        "local DPLSF (ε/2, replace-one)",
                        dplsf_event(cfg.epsilon / 2, len(pos), replace_one=True),
                    )
                    for q, pos in zip(order, plan.info["positions"], strict=True)
                ]
            )
            centers = fed.get(
                fed.parties.run(
                    local_cluster_step,
                    k=k,
                    eps=cfg.epsilon / 2,
                    radius=cfg.radius,
                    phase="local-clustering",
                )
            )
        with fed.round(1):
            counts, eps_prime = self._pc(fed, cfg, order, None, k, cfg.epsilon / 2, 1)
        local = [np.asarray(centers[q]) for q in order]
        grid = product_grid(local, plan.info["positions"], plan.info["dims"])
        weights = np.maximum(counts.reshape(-1), 0.0)
        gen = rng.stream(fed.seed, "clustering", 1, "final")
        final = (
            weighted_kmeans(grid, weights, k, gen)
            if p == 2
            else weighted_kmedian(grid, weights, k, gen)
        )
        metrics: dict[str, Any] = {
            "task": cfg.task,
            "k": k,
            "grid_cells": int(grid.shape[0]),
            "exact_epsilon_pattern_counting": exact_loss(eps_prime),
        }
        if plan.evaluation is not None:
            a = plan.evaluation["A"]
            ref_gen = rng.stream(fed.seed, "clustering", 2, "reference")
            reference = (
                weighted_kmeans(a, np.ones(len(a)), k, ref_gen)
                if p == 2
                else weighted_kmedian(a, np.ones(len(a)), k, ref_gen)
            )
            metrics.update(
                cost=cost(a, final, p),
                cost_nonprivate=cost(a, reference, p),
                cost_ratio=cost(a, final, p) / cost(a, reference, p),
                cost_product_grid=cost(a, grid, p),
            )
        table = pa.table({f"c{i}": final[:, i] for i in range(final.shape[1])})
        headline = f"{cfg.task}: {k} centers from a {grid.shape[0]}-cell product grid"
        if "cost_ratio" in metrics:
            headline += f"; cost / non-private {metrics['cost_ratio']:.3f}"
        return Outcome(tables={"centers": table}, metrics=metrics, headline=headline)

    def _sketch(self, fed, cfg, plan) -> Outcome:
        info = plan.info
        order, s = info["order"], info["s"]
        senders = order + ([LABEL_SERVER] if cfg.task == "regression" else [])
        event = gaussian_event(info["z"])
        with fed.round(0):
            fed.charge([(q, "Gaussian sketch", event) for q in senders])
            sketches = fed.parties.run(
                sketch_step,
                s=s,
                attempt=info["attempt"],
                z=info["z"],
                sensitivity=info["sensitivity"],
                members=senders,
                phase="sketch",
            )
            out = fed.one(
                fed.coordinator.run(
                    combine_sketches_step,
                    sketches,
                    order=order,
                    task=cfg.task,
                    k=cfg.k,
                    s=s,
                    phase="combine",
                )
            )
        sigma = info["sigma"]
        classical = info["sensitivity"] * math.sqrt(2 * math.log(1.25 / cfg.delta)) / cfg.epsilon
        fed.note(
            f"σ = {sigma:.4g} per entry (dp-accounting RDP calibration for one release at (ε, δ)); the paper's classical formula gives {classical:.4g} (valid for ε < 1)"
        )
        metrics: dict[str, Any] = {
            "task": cfg.task,
            "sketch_size": s,
            "sigma": sigma,
            "sensitivity": info["sensitivity"],
            "sketch_draws": info["attempt"] + 1,
        }
        a = plan.evaluation["A"] if plan.evaluation is not None else None
        if cfg.task == "l2-moment":
            debiased = out["raw"] - len(order) * sigma**2
            metrics.update(raw=out["raw"], estimate=debiased, bias_removed=len(order) * sigma**2)
            fed.note(
                "the paper's estimator ‖Σo‖²/s is biased by +Σσ_j²; `estimate` removes it (not in the paper)"
            )
            if a is not None:
                true = float((a.sum(axis=1) ** 2).sum())
                metrics.update(
                    true=true,
                    relative_error=(debiased - true) / true,
                    raw_relative_error=(out["raw"] - true) / true,
                )
            table = pa.table({"raw": [out["raw"]], "estimate": [debiased]})
            headline = f"ℓ2 moment ≈ {debiased:.4g} (raw {out['raw']:.4g})"
        elif cfg.task == "lowrank":
            v_mat = out["V"]
            table = pa.table({f"v{i}": v_mat[:, i] for i in range(v_mat.shape[1])})
            headline = f"top-{cfg.k} right singular vectors from an s={s} sketch"
            if a is not None:
                err = float(np.linalg.norm(a - a @ v_mat @ v_mat.T))
                sv = np.linalg.svd(a, compute_uv=False)
                best = float(np.sqrt((sv[cfg.k :] ** 2).sum()))
                metrics.update(
                    error=err,
                    best_rank_k_error=best,
                    ratio=err / best,
                    excess=err - best,
                    excess_bound=2
                    * sigma
                    * math.sqrt(2 * a.shape[1])
                    / math.sqrt(1 - min(cfg.alpha, 0.99)),
                )
                headline += f"; ‖A - AVVᵀ‖ / ‖A - A_k‖ = {metrics['ratio']:.3f}"
        else:
            x = out["x"]
            lam = sigma**2
            metrics["ridge_lambda"] = lam
            fed.note(
                f"the least squares on the noisy sketch is a sketched ridge regression with λ = σ² = {lam:.4g} (spec §2.9)"
            )
            table = pa.table({"coefficient": x})
            headline = f"regression on an s={s} sketch (ridge-equivalent λ = {lam:.3g})"
            if a is not None:
                b = plan.evaluation["b"]
                opt_x = np.linalg.lstsq(a, b, rcond=None)[0]
                ridge = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ b)
                loss = float(((a @ x - b) ** 2).sum())
                opt = float(((a @ opt_x - b) ** 2).sum())
                metrics.update(
                    loss=loss,
                    opt=opt,
                    loss_ratio=loss / opt,
                    ridge_loss=float(((a @ ridge - b) ** 2).sum()),
                    distance_to_ridge=float(np.linalg.norm(x - ridge) / np.linalg.norm(ridge)),
                    distance_to_ols=float(np.linalg.norm(x - opt_x) / np.linalg.norm(opt_x)),
                )
                headline += f"; loss / OPT {metrics['loss_ratio']:.3f}"
        return Outcome(tables={"result": table}, metrics=metrics, headline=headline)
