"""Federated MF with parties (spec federated-mf.md §2.5–2.6): the step functions of VFL-SGDMF
(parties hold disjoint item sets; the server averages U) and HFL-SGDMF (parties hold disjoint user
sets; the server averages V). The configuration, planning and drivers are in
:mod:`rayfed.protocols.federated_mf`, which imports this module.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayfed import mf, rng
from rayfed.actors.base import Message, StepContext
from rayfed.privacy import gaussian
from rayfed.privacy.calibration import gaussian_steps_event
from rayfed.protocols.base import Outcome
from rayfed.protocols.federated_mf import FederatedMFConfig, _user_ratings, pretrain_step


# --- VFL-SGDMF (spec §2.5): parties hold disjoint item sets, the server averages U ---------------------
def _trim(ctx: StepContext, users: np.ndarray, items: np.ndarray, keep_per_user: int) -> np.ndarray:
    """Keep at most θ ratings per user, chosen by a draw keyed by (user, item): independent of row order."""
    draw = rng.keyed_uniform(
        ctx.seed, "trim", 0, users.astype(np.uint64) * np.uint64(2**32) + items, 1
    )[:, 0]
    order = np.lexsort((draw, users))
    counts = np.bincount(users, minlength=ctx.meta["n"])
    rank = np.arange(users.size) - np.repeat(np.cumsum(counts) - counts, counts)
    keep = np.zeros(users.size, dtype=bool)
    keep[order] = rank < keep_per_user
    return keep


def vfl_init_step(ctx: StepContext, p: int, mean: float, bound: float, trim: int | None) -> int:
    """Party: V_Fk in 𝒱 and, for per-user privacy, each user trimmed to at most θ ratings (once)."""
    items = ctx.meta["items"]
    ctx.state["v"] = mf.project(mf.init_embeddings(items.size, p, mean, ctx.rng("init", 0)), bound)
    users, item, rating = _user_ratings(ctx, "train")
    keep = _trim(ctx, users, item, trim) if trim is not None else np.ones(users.size, dtype=bool)
    local = np.searchsorted(items, item)
    ctx.state["train"] = (users[keep], local[keep], rating[keep])
    return int(keep.sum())


def _dp_sgd(
    ctx: StepContext,
    u: np.ndarray,
    steps: int,
    round: int,
    *,
    lr: float,
    rate: float,
    z: float,
    sensitivity: float,
    bound: float,
    m_share: float,
    update_u: bool,
):
    """``steps`` DP-SGD steps (spec §2.5): Poisson user sampling, the released gradient sums plus
    N(0, (zΔ)²) through :func:`rayfed.privacy.gaussian` (on (g_U, g_V) jointly when U is updated,
    Δ their joint sensitivity), divided by the public B = η|Ω_k|, projected. The sample and the
    noise come from the party's noise source (both must be secret for the sampled accounting).
    Returns (the party's U^(k), the event of the ``steps`` releases)."""
    users, items, ratings = ctx.state["train"]
    v = ctx.state["v"]
    n = ctx.meta["n"]
    b = max(rate * users.size, 1.0)
    event = None
    for _ in range(steps):
        sampled = ctx.noise.generator("sample", round).random(n) < rate
        rows = np.flatnonzero(sampled[users])
        batch = mf.Ratings(users[rows], items[rows], ratings[rows], n, v.shape[0], 0, bound)
        g_u, g_v = mf.gradient_sums(u, v, batch)
        released = np.concatenate([g_u.ravel(), g_v.ravel()]) if update_u else g_v.ravel()
        noisy, event = gaussian(
            ctx.noise, released, l2_sensitivity=sensitivity, noise_multiplier=z, round=round
        )
        if update_u:
            u = mf.project(u - lr * noisy[: u.size].reshape(u.shape) / b, bound)
        v = mf.project(v - lr * m_share * noisy[-v.size :].reshape(v.shape) / b, bound)
    ctx.state["v"] = v
    return u, gaussian_steps_event(event.noise_multiplier, steps, rate)


def vfl_local_step(
    ctx: StepContext,
    u: np.ndarray,
    round: int,
    steps: int,
    lr: float,
    rate: float,
    z: float,
    delta_joint: float,
    bound: float,
    m_share: float,
) -> Message:
    """Party: T' noisy local steps on (U^(k), V_Fk) from the broadcast U; uploads U^(k)."""
    u, event = _dp_sgd(
        ctx,
        np.array(u),
        steps,
        round,
        lr=lr,
        rate=rate,
        z=z,
        sensitivity=delta_joint,
        bound=bound,
        m_share=m_share,
        update_u=True,
    )
    ctx.state["u"] = u
    return Message("user_embeddings", u, to="coordinator", dp_event=event)


def vfl_finetune_step(
    ctx: StepContext,
    u: np.ndarray,
    steps: int,
    lr: float,
    rate: float,
    z: float,
    delta_v: float,
    bound: float,
    m_share: float,
) -> Message:
    """Party: κ noisy steps on V_Fk with U frozen (convex, smaller sensitivity); V_Fk is published."""
    ctx.state["u"] = np.array(u)
    _, event = _dp_sgd(
        ctx,
        ctx.state["u"],
        steps,
        0,  # the draw counter keeps these streams apart from round 0's
        lr=lr,
        rate=rate,
        z=z,
        sensitivity=delta_v,
        bound=bound,
        m_share=m_share,
        update_u=False,
    )
    return Message("item_embeddings", ctx.state["v"], to="coordinator", dp_event=event)


def vfl_evaluate_step(ctx: StepContext) -> tuple[float, int]:
    """Evaluation only: squared error on the party's test ratings with the final U and V_Fk."""
    users, items, ratings = _user_ratings(ctx, "test")
    local = np.searchsorted(ctx.meta["items"], items)
    pred = np.einsum("ij,ij->i", ctx.state["u"][users], ctx.state["v"][local])
    return float(np.sum((pred - ratings) ** 2)), int(ratings.size)


def average_step(ctx: StepContext, uploads: dict, weights: dict, name: str) -> Message:
    """Server: the weighted average Σ_k w_k X^(k) of the parties' uploads (U in VFL with w_k = m_k/m,
    V in HFL with w_k = n_k/n): a convex combination, so it stays in the clipped set; broadcast."""
    return Message(
        name, sum(weights[k] * np.asarray(up) for k, up in sorted(uploads.items())), to="parties"
    )


def init_u_step(ctx: StepContext, n: int, p: int, mean: float, bound: float) -> Message:
    return Message(
        "user_embeddings",
        mf.project(mf.init_embeddings(n, p, mean, ctx.rng("init", 1)), bound),
        to="parties",
    )


# --- HFL-SGDMF (spec §2.6): parties hold disjoint user sets, the server averages V ----------------------
def hfl_pretrain_step(
    ctx: StepContext,
    v: np.ndarray,
    p: int,
    mean: float,
    steps: int,
    lr: float,
    bound: float,
    trim: int | None,
) -> int:
    """Stage 1 on the party's own (untrimmed) ratings, V fixed, no noise; then the Stage-2 trimming."""
    pretrain_step(ctx, v, p, mean, steps, lr, bound)
    users, items, ratings = _user_ratings(ctx, "train")
    keep = _trim(ctx, users, items, trim) if trim is not None else np.ones(users.size, dtype=bool)
    ctx.state["train"] = (users[keep], items[keep], ratings[keep])
    return int(keep.sum())


def _full_u(ctx: StepContext) -> np.ndarray:
    u = np.zeros((ctx.meta["n"], ctx.state["u"].shape[1]))
    u[ctx.state["ids"]] = ctx.state["u"]
    return u


def hfl_local_step(
    ctx: StepContext,
    v: np.ndarray,
    round: int,
    steps: int,
    lr: float,
    rate: float,
    z: float,
    delta_v: float,
    bound: float,
) -> Message:
    """Party: T' DP-SGD steps on its copy V^(k) with its pre-trained U fixed; uploads V^(k)."""
    ctx.state["v"] = np.array(v)
    _, event = _dp_sgd(
        ctx,
        _full_u(ctx),
        steps,
        round,
        lr=lr,
        rate=rate,
        z=z,
        sensitivity=delta_v,
        bound=bound,
        m_share=1.0,
        update_u=False,
    )
    return Message("item_embeddings", ctx.state["v"], to="coordinator", dp_event=event)


def hfl_finetune_step(ctx: StepContext, v: np.ndarray, steps: int, lr: float, bound: float) -> None:
    """Stage 3: U_Uk and V^(k) jointly on the untrimmed local data, no noise, never published."""
    users, items, ratings = _user_ratings(ctx, "train")
    u, v = _full_u(ctx), np.array(v)
    batch = mf.Ratings(users, items, ratings, u.shape[0], v.shape[0], 0, bound)
    counts_u = np.maximum(np.bincount(users, minlength=u.shape[0]), 1)[:, None]
    counts_v = np.maximum(np.bincount(items, minlength=v.shape[0]), 1)[:, None]
    for _ in range(steps):
        g_u, g_v = mf.gradient_sums(u, v, batch)
        u, v = (
            mf.project(u - lr * g_u / counts_u, bound),
            mf.project(v - lr * g_v / counts_v, bound),
        )
    ctx.state["u"], ctx.state["v"] = u[ctx.state["ids"]], v


def hfl_evaluate_step(ctx: StepContext) -> tuple[float, int]:
    users, items, ratings = _user_ratings(ctx, "test")
    pred = np.einsum("ij,ij->i", _full_u(ctx)[users], ctx.state["v"][items])
    return float(np.sum((pred - ratings) ** 2)), int(ratings.size)


def partitioned_outcome(cfg: FederatedMFConfig, info: dict, parts: dict) -> Outcome:
    """VFL/HFL result: pooled test MSE over the parties' evaluation replies (sse, count)."""
    test_mse = sum(v[0] for v in parts.values()) / max(1, sum(v[1] for v in parts.values()))
    metrics = {
        "test_mse": test_mse,
        "setting": cfg.setting,
        "method": cfg.method,
        "parties": len(parts),
        "privacy_unit": cfg.privacy_unit,
        "noise_multiplier": info["z"],
        "delta": info["delta"],
        "users": info["n"],
        "items": info["m"],
    }
    headline = (
        f"{cfg.setting.upper()} {cfg.method} test MSE {test_mse:.4f} ({len(parts)} parties, "
        f"per-{cfg.privacy_unit} DP)"
    )
    table = pa.table(
        {
            "party": list(parts),
            "sse": [v[0] for v in parts.values()],
            "ratings": [v[1] for v in parts.values()],
        }
    )
    return Outcome(tables={"evaluation": table}, metrics=metrics, headline=headline)
