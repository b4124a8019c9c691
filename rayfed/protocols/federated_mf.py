"""Federated matrix factorisation with DP — LFL-SGDMF (spec federated-mf.md §2.7–2.9, §3.2).

Cross-device setting: every rating row owner is a simulated user hosted in a cohort actor; the
coordinator is the server and owns the item embeddings V (m x p). One run:

1. Stage 1 — the server initialises V in 𝒱 and broadcasts it; each user initialises u_i in 𝒰 and
   pre-trains it on its own training ratings with V fixed (local, no noise).
2. Stage 2 — T iterations. Round 1: each online user samples one of its ratings j, forms the
   gradient row G_i[j] = -2 (X_ij - ⟨u_i, v_j⟩) u_i (‖G_i‖ <= 2R^{3/2}), adds a dense Gaussian
   share ξ_i ~ N(0, ζ1 σ_v² I_{m·p}) and submits G_i + ξ_i through real secure aggregation
   (rayfed.secagg) with t = ⌈(1-ω)n⌉; an iteration with fewer survivors is skipped and releases
   nothing. Round 2: each Round-1 survivor still online sends ξ̄_i = -ξ_i + ξ'_i,
   ξ'_i ~ N(0, ζ2 σ_v²), ζ2 from |U1|. The server updates V <- Π_𝒱(V - γ/|U1| (S1 + β N2)).
3. Stage 3 — each user fine-tunes u_i against the final V (local, unpublished).

Privacy, honestly (spec §2.9): the server sees S1 and N2 separately, and the best estimate of the
gradient sum from both has noise variance F_eff σ_v², F_eff = |U2| ζ1ζ2/(ζ1+ζ2) + (|U1|-|U2|) ζ1.

* ``faithful`` — the thesis: ζ1 = 1/((1-ω)n), ζ2 = 1/|U1|, β = 1. F_eff can fall to 1/2, so the
  guarantee is weaker than the nominal ε the thesis claims; the ledger charges the worst case
  before every iteration and the result states both the nominal and the effective ε.
* ``corrected`` (default) — ζ1 = 2/((1-ω)n), ζ2 = 2/|U1|, β = ζ1/(ζ1+ζ2): F_eff >= 1 always, so
  the nominal (ε, δ) holds.

σ_v = z·Δ with Δ = 2R^{3/2} (one rating per user per iteration, "dummy row" adjacency: per-user
privacy) and z calibrated with dp-accounting for T Gaussian releases at the target (ε, δ).
Baselines (``method``): ``ldp`` (each device adds the full σ_v² itself), ``stage1`` (pre-training
only, V at its initialisation), ``central`` (non-private central SGD on the pooled ratings).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa
from dp_accounting import dp_event

from rayfed import mf, rng
from rayfed.actors.base import Message, StepContext
from rayfed.config import DataConfig, option
from rayfed.data import per_user
from rayfed.dropout import DropoutSchedule
from rayfed.errors import BelowThreshold, ConfigError
from rayfed.privacy import (
    Budget,
    check_budget,
    distributed_gaussian,
    distributed_gaussian_event,
    distributed_variance,
    gaussian,
    gaussian_noise_multiplier,
    share_noise,
)
from rayfed.protocols.base import Outcome, Plan, Protocol, reconcile_randomness
from rayfed.secagg import FixedPoint, find_params, make_spec, secure_sum
from rayfed.sizing import default_cohorts


@dataclass(frozen=True)
class FederatedMFConfig:
    """Options of ``rayfed run federated-mf``."""

    setting: Literal["lfl", "vfl", "hfl"] = option(
        "lfl",
        "lfl: one simulated user per rating-row owner; vfl: parties hold disjoint item sets; "
        "hfl: parties hold disjoint user sets",
    )
    method: Literal["lfl", "ldp", "stage1", "central", "vfl", "hfl", "local"] | None = option(
        None,
        "default: the setting's own algorithm. lfl: ldp (LDP-level noise), stage1 (pre-training only); "
        "vfl: local (each party alone, with DP); hfl: local (non-private local SGD); any: central",
    )
    mode: Literal["corrected", "faithful"] = option(
        "corrected",
        "LFL: corrected (the spec's fix, nominal ε holds) or faithful (the thesis; ε is larger)",
    )
    epsilon: float = option(
        1.0, "target ε (per user, or per rating in VFL/HFL with privacy_unit=rating)", above=0
    )
    delta: float | None = option(None, "δ (default 1/number of ratings)", above=0, below=1)
    iterations: int = option(
        10, "T, server iterations (the spec uses 10 for LFL, 100 for VFL/HFL)", at_least=1
    )
    rank: int = option(10, "embedding dimension p", at_least=1, size=True)
    bound: float = option(
        5.0, "R: rows are clipped to ‖x‖² <= R (ratings must lie in [0, R])", above=0
    )
    pretrain_steps: int = option(
        50, "LFL/HFL Stage 1: local gradient steps on the user embeddings", at_least=0
    )
    finetune_steps: int = option(
        50,
        "LFL/HFL: local, unpublished Stage-3 steps; VFL: κ noisy steps on V_Fk (published, charged)",
        at_least=0,
    )
    local_lr: float = option(
        0.05, "LFL/HFL: learning rate of the local (non-private) steps", above=0
    )
    omega: float = option(
        0.3, "LFL: ω, tolerated dropout fraction; threshold t = ceil((1-ω) n)", at_least=0, below=1
    )
    dropout: float = option(
        0.0,
        "LFL: actual dropout rate per iteration, in each of the two rounds",
        at_least=0,
        below=1,
    )
    lr: float = option(
        2.0, "LFL: γ, server learning rate of V (the update is divided by |U1|)", above=0
    )
    secagg_mode: Literal["secure", "simulation", "dealer"] = option(
        "simulation",
        "LFL: secure aggregation mode for Round 1 (only secure protects against the server; it "
        "makes the run randomness=secure, and a secure run makes simulation secure)",
    )
    cohorts: int | None = option(
        None, "LFL: user-cohort actors (default: this machine's CPUs)", at_least=1
    )
    parties: int = option(2, "VFL/HFL: parties s (items, resp. users, dealt at random)", at_least=1)
    local_steps: int = option(10, "VFL/HFL: T', local DP-SGD steps between averages", at_least=1)
    sampling_rate: float = option(
        0.01, "VFL/HFL: η, Poisson user-level sampling rate per local step", above=0, at_most=1
    )
    privacy_unit: Literal["rating", "user"] | None = option(
        None, "VFL/HFL: per-rating or per-user privacy (default: VFL rating, HFL user; spec §7.8)"
    )
    trim: int | None = option(
        None,
        "VFL/HFL per-user: ratings kept per user and party (default VFL 5, HFL 10)",
        at_least=1,
    )
    split_column: str | None = option(
        None,
        "VFL: a column of the ratings file; each of its values is one party's item set (e.g. genre)",
    )
    vfl_lr: float = option(
        0.05, "VFL/HFL: learning rate of the local DP-SGD steps (constant)", above=0
    )
    users: int = option(2000, "synthetic data: users", at_least=1, size=True)
    items: int = option(200, "synthetic data: items", at_least=1, size=True)
    density: float = option(
        0.05, "synthetic data: fraction of observed ratings", above=0, at_most=1
    )
    test_fraction: float = option(
        0.1, "held-out fraction of each user's ratings", above=0, at_most=1
    )
    data: DataConfig = field(
        default_factory=DataConfig, metadata={"help": "ratings file (user, item, rating)"}
    )

    def validate(self) -> None:
        check_budget(self.epsilon, self.delta if self.delta is not None else 1e-6)
        self._reject_inapplicable()

    def _reject_inapplicable(self) -> None:
        """An option the setting ignores, set to a non-default value, is an error."""
        lfl_only = ("mode", "omega", "dropout", "lr", "secagg_mode", "cohorts")
        partitioned_only = (
            "parties",
            "local_steps",
            "sampling_rate",
            "privacy_unit",
            "trim",
            "vfl_lr",
        )
        ignored = partitioned_only + ("split_column",) if self.setting == "lfl" else lfl_only
        if self.setting == "hfl":
            ignored += ("split_column",)
        default = FederatedMFConfig()
        for name in ignored:
            if getattr(self, name) != getattr(default, name):
                raise ConfigError(name, f"does not apply to setting={self.setting}", "drop it")
        if self.split_column is not None and self.parties != default.parties:
            raise ConfigError(
                "parties", "the parties come from split_column's values", "drop parties"
            )

    def resolved_method(self) -> str:
        return self.method or self.setting

    def resolved_unit(self) -> str:
        return self.privacy_unit or ("user" if self.setting in ("hfl", "lfl") else "rating")

    def resolved_trim(self) -> int:
        return self.trim or (10 if self.setting == "hfl" else 5)


def threshold(n: int, omega: float) -> int:
    """t = ⌈(1-ω)n⌉ computed exactly (a float product like 0.3·1000 is not exact)."""
    from fractions import Fraction

    return math.ceil((1 - Fraction(str(omega))) * n)


# --- the maths of one LFL iteration (pure) -----------------------------------------------------------
def noise_shares(
    mode: str, method: str, n: int, omega: float, u1: int
) -> tuple[float, float, float]:
    """(ζ1, ζ2, β) in units of σ_v² (spec §2.7, §2.9)."""
    if method == "ldp":
        return 1.0, 0.0, 0.0  # every device adds the full σ_v²; no replacement round
    base = 1.0 / ((1.0 - omega) * n)
    if mode == "faithful":
        return base, 1.0 / u1, 1.0
    z1, z2 = 2.0 * base, 2.0 / u1
    return z1, z2, z1 / (z1 + z2)


def effective_variance(zeta1: float, zeta2: float, u1: int, u2: int) -> float:
    """F_eff: noise variance (units of σ_v²) of the server's best estimate from S1 and N2."""
    if zeta2 == 0:
        return u1 * zeta1
    return u2 * zeta1 * zeta2 / (zeta1 + zeta2) + (u1 - u2) * zeta1


