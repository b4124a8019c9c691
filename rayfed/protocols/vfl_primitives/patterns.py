"""Pattern counting (Alg. 1) as a round of ``vfl-primitives``: lp-moment counts the patterns of
x^(j) with the heavy coordinates zeroed, kmeans / kmedian those of the servers' local labels. The
CC's estimate is pattern-count's own step."""

from __future__ import annotations

import numpy as np
from dp_accounting import dp_event

from rayfed.actors.base import Message, StepContext
from rayfed.data.scaling import features_of
from rayfed.federation import Single
from rayfed.ldp.patterns import keep_probability, one_hot, rr_event
from rayfed.privacy import binary_randomized_response
from rayfed.protocols.pattern_count.steps import estimate_step
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig


# --- servers ---------------------------------------------------------------------------------------
def pattern_bits_step(
    ctx: StepContext, heavy: dict | None, *, size: int, eps_prime: float, round: int
) -> Message:
    """Server: one-hot of its per-user value (the local label, or x^(j) with the heavy coordinates L
    zeroed), per-bit randomized response; a value >= size encodes as all-zero."""
    if heavy is None:
        values = ctx.state["labels"]
    else:  # the CC's message {"L": ..., "M": ...}
        values = features_of(ctx.table, ctx.meta["columns"])[:, 0].astype(np.int64)
        values[heavy["L"]] = 0
    values = np.where(values < size, values, -1)
    bits, event = binary_randomized_response(
        ctx.noise, one_hot(values, size), keep_probability=keep_probability(eps_prime), round=round
    )
    return Message(
        "rr_bits",
        {"bits": np.packbits(bits, axis=1), "users": int(values.size)},
        dp_event=dp_event.SelfComposedDpEvent(event, 2),
    )


# --- the round -------------------------------------------------------------------------------------
def count_patterns(
    fed,
    cfg: VflPrimitivesConfig,
    order: list[str],
    heavy: Single | None,
    size: int,
    eps: float,
    round: int,
) -> tuple[np.ndarray, float]:
    """Charge and run pattern counting at budget ``eps`` over {0..size-1}^v: the raw count of every
    pattern (C order) and the ε' used. ``heavy``: the CC's heavy-set message (lp-moment), passed
    on to the servers without a detour through the driver; None for the local labels."""
    eps_prime = cfg.eps_prime(eps)
    fed.charge([(p, "pattern counting (randomized response)", rr_event(eps_prime)) for p in order])
    bits = fed.parties.run(
        pattern_bits_step,
        heavy,
        size=size,
        eps_prime=eps_prime,
        round=round,
        phase="pattern-counting",
        members=order,
    )
    counts = fed.coordinator.call(
        estimate_step,
        bits,
        order=order,
        eps_prime=eps_prime,
        patterns=None,  # every pattern
        sample_rate=1.0,
        phase="counts",
    )
    return np.asarray(counts), eps_prime
