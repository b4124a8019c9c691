"""Pattern counting (Alg. 1) as a round of ``vfl-primitives``: lp-moment counts the patterns of
x^(j) with the heavy coordinates zeroed (or, non-interactive, of x^(j) itself), kmeans / kmedian
those of the servers' local labels, optionally only of a public sample of users (Thm B.2). The
CC's estimate is pattern-count's own step."""

from __future__ import annotations

import numpy as np
from dp_accounting import dp_event

from rayfed.actors.base import Message, StepContext
from rayfed.data.scaling import features_of
from rayfed.federation import Single
from rayfed.ldp.patterns import keep_probability, one_hot, public_sample, rr_event
from rayfed.privacy import binary_randomized_response
from rayfed.protocols.pattern_count.steps import estimate_step
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig


# --- servers ---------------------------------------------------------------------------------------
def pattern_bits_step(
    ctx: StepContext,
    heavy: dict | None,
    *,
    size: int,
    eps_prime: float,
    round: int,
    source: str = "labels",
    sample_rate: float = 1.0,
) -> Message:
    """Server: one-hot of its per-user value — the local label (``source="labels"``), or x^(j)
    (``"column"``) with the heavy coordinates L of the CC's message ``heavy`` zeroed — and per-bit
    randomized response; a value >= size encodes as all-zero. With ``sample_rate`` < 1 only the
    users of the public sample S (Thm B.2; the same S at every server) are sent."""
    if source == "labels":
        values = ctx.state["labels"]
    else:
        values = features_of(ctx.table, ctx.meta["columns"])[:, 0].astype(np.int64)
        if heavy is not None:  # the CC's message {"L": ..., "M": ...}
            values[heavy["L"]] = 0
    values = np.where(values < size, values, -1)[public_sample(ctx.seed, values.size, sample_rate)]
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
    sample_rate: float = 1.0,
) -> tuple[np.ndarray, float]:
    """Charge and run pattern counting at budget ``eps`` over {0..size-1}^v: the raw count of every
    pattern (C order, scaled by 1/p) and the ε' used. ``heavy``: the CC's heavy-set message
    (lp-moment), passed on to the servers without a detour through the driver; None for the local
    labels. The sample S is public and data-independent, so sampling costs no privacy (and none
    is claimed from it: S is known)."""
    eps_prime = cfg.eps_prime(eps)
    fed.charge([(p, "pattern counting (randomized response)", rr_event(eps_prime)) for p in order])
    bits = fed.parties.run(
        pattern_bits_step,
        heavy,
        size=size,
        eps_prime=eps_prime,
        round=round,
        source="labels" if heavy is None else "column",
        sample_rate=sample_rate,
        phase="pattern-counting",
        members=order,
    )
    counts = fed.coordinator.call(
        estimate_step,
        bits,
        order=order,
        eps_prime=eps_prime,
        patterns=None,  # every pattern
        sample_rate=sample_rate,
        phase="counts",
    )
    return np.asarray(counts), eps_prime