def worst_case_variance(mode: str, method: str, n: int, omega: float) -> float:
    """min F_eff over every outcome the protocol accepts (|U1| >= t, |U2| <= |U1|), reached at
    |U1| = |U2| = t: the F the charged event (the distributed Gaussian's) is built from."""
    t = threshold(n, omega)
    z1, z2, _ = noise_shares(mode, method, n, omega, t)
    return distributed_variance(share=z1, quorum=t, replacement=z2)


def round1_noise(
    mode: str, method: str, n: int, omega: float, z: float, sensitivity: float
) -> dict[str, float]:
    """Round 1's distributed Gaussian (:func:`rayfed.privacy.distributed_gaussian`): ζ1 per user,
    quorum t, and the Round-2 replacement ζ2 at the worst accepted outcome |U1| = |U2| = t."""
    t = threshold(n, omega)
    zeta1, zeta2, _ = noise_shares(mode, method, n, omega, t)
    return dict(z=z, sensitivity=sensitivity, zeta1=zeta1, quorum=t, zeta2=zeta2)


def round1_event(noise: dict[str, float]) -> dp_event.GaussianDpEvent:
    """The event charged per iteration; Round 1's mechanism returns the same (one formula)."""
    return distributed_gaussian_event(
        noise["z"], share=noise["zeta1"], quorum=noise["quorum"], replacement=noise["zeta2"]
    )


