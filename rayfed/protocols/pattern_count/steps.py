"""The step functions of ``pattern-count``, by role: plain functions of (ctx, inputs) -> reply."""

from __future__ import annotations

import numpy as np

from rayfed.actors.base import Message, StepContext
from rayfed.ldp.patterns import encode_values, one_hot, public_sample, raw_counts
from rayfed.privacy import Measurement


# --- parties ---------------------------------------------------------------------------------------
def randomize_step(
    ctx: StepContext, *, releases: dict[str, Measurement], sample_rate: float, round: int
) -> Message:
    """Party: encode each user's values one-hot, apply per-bit RR (its release), send the
    packed bits."""
    values = encode_values(ctx.table, ctx.meta["columns"], ctx.meta["domains"])
    values = values[public_sample(ctx.seed, values.size, sample_rate)]
    onehot = one_hot(values, ctx.meta["size"])
    noisy, event = releases[ctx.name](ctx.noise, onehot, round=round)
    payload = {"bits": np.packbits(noisy, axis=1), "users": int(values.size)}
    return Message("rr_bits", payload, to="coordinator", dp_event=event)


# --- the coordinator -------------------------------------------------------------------------------
def estimate_step(
    ctx: StepContext,
    messages: dict[str, dict],
    *,
    order: list[str],
    eps_prime: float,
    patterns: np.ndarray | None,
    sample_rate: float,
) -> np.ndarray:
    """Coordinator: debias the parties' bits and estimate the raw count of every requested pattern."""
    bits = [np.unpackbits(messages[p]["bits"], axis=1, count=messages[p]["users"]) for p in order]
    return raw_counts(bits, eps_prime, patterns, sample_rate)
