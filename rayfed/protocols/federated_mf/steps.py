"""Steps both settings share: a user's own ratings and Stage-1 pre-training (LFL's cohorts, HFL's
parties), and the coordinator's initial V. Each setting's own steps are in ``lfl.steps`` and
``partitioned.steps``."""

from __future__ import annotations

import numpy as np

from rayfed import mf, rng
from rayfed.actors.base import Message, StepContext
from rayfed.mf.training import descend_users
from rayfed.secagg.client import registered_users


# --- users (LFL cohorts, HFL parties) --------------------------------------------------------------
def user_ratings(ctx: StepContext, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(user ids, items, ratings) of the member's ``split`` ("train" or "test")."""
    t = ctx.table
    keep = np.asarray(t.column("split").to_numpy(zero_copy_only=False)) == split
    return (
        t.column("user_id").to_numpy()[keep],
        t.column("item").to_numpy()[keep],
        t.column("rating").to_numpy()[keep],
    )


def descend(ctx: StepContext, v: np.ndarray, *, steps: int, lr: float, bound: float) -> None:
    """Local, noiseless steps on the member's user embeddings with V fixed."""
    users, items, ratings = user_ratings(ctx, "train")
    rows = np.searchsorted(ctx.state["ids"], users)
    ctx.state["u"] = descend_users(
        ctx.state["u"], v, rows, items, ratings, steps=steps, lr=lr, bound=bound
    )


def pretrain_step(
    ctx: StepContext, v: np.ndarray, *, p: int, mean: float, steps: int, lr: float, bound: float
) -> int:
    """Stage 1: initialise u_i (keyed per user) and pre-train it locally with V fixed. The users
    are the member's registered ones (an LFL cohort's, from the plan) or those its table holds."""
    ids = registered_users(ctx)
    ctx.state["ids"] = ids
    ctx.state["u"] = mf.project(
        rng.keyed_uniform(ctx.seed, "init", 0, ids, p) * 2 * np.sqrt(mean / p), bound
    )
    descend(ctx, v, steps=steps, lr=lr, bound=bound)
    return int(ids.size)


# --- the driver: evaluation only -----------------------------------------------------------------
#: the central baseline's epochs of the reference SGD (spec §5.4)
CENTRAL_EPOCHS = 30


def central_test_mse(evaluation: dict, *, rank: int, seed: int) -> float:
    """The non-private central baseline: SGD on the pooled training ratings (the plan's
    evaluation data, never given to a member), its test MSE."""
    return mf.central_sgd(
        evaluation["train"],
        evaluation["test"],
        p=rank,
        epochs=CENTRAL_EPOCHS,
        rng=rng.stream(seed, "init", 0, "central-baseline"),
    ).test_mse


# --- the coordinator -------------------------------------------------------------------------------
def init_v_step(ctx: StepContext, *, m: int, p: int, mean: float, bound: float) -> Message:
    """The server's V in 𝒱, kept as its state and broadcast."""
    ctx.state["v"] = mf.project(mf.init_embeddings(m, p, mean, ctx.rng("init", 0)), bound)
    return Message("item_embeddings", ctx.state["v"], to="cohorts")