# --- cohort steps ----------------------------------------------------------------------------------
def _user_ratings(ctx: StepContext, split: str):
    t = ctx.table
    keep = np.asarray(t.column("split").to_numpy(zero_copy_only=False)) == split
    return (
        t.column("user_id").to_numpy()[keep],
        t.column("item").to_numpy()[keep],
        t.column("rating").to_numpy()[keep],
    )


def _local_descent(ctx: StepContext, v: np.ndarray, steps: int, lr: float, bound: float) -> None:
    """Gradient steps on each user's u_i with V fixed, averaged over the user's own ratings, Π_𝒰."""
    ids = ctx.state["ids"]
    users, items, ratings = _user_ratings(ctx, "train")
    rows = np.searchsorted(ids, users)
    counts = np.maximum(np.bincount(rows, minlength=ids.size), 1)[:, None]
    u = ctx.state["u"]
    for _ in range(steps):
        resid = ratings - np.einsum("ij,ij->i", u[rows], v[items])
        grad = np.zeros_like(u)
        np.add.at(grad, rows, -2.0 * resid[:, None] * v[items])
        u = mf.project(u - lr * grad / counts, bound)
    ctx.state["u"] = u


def pretrain_step(
    ctx: StepContext, v: np.ndarray, p: int, mean: float, steps: int, lr: float, bound: float
) -> int:
    """Stage 1: initialise u_i (keyed per user) and pre-train it locally with V fixed."""
    ids = np.unique(ctx.table.column("user_id").to_numpy())
    ctx.state["ids"] = ids
    ctx.state["u"] = mf.project(
        rng.keyed_uniform(ctx.seed, "init", 0, ids, p) * 2 * np.sqrt(mean / p), bound
    )
    _local_descent(ctx, v, steps, lr, bound)
    return int(ids.size)


def lfl_round1_inputs(
    ctx: StepContext, round: int, ids: np.ndarray, v: np.ndarray, noise: dict
) -> tuple[np.ndarray, dp_event.DpEvent]:
    """Round 1 for the online users ``ids``: (G_i + ξ_i flattened (m·p), the event of the sum), as
    secure aggregation's input. ``noise`` holds the distributed Gaussian's parameters
    (:func:`rayfed.privacy.distributed_gaussian`): z, Δ, ζ1, t and ζ2 at |U1| = t."""
    all_ids = ctx.state["ids"]
    rows = np.searchsorted(all_ids, ids)
    users, items, ratings = _user_ratings(ctx, "train")
    urows = np.searchsorted(all_ids, users)
    order = np.argsort(urows, kind="stable")
    counts = np.bincount(urows, minlength=all_ids.size)
    starts = np.cumsum(counts) - counts
    pick = starts[rows] + np.floor(
        ctx.noise.user_uniform("sample", round, ids, 1)[:, 0] * counts[rows]
    ).astype(np.int64)  # the sampled rating is secret too
    j, x = items[order][pick], ratings[order][pick]
    u = ctx.state["u"][rows]
    m, p = v.shape
    grads = np.zeros((len(ids), m * p))
    grad = -2.0 * (x - np.einsum("ij,ij->i", u, v[j]))[:, None] * u
    grads.reshape(len(ids), m, p)[np.arange(len(ids)), j] = grad
    return distributed_gaussian(
        ctx.noise,
        grads,
        ids=ids,
        l2_sensitivity=noise["sensitivity"],
        noise_multiplier=noise["z"],
        share=noise["zeta1"],
        quorum=noise["quorum"],
        replacement=noise["zeta2"],
        round=round,
    )


def lfl_round2_step(
    ctx: StepContext,
    round: int,
    u1: np.ndarray,
    shapes: tuple[int, int],
    noise: dict,
    zeta2: float,
    dropout: float,
) -> Message:
    """Round 2: each Round-1 survivor still online sends ξ̄_i = -ξ_i + ξ'_i: ξ_i regenerated from
    its own noise source, ξ'_i ~ N(0, ζ2 σ²) with ζ2 from the realised |U1|."""
    ids = ctx.state["ids"][np.isin(ctx.state["ids"], u1)]
    online = rng.keyed_uniform(ctx.seed, "dropout-round2", round, ids, 1)[:, 0] >= dropout
    ids = ids[online]
    m, p = shapes
    xi = share_noise(
        ctx.noise,
        ids,
        m * p,
        l2_sensitivity=noise["sensitivity"],
        noise_multiplier=noise["z"],
        share=noise["zeta1"],
        round=round,
    )
    values, _ = gaussian(
        ctx.noise,
        -xi,
        l2_sensitivity=noise["sensitivity"],
        noise_multiplier=math.sqrt(zeta2) * noise["z"],
        ids=ids,
        round=round,
        purpose="replacement",
        part_of="this iteration's Round-1 release",  # its event covers the replacement (F)
    )
    return Message("noise_replacement", {"ids": ids, "values": values}, to="coordinator")


