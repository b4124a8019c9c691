"""The party's steps of VFL's central literature baselines (spec §2.10, Fig. 4.4), run at s = 1 on
the one party's ratings after :func:`~.steps.vfl_init_step` (V_Fk in 𝒱, trimming), and evaluated by
:func:`~.steps.vfl_evaluate_step`. The maths is in :mod:`rayfed.mf.baselines`."""

from __future__ import annotations

import numpy as np

from rayfed.actors.base import Message, StepContext
from rayfed.mf.baselines import objpert_alternation, sgld
from rayfed.privacy import Measurement


def sgld_local_step(
    ctx: StepContext,
    u: np.ndarray,
    *,
    round: int,
    steps: int,
    eta: float,
    rate: float,
    release: Measurement,
    bound: float,
    sampled: str,
) -> Message:
    """Party: ``steps`` DP-SGLD steps of size ``eta`` on (U, V) from the U it last uploaded (the server's initial U
    in round 0); uploads U, a charged release like VFL's (the chain's state is its sample)."""
    ctx.state["u"], ctx.state["v"], event = sgld(
        ctx.noise,
        np.array(u),
        ctx.state["v"],
        ctx.state["train"],
        ctx.meta["n"],
        steps=steps,
        round=round,
        step=eta,
        rate=rate,
        release=release,
        bound=bound,
        sampled=sampled,
    )
    return Message("user_embeddings", ctx.state["u"], to="coordinator", dp_event=event)


def objpert_step(
    ctx: StepContext,
    u: np.ndarray | None,
    *,
    round: int,
    reg: float,
    release: Measurement,
    bound: float,
) -> Message:
    """Party: one ObjPertb alternation (the perturbed V-solve, then the U-solve) from its own U,
    or the server's initial U (``u``, round 0); publishes V, the DP release."""
    start = np.array(u) if u is not None else ctx.state["u"]
    ctx.state["u"], ctx.state["v"], event = objpert_alternation(
        ctx.noise,
        start,
        ctx.state["train"],
        ctx.meta["items"].size,
        round=round,
        reg=reg,
        release=release,
        bound=bound,
    )
    return Message("item_embeddings", ctx.state["v"], to="coordinator", dp_event=event)
