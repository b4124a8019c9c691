"""The step functions of ``federated-mf``'s VFL and HFL settings, by role: plain functions of
(ctx, inputs) -> reply. HFL's Stage 1 and the initial V are shared with LFL, in
:mod:`rayfed.protocols.federated_mf.steps`."""

from __future__ import annotations

import numpy as np

from rayfed import mf
from rayfed.actors.base import Message, StepContext
from rayfed.mf.training import descend_jointly, dp_sgd, trim_mask
from rayfed.privacy import Measurement
from rayfed.protocols.federated_mf.steps import pretrain_step, user_ratings


def _kept(ctx: StepContext, users: np.ndarray, items: np.ndarray, keep: int | None) -> np.ndarray:
    """Per-user privacy: at most θ = ``keep`` ratings per user (all of them per-rating)."""
    if keep is None:
        return np.ones(users.size, dtype=bool)
    return trim_mask(ctx.seed, users, items, ctx.meta["n"], keep)


# --- parties, VFL-SGDMF (spec §2.5): disjoint item sets ---------------------------------------------
def vfl_init_step(ctx: StepContext, *, p: int, mean: float, bound: float, trim: int | None) -> int:
    """Party: V_Fk in 𝒱 and, for per-user privacy, each user trimmed to at most θ ratings (once)."""
    items = ctx.meta["items"]
    ctx.state["v"] = mf.project(mf.init_embeddings(items.size, p, mean, ctx.rng("init", 0)), bound)
    users, item, rating = user_ratings(ctx, "train")
    keep = _kept(ctx, users, item, trim)
    local = np.searchsorted(items, item)
    ctx.state["train"] = (users[keep], local[keep], rating[keep])
    return int(keep.sum())


def vfl_local_step(
    ctx: StepContext,
    u: np.ndarray,
    *,
    round: int,
    steps: int,
    lr: float | np.ndarray,
    rate: float,
    release: Measurement | None,
    bound: float,
    m_share: float,
    sampled: str,
) -> Message:
    """Party: T' noisy local steps on (U^(k), V_Fk) from the broadcast U (``release``: the joint
    gradient sums' Gaussian; None without noise); uploads U^(k)."""
    u, ctx.state["v"], event = dp_sgd(
        ctx.noise,
        np.array(u),
        ctx.state["v"],
        ctx.state["train"],
        ctx.meta["n"],
        steps=steps,
        round=round,
        lr=lr,
        rate=rate,
        release=release,
        bound=bound,
        m_share=m_share,
        update_u=True,
        sampled=sampled,
    )
    ctx.state["u"] = u
    return Message("user_embeddings", u, to="coordinator", dp_event=event)


def vfl_finetune_step(
    ctx: StepContext,
    u: np.ndarray,
    *,
    steps: int,
    lr: float,
    rate: float,
    release: Measurement | None,
    bound: float,
    m_share: float,
    sampled: str,
) -> Message:
    """Party: κ noisy steps on V_Fk with U frozen (convex, smaller sensitivity: ``release``);
    V_Fk is published."""
    ctx.state["u"] = np.array(u)
    _, ctx.state["v"], event = dp_sgd(
        ctx.noise,
        ctx.state["u"],
        ctx.state["v"],
        ctx.state["train"],
        ctx.meta["n"],
        steps=steps,
        round=0,  # the draw counter keeps these streams apart from round 0's
        lr=lr,
        rate=rate,
        release=release,
        bound=bound,
        m_share=m_share,
        update_u=False,
        sampled=sampled,
    )
    return Message("item_embeddings", ctx.state["v"], to="coordinator", dp_event=event)


def vfl_evaluate_step(ctx: StepContext) -> tuple[float, int, float, int]:
    """Evaluation only: squared error and count on the party's test ratings, then on its training
    ratings (untrimmed; the thesis tunes the learning rate on this loss), with the final U, V_Fk."""
    out = ()
    for split in ("test", "train"):
        users, items, ratings = user_ratings(ctx, split)
        local = np.searchsorted(ctx.meta["items"], items)
        pred = np.einsum("ij,ij->i", ctx.state["u"][users], ctx.state["v"][local])
        out += (float(np.sum((pred - ratings) ** 2)), int(ratings.size))
    return out