def finetune_step(ctx: StepContext, v: np.ndarray, steps: int, lr: float, bound: float) -> None:
    _local_descent(ctx, v, steps, lr, bound)


def evaluate_step(ctx: StepContext, v: np.ndarray) -> tuple[float, int]:
    """Evaluation only (outside the protocol): squared error and count on the users' test ratings."""
    users, items, ratings = _user_ratings(ctx, "test")
    rows = np.searchsorted(ctx.state["ids"], users)
    pred = np.einsum("ij,ij->i", ctx.state["u"][rows], v[items])
    return float(np.sum((pred - ratings) ** 2)), int(ratings.size)


# --- coordinator steps -----------------------------------------------------------------------------
def init_v_step(ctx: StepContext, m: int, p: int, mean: float, bound: float) -> Message:
    ctx.state["v"] = mf.project(mf.init_embeddings(m, p, mean, ctx.rng("init", 0)), bound)
    return Message("item_embeddings", ctx.state["v"], to="cohorts")


def update_v_step(
    ctx: StepContext,
    s1: np.ndarray,
    round2: dict,
    u1: int,
    lr: float,
    beta: float,
    bound: float,
) -> Message:
    """V <- Π_𝒱(V - γ/|U1| (S1 + β N2)), N2 the sum of the replacement messages: post-processing
    of the iteration's release (whose event Round 1's messages carried)."""
    v = ctx.state["v"]
    n2 = sum((np.asarray(r["values"]).sum(axis=0) for r in round2.values()), np.zeros(v.size))
    ctx.state["v"] = mf.project(v - lr / u1 * (s1 + beta * n2).reshape(v.shape), bound)
    return Message("item_embeddings", ctx.state["v"], to="cohorts")


def current_v_step(ctx: StepContext) -> Message:
    return Message("item_embeddings", ctx.state["v"], to="cohorts")


_SHORT = {"pretrain_steps": 5, "finetune_steps": 2}  # the examples' short local training


class FederatedMF(Protocol):
    name = "federated-mf"
    summary = "federated matrix factorisation with DP: LFL-SGDMF over real secure aggregation, with dropouts"
    Config = FederatedMFConfig
    examples = (
        {"users": 150, "items": 20, "iterations": 2, "cohorts": 2, **_SHORT},
        {"users": 150, "items": 20, "iterations": 2, "cohorts": 2, "mode": "faithful", **_SHORT},
        {"setting": "vfl", "users": 150, "items": 30, "iterations": 2, "local_steps": 2, **_SHORT},
        {
            "setting": "vfl",
            "method": "local",
            "privacy_unit": "user",
            "users": 150,
            "items": 30,
            "iterations": 2,
            "local_steps": 2,
            **_SHORT,
        },
        {"setting": "hfl", "users": 150, "items": 30, "iterations": 2, "local_steps": 2, **_SHORT},
    )

    def data_bytes(self, cfg: FederatedMFConfig) -> int:
        """The synthetic ratings (a dense users x items draw), and in LFL every online user's
        Round-1 input, a dense m·p vector, with its masked words."""
        if cfg.data.path is not None:
            return 0
        ratings = cfg.users * cfg.items * 9
        if cfg.setting == "lfl":
            return ratings + cfg.users * cfg.items * cfg.rank * 8 * 3
        return ratings + cfg.users * cfg.rank * 8 * (cfg.parties + 2)

    def resolve_randomness(self, cfg: FederatedMFConfig, randomness: str):
        """``secagg_mode=secure`` makes the run secure; a secure run makes ``simulation`` secure
        and refuses ``dealer`` (its mask seeds come from the run seed)."""
        return reconcile_randomness(
            cfg, randomness, "secagg_mode", upgrade=("simulation",), refused=("dealer",)
        )

    def plan(self, cfg: FederatedMFConfig, seed: int) -> Plan:
        allowed = {
            "lfl": ("lfl", "ldp", "stage1", "central"),
            "vfl": ("vfl", "local", "central"),
            "hfl": ("hfl", "local", "central"),
        }[cfg.setting]
        if cfg.resolved_method() not in allowed:
            raise ConfigError(
                "method", f"{cfg.method!r} does not apply to setting={cfg.setting}", allowed
            )
        # the drivers work on the resolved options; the manifest keeps what the user wrote
        cfg = dataclasses.replace(
            cfg,
            method=cfg.resolved_method(),
            privacy_unit=cfg.resolved_unit(),
            trim=cfg.resolved_trim(),
        )
        plan = (
            self._plan_partitioned(cfg, seed)
            if cfg.setting in ("vfl", "hfl")
            else self._plan_lfl(cfg, seed)
        )
        plan.info["cfg"] = cfg
        return plan

    def _plan_lfl(self, cfg: FederatedMFConfig, seed: int) -> Plan:
        gen = rng.stream(seed, "synthetic", 0, "federated-mf")
        ratings = self._ratings(cfg, gen)
        train, test = mf.split(ratings, cfg.test_fraction, gen, by_user=True)
        delta = cfg.delta if cfg.delta is not None else 1.0 / len(ratings)
        check_budget(cfg.epsilon, delta)
        n, m = ratings.n, ratings.m
        table = pa.table(
            {
                "user_id": np.concatenate([train.user, test.user]),
                "item": np.concatenate([train.item, test.item]),
                "rating": np.concatenate([train.rating, test.rating]),
                "split": ["train"] * len(train) + ["test"] * len(test),
            }
        )
        n_cohorts = default_cohorts(n, cfg.cohorts)
        cohorts = {name: (t, {}) for name, t in per_user(table, "user_id", n_cohorts).items()}
        z = gaussian_noise_multiplier(cfg.epsilon, delta, steps=cfg.iterations)
        sensitivity = 2.0 * cfg.bound**1.5
        # faithful mode is run as the thesis specifies even though its guarantee is weaker: the ledger
        # is declared with the worst-case effective ε, and the result reports it next to the nominal one
        budget_eps = cfg.epsilon
        if cfg.method == "lfl" and cfg.mode == "faithful":
            from rayfed.privacy.calibration import gaussian_steps_event
            from rayfed.privacy.ledger import make_accountant

            noise = round1_noise(cfg.mode, cfg.method, n, cfg.omega, z, sensitivity)
            z_charge = round1_event(noise).noise_multiplier
            acc = make_accountant("rdp", "add_or_remove_one").compose(
                gaussian_steps_event(z_charge, cfg.iterations)
            )
            budget_eps = float(acc.get_epsilon(delta)) * (1 + 1e-9)
        params = find_params(n, dropout=cfg.omega, corrupt=0.05)
        clip = sensitivity + 8 * z * sensitivity * math.sqrt(
            max(
                noise_shares(cfg.mode, cfg.method, n, cfg.omega, threshold(n, cfg.omega))[0],
                1e-12,
            )
        )
        return Plan(
            budget=Budget(budget_eps, delta),
            requested_epsilon=cfg.epsilon,
            ledger=dict(
                accountant="rdp",
                relation="add_or_remove_one",
                composition="sequential",
                statement="per-user DP of the published item embeddings V against the server, which sees "
                "every Round-1 secure-aggregation sum and every Round-2 message (dummy-row adjacency)",
            ),
            cohorts=cohorts,
            rounds=cfg.iterations if cfg.method in ("lfl", "ldp") else 1,
            evaluation={"train": train, "test": test},
            info=dict(
                n=n,
                m=m,
                delta=delta,
                z=z,
                sensitivity=sensitivity,
                params=params,
                encoding=FixedPoint.choose(n, clip, 16),
                mean=float(train.rating.mean()),
                threshold=threshold(n, cfg.omega),
                registry=np.arange(n, dtype=np.int64),
            ),
        )

    @staticmethod
    def _ratings(cfg: FederatedMFConfig, gen: np.random.Generator) -> mf.Ratings:
        """The run's ratings, checked to lie in [0, R]: every sensitivity bound depends on it."""
        ratings = FederatedMF._load(cfg, gen)
        if ratings.low < 0 or ratings.high > cfg.bound:
            raise ConfigError(
                "bound",
                f"ratings span [{ratings.low}, {ratings.high}] but R = {cfg.bound}",
                f"bound >= {ratings.high} (the clipping argument needs ratings in [0, R])",
            )
        return ratings

    @staticmethod
    def _load(cfg: FederatedMFConfig, gen: np.random.Generator) -> mf.Ratings:
        if cfg.data.path is None:
            return mf.synthetic_ratings(
                cfg.users, cfg.items, density=cfg.density, low=1.0, high=cfg.bound, rng=gen
            )
        cols = (cfg.data.columns or {}).get("ratings", ["user_id", "item_id", "rating"])
        return mf.load_ratings(
            cfg.data.path, user=cols[0], item=cols[1], rating=cols[2], format=cfg.data.format
        )

    @staticmethod
    def _owner_by_column(cfg: FederatedMFConfig, ratings: mf.Ratings) -> np.ndarray:
        """Party of each item from ``split_column`` (its first value per item), parties in value order."""
        from rayfed.data import load_table, require_columns

        if cfg.setting != "vfl" or cfg.data.path is None:
            raise ConfigError(
                "split_column",
                "splits items of a ratings file in the VFL setting",
                "setting=vfl with data.path",
            )
        table = load_table(cfg.data.path, cfg.data.format)
        item_col = ((cfg.data.columns or {}).get("ratings") or ["user_id", "item_id", "rating"])[1]
        require_columns(table, [cfg.split_column], "split_column")
        items = table.column(item_col).to_numpy(zero_copy_only=False)
        values = np.asarray(table.column(cfg.split_column).to_pylist(), dtype=object).astype(str)
        first = np.unique(items, return_index=True)[1]  # sorted item ids: the dense index order
        groups, owner = np.unique(values[first], return_inverse=True)
        if groups.size < 2:
            raise ConfigError(
                "split_column",
                f"column {cfg.split_column!r} has a single value",
                "two or more values",
            )
        return owner.astype(np.int64)

    def _plan_partitioned(self, cfg: FederatedMFConfig, seed: int) -> Plan:
        """VFL: items dealt at random to s parties; per-rating: parallel over parties (disjoint items,
        Thm 4.4.1); per-user: a user's ratings span every party, so all parties compose (spec §3.2).
        HFL: users dealt at random; both units compose in parallel (disjoint users, Prop. 4.5.1)."""
        vfl = cfg.setting == "vfl"
        gen = rng.stream(seed, "synthetic", 0, "federated-mf")
        ratings = self._ratings(cfg, gen)
        train, test = mf.split(ratings, cfg.test_fraction, gen, by_user=True)
        axis = ratings.m if vfl else ratings.n
        if cfg.parties < 1 or cfg.parties > axis:
            raise ConfigError(
                "parties",
                f"{cfg.parties} parties for {axis} {'items' if vfl else 'users'}",
                f"1 to {axis}",
            )
        if not 0 < cfg.sampling_rate <= 1 or cfg.local_steps < 1:
            raise ConfigError("sampling_rate", "need sampling_rate in (0, 1] and local_steps >= 1")
        delta = cfg.delta if cfg.delta is not None else 1.0 / len(ratings)
        if cfg.split_column is not None:
            owner = self._owner_by_column(cfg, ratings)
            n_parties = int(owner.max()) + 1
        else:
            owner, n_parties = gen.integers(0, cfg.parties, axis), cfg.parties
        parties = {}
        for k in range(n_parties):
            items = np.flatnonzero(owner == k) if vfl else np.arange(ratings.m)
            rows = {
                name: part.take(np.flatnonzero(owner[part.item if vfl else part.user] == k))
                for name, part in (("train", train), ("test", test))
            }
            table = pa.table(
                {
                    "user_id": np.concatenate([rows["train"].user, rows["test"].user]),
                    "item": np.concatenate([rows["train"].item, rows["test"].item]),
                    "rating": np.concatenate([rows["train"].rating, rows["test"].rating]),
                    "split": ["train"] * len(rows["train"]) + ["test"] * len(rows["test"]),
                }
            )
            share = items.size / ratings.m if vfl else np.count_nonzero(owner == k) / ratings.n
            parties[f"p{k}"] = (table, {"items": items, "n": ratings.n, "m_share": share})
        per_user = cfg.privacy_unit == "user"
        # VFL publishes V_Fk after κ more noisy steps; HFL's Stage 3 is local and never published
        steps = cfg.iterations * cfg.local_steps + (cfg.finetune_steps if vfl else 0)
        # per-user VFL: a user's ratings span every party, so every party's releases compose (the
        # local-only baseline too: each party releases its own V_Fk and U^(k) about the same users)
        compose_all = per_user and vfl
        z = gaussian_noise_multiplier(
            cfg.epsilon,
            delta,
            steps=steps * (n_parties if compose_all else 1),
            sampling_rate=cfg.sampling_rate,
        )
        theta = cfg.trim if per_user else 1
        if not vfl:
            statement = (
                f"per-{cfg.privacy_unit} DP in HFL: users are disjoint across parties, so parties "
                "compose in parallel; only the Stage-2 uploads and the published V count"
            )
        elif per_user:
            statement = (
                "per-user DP: each party trims every user to θ ratings; a user's ratings span all "
                "parties, so all parties' releases compose"
            )
        else:
            statement = "per-rating DP in VFL: items are disjoint across parties, so parties compose in parallel"
        return Plan(
            budget=Budget(cfg.epsilon, delta),
            ledger=dict(
                accountant="rdp",
                relation="add_or_remove_one",
                composition="sequential" if compose_all else "parallel",
                statement=statement,
            ),
            parties=parties,
            rounds=cfg.iterations,
            evaluation={"train": train, "test": test},
            info=dict(
                n=ratings.n,
                m=ratings.m,
                delta=delta,
                z=z,
                mean=float(train.rating.mean()),
                delta_joint=theta * 2 * math.sqrt(2) * cfg.bound**1.5,
                delta_v=theta * 2 * cfg.bound**1.5,
                trim=cfg.trim if per_user else None,
            ),
        )

    def _drive_vfl(self, fed, cfg: FederatedMFConfig, plan: Plan) -> Outcome:
        from rayfed.federation import PerMember
        from rayfed.privacy.calibration import gaussian_steps_event
        from rayfed.protocols import federated_mf_parties as parties

        info = plan.info
        p = cfg.rank
        u_msg = fed.coordinator.run(
            parties.init_u_step, info["n"], p, info["mean"], cfg.bound, phase="init_u"
        )
        fed.parties.run(
            parties.vfl_init_step, p, info["mean"], cfg.bound, info["trim"], phase="init_v"
        )
        names = fed.parties.names
        shares = PerMember({k: plan.parties[k][1]["m_share"] for k in names})
        round_event = gaussian_steps_event(info["z"], cfg.local_steps, cfg.sampling_rate)
        u_arg = u_msg.single()
        for t in range(cfg.iterations):
            with fed.round(t):
                fed.charge(
                    [(k, f"round {t}: {cfg.local_steps} DP-SGD steps", round_event) for k in names]
                )
                uploads = fed.parties.run(
                    parties.vfl_local_step,
                    u_arg,
                    t,
                    cfg.local_steps,
                    cfg.vfl_lr,
                    cfg.sampling_rate,
                    info["z"],
                    info["delta_joint"],
                    cfg.bound,
                    shares,
                    phase="local_steps",
                )
                if cfg.method == "vfl":
                    weights = {k: plan.parties[k][1]["m_share"] for k in names}
                    u_arg = fed.coordinator.run(
                        parties.average_step, uploads, weights, "user_embeddings", phase="average_u"
                    ).single()
                else:  # local-only: each party continues from its own U^(k)
                    u_arg = PerMember(uploads)
        if cfg.finetune_steps:
            tune_event = gaussian_steps_event(info["z"], cfg.finetune_steps, cfg.sampling_rate)
            fed.charge([(k, "fine-tuning V_Fk", tune_event) for k in names])
            fed.parties.run(
                parties.vfl_finetune_step,
                u_arg,
                cfg.finetune_steps,
                cfg.vfl_lr,
                cfg.sampling_rate,
                info["z"],
                info["delta_v"],
                cfg.bound,
                shares,
                phase="finetune",
            )
        parts = fed.get(fed.parties.run(parties.vfl_evaluate_step, phase="evaluate"))
        fed.note(
            f"noise multiplier z = {info['z']:.4g} (σ = z·Δ, Δ = {info['delta_joint']:.4g} joint, "
            f"{info['delta_v']:.4g} fine-tuning) for {cfg.iterations}x{cfg.local_steps}+{cfg.finetune_steps} "
            f"steps at η = {cfg.sampling_rate:g}, δ = {info['delta']:.3g}"
        )
        return parties.partitioned_outcome(cfg, info, parts)

    def _drive_hfl(self, fed, cfg: FederatedMFConfig, plan: Plan) -> Outcome:
        from rayfed.privacy.calibration import gaussian_steps_event
        from rayfed.protocols import federated_mf_parties as parties

        info = plan.info
        names = fed.parties.names
        v_msg = fed.coordinator.run(
            init_v_step, info["m"], cfg.rank, info["mean"], cfg.bound, phase="init_v"
        )
        fed.parties.run(
            parties.hfl_pretrain_step,
            v_msg.single(),
            cfg.rank,
            info["mean"],
            cfg.pretrain_steps,
            cfg.local_lr,
            cfg.bound,
            info["trim"],
            phase="pretrain",
        )
        round_event = gaussian_steps_event(info["z"], cfg.local_steps, cfg.sampling_rate)
        weights = {k: plan.parties[k][1]["m_share"] for k in names}
        if cfg.method == "hfl":
            for t in range(cfg.iterations):
                with fed.round(t):
                    fed.charge(
                        [
                            (k, f"round {t}: {cfg.local_steps} DP-SGD steps on V", round_event)
                            for k in names
                        ]
                    )
                    uploads = fed.parties.run(
                        parties.hfl_local_step,
                        v_msg.single(),
                        t,
                        cfg.local_steps,
                        cfg.vfl_lr,
                        cfg.sampling_rate,
                        info["z"],
                        info["delta_v"],
                        cfg.bound,
                        phase="local_steps",
                    )
                    v_msg = fed.coordinator.run(
                        parties.average_step, uploads, weights, "item_embeddings", phase="average_v"
                    )
        else:
            fed.note(
                "local non-private SGD baseline: each party trains on its own data only; nothing is released"
            )
        fed.parties.run(
            parties.hfl_finetune_step,
            v_msg.single(),
            cfg.finetune_steps,
            cfg.local_lr,
            cfg.bound,
            phase="finetune",
        )
        parts = fed.get(fed.parties.run(parties.hfl_evaluate_step, phase="evaluate"))
        if cfg.privacy_unit == "rating":
            fed.note(
                "per-rating in HFL has a gap (spec §7.8): the pre-trained u_i depends on all of the user's "
                "ratings; per-user (privacy_unit=user) is sound"
            )
        return parties.partitioned_outcome(cfg, info, parts)

    def drive(self, fed, cfg: FederatedMFConfig, plan: Plan) -> Outcome:
        cfg = plan.info["cfg"]
        if cfg.setting == "vfl" and cfg.method != "central":
            return self._drive_vfl(fed, cfg, plan)
        if cfg.setting == "hfl" and cfg.method != "central":
            return self._drive_hfl(fed, cfg, plan)
        info = plan.info
        m, p = info["m"], cfg.rank
        if cfg.method == "central":
            ev = plan.evaluation
            result = mf.central_sgd(
                ev["train"],
                ev["test"],
                p=p,
                epochs=30,
                rng=rng.stream(fed.seed, "init", 0, "central-baseline"),
            )
            fed.note("central non-private baseline: no privacy; trained on the pooled ratings")
            return self._outcome(cfg, plan, result.test_mse, [], [])
        v_msg = fed.coordinator.run(init_v_step, m, p, info["mean"], cfg.bound, phase="init_v")
        fed.cohorts.run(
            pretrain_step,
            v_msg.single(),
            p,
            info["mean"],
            cfg.pretrain_steps,
            cfg.local_lr,
            cfg.bound,
            phase="pretrain",
        )
        history, skipped = [], []
        if cfg.method in ("lfl", "ldp"):
            noise = round1_noise(
                cfg.mode, cfg.method, info["n"], cfg.omega, info["z"], info["sensitivity"]
            )
            for t in range(cfg.iterations):
                with fed.round(t):
                    fed.charge([("run", f"iteration {t}", round1_event(noise))])
                    v_msg, row = self._iteration(fed, cfg, plan, t, v_msg, noise)
                    fed.record(
                        survivors_round1=row.get("u1", 0),
                        survivors_round2=row.get("u2", 0),
                        skipped=int(row["skipped"]),
                    )
                history.append(row)
                if row["skipped"]:
                    skipped.append(t)
        self._notes(fed, cfg, plan)
        fed.cohorts.run(
            finetune_step,
            v_msg.single(),
            cfg.finetune_steps,
            cfg.local_lr,
            cfg.bound,
            phase="finetune",
        )
        parts = fed.get(fed.cohorts.run(evaluate_step, v_msg.single(), phase="evaluate"))
        test_mse = sum(s for s, _ in parts.values()) / max(1, sum(c for _, c in parts.values()))
        return self._outcome(cfg, plan, test_mse, history, skipped)

    def _iteration(self, fed, cfg: FederatedMFConfig, plan: Plan, t: int, v_msg, noise: dict):
        info = plan.info
        n, m, p = info["n"], info["m"], cfg.rank
        spec = make_spec(
            round=t,
            mode=cfg.secagg_mode,
            registry=info["registry"],
            params=info["params"],
            encoding=info["encoding"],
            dim=m * p,
            tag=fed.run_id.encode(),
            dropout=DropoutSchedule(rates={"before_advertise": cfg.dropout}),
            min_survivors=info["threshold"],  # secure aggregation itself aborts below t
        )
        v = fed.one(v_msg)
        row = {"iteration": t, "skipped": False}
        try:
            agg = secure_sum(fed, spec, lfl_round1_inputs, (v, noise))
        except BelowThreshold as err:
            row.update(skipped=True, reason=str(err))
            return fed.coordinator.run(current_v_step, phase="keep_v"), row
        u1 = int(agg.survivors.size)
        if u1 < info["threshold"]:
            row.update(skipped=True, reason=f"|U1| = {u1} < t = {info['threshold']}")
            return fed.coordinator.run(current_v_step, phase="keep_v"), row
        zeta1, zeta2, beta = noise_shares(cfg.mode, cfg.method, n, cfg.omega, u1)
        if zeta2 > 0:
            round2 = fed.cohorts.run(
                lfl_round2_step,
                t,
                agg.survivors,
                (m, p),
                noise,
                zeta2,
                cfg.dropout,
                phase="round2",
            )
            u2 = int(sum(len(r["ids"]) for r in fed.get(round2).values()))
        else:
            round2, u2 = {}, 0
        v_msg = fed.coordinator.run(
            update_v_step,
            agg.sum,
            round2,
            u1,
            cfg.lr,
            beta,
            cfg.bound,
            phase="update_v",
        )
        # f_eff: the server's best estimate (what DP must cover); f_applied: the update's own noise
        row.update(
            u1=u1,
            u2=u2,
            f_eff=effective_variance(zeta1, zeta2, u1, u2),
            f_applied=u2 * beta**2 * zeta2 + (u1 - u2) * zeta1 + u2 * (1 - beta) ** 2 * zeta1,
        )
        return v_msg, row

    @staticmethod
    def _notes(fed, cfg: FederatedMFConfig, plan: Plan) -> None:
        info = plan.info
        if cfg.method == "stage1":
            fed.note("stage-1-only baseline: V stays at its initialisation; nothing is released")
        elif cfg.method == "ldp":
            fed.note("LDP-level noise baseline: every device adds the full σ_v² to its own report")
        elif cfg.mode == "faithful":
            fed.note(
                f"faithful mode (the thesis): calibrated to a nominal ε={cfg.epsilon:g}; the server also sees "
                "Round 2, and the effective noise can fall to "
                f"{worst_case_variance(cfg.mode, cfg.method, info['n'], cfg.omega):.3f}·σ_v², so the ledger "
                "charges that worst case: the epsilon reported above is the true guarantee"
            )
        else:
            fed.note(
                "corrected mode: effective noise >= σ_v² in every accepted outcome, so the nominal ε holds"
            )
        if cfg.method in ("lfl", "ldp") and cfg.secagg_mode != "secure":
            fed.note(
                f"secagg_mode={cfg.secagg_mode}: the DP statement assumes an ideal secure aggregation; in "
                "this mode the coordinator could derive the masks (a simulation, not a deployment)"
            )
        fed.note(
            f"σ_v = z·2R^(3/2) with z = {info['z']:.4g} from dp-accounting (RDP, T={cfg.iterations}, "
            f"δ={info['delta']:.3g}); skipped iterations are charged too (conservative)"
        )

    def _outcome(self, cfg, plan, test_mse, history, skipped) -> Outcome:
        info = plan.info
        if "params" not in info:  # the central baseline of the VFL/HFL settings
            return Outcome(
                tables={},
                metrics={"test_mse": test_mse, "setting": cfg.setting, "method": "central"},
                headline=f"central non-private SGD test MSE {test_mse:.4f}",
            )
        metrics = {
            "test_mse": test_mse,
            "method": cfg.method,
            "mode": cfg.mode,
            "users": info["n"],
            "items": info["m"],
            "noise_multiplier": info["z"],
            "delta": info["delta"],
            "skipped_iterations": skipped,
            "iterations": history,
            "secagg_degree": info["params"].degree,
            "threshold": info["threshold"],
            "secagg_mode": cfg.secagg_mode,
            "epsilon_nominal": cfg.epsilon,
            "epsilon_worst_case": plan.budget.epsilon,
        }
        headline = (
            f"LFL {cfg.method} test MSE {test_mse:.4f} ({info['n']} users, {info['m']} items)"
        )
        if skipped:
            headline += f"; {len(skipped)} iteration(s) skipped below threshold"
        table = (
            pa.Table.from_pylist(
                [
                    {
                        k: r.get(k)
                        for k in ("iteration", "skipped", "u1", "u2", "f_eff", "f_applied")
                    }
                    for r in history
                ]
            )
            if history
            else pa.table({"iteration": pa.array([], pa.int64())})
        )
        return Outcome(tables={"iterations": table}, metrics=metrics, headline=headline)