# --- parties, HFL-SGDMF (spec §2.6): disjoint user sets ---------------------------------------------
def hfl_pretrain_step(
    ctx: StepContext,
    v: np.ndarray,
    *,
    p: int,
    mean: float,
    steps: int,
    lr: float,
    bound: float,
    trim: int | None,
) -> int:
    """Stage 1 on the party's own (untrimmed) ratings, V fixed, no noise; then the Stage-2 trimming."""
    pretrain_step(ctx, v, p=p, mean=mean, steps=steps, lr=lr, bound=bound)
    users, items, ratings = user_ratings(ctx, "train")
    keep = _kept(ctx, users, items, trim)
    ctx.state["train"] = (users[keep], items[keep], ratings[keep])
    return int(keep.sum())


def _full_u(ctx: StepContext) -> np.ndarray:
    """The party's user embeddings as rows of an n x p matrix (zero for other parties' users)."""
    u = np.zeros((ctx.meta["n"], ctx.state["u"].shape[1]))
    u[ctx.state["ids"]] = ctx.state["u"]
    return u


def hfl_local_step(
    ctx: StepContext,
    v: np.ndarray,
    *,
    round: int,
    steps: int,
    lr: float | np.ndarray,
    rate: float,
    release: Measurement | None,
    bound: float,
    sampled: str,
) -> Message:
    """Party: T' DP-SGD steps on its copy V^(k) with its pre-trained U fixed (``release``: the
    V-gradient sums' Gaussian); uploads V^(k)."""
    ctx.state["v"] = np.array(v)
    _, ctx.state["v"], event = dp_sgd(
        ctx.noise,
        _full_u(ctx),
        ctx.state["v"],
        ctx.state["train"],
        ctx.meta["n"],
        steps=steps,
        round=round,
        lr=lr,
        rate=rate,
        release=release,
        bound=bound,
        m_share=1.0,
        update_u=False,
        sampled=sampled,
    )
    return Message("item_embeddings", ctx.state["v"], to="coordinator", dp_event=event)


def hfl_finetune_step(
    ctx: StepContext, v: np.ndarray, *, steps: int, lr: float, bound: float
) -> None:
    """Stage 3: U_Uk and V^(k) jointly on the untrimmed local data, no noise, never published."""
    users, items, ratings = user_ratings(ctx, "train")
    u, v = _full_u(ctx), np.array(v)
    batch = mf.Ratings(users, items, ratings, u.shape[0], v.shape[0], 0, bound)
    u, v = descend_jointly(u, v, batch, steps=steps, lr=lr, bound=bound)
    ctx.state["u"], ctx.state["v"] = u[ctx.state["ids"]], v


def hfl_evaluate_step(ctx: StepContext) -> tuple[float, int, float, int]:
    """Evaluation only: squared error and count on the party's test ratings, then on its training
    ratings, with its U and final V^(k)."""
    out = ()
    for split in ("test", "train"):
        users, items, ratings = user_ratings(ctx, split)
        pred = np.einsum("ij,ij->i", _full_u(ctx)[users], ctx.state["v"][items])
        out += (float(np.sum((pred - ratings) ** 2)), int(ratings.size))
    return out


# --- the coordinator -------------------------------------------------------------------------------
def init_u_step(ctx: StepContext, *, n: int, p: int, mean: float, bound: float) -> Message:
    """VFL: the server's initial U in 𝒰, broadcast to the parties."""
    return Message(
        "user_embeddings",
        mf.project(mf.init_embeddings(n, p, mean, ctx.rng("init", 1)), bound),
        to="parties",
    )


def average_step(
    ctx: StepContext, uploads: dict, *, weights: dict[str, float], name: str
) -> Message:
    """Server: the weighted average Σ_k w_k X^(k) of the parties' uploads (U in VFL with w_k = m_k/m,
    V in HFL with w_k = n_k/n): a convex combination, so it stays in the clipped set; broadcast."""
    return Message(
        name, sum(weights[k] * np.asarray(up) for k, up in sorted(uploads.items())), to="parties"
    )
