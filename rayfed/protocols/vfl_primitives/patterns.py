"""Pattern counting (Alg. 1) as a round of ``vfl-primitives``: lp-moment counts the patterns of
x^(j) with the heavy coordinates zeroed (or, non-interactive, of x^(j) itself), kmeans / kmedian
those of the servers' local labels, optionally only of a public sample of users (Thm B.2). Each
server's randomized response is its release (a Measurement of the plan); the CC's estimate is
pattern-count's own step."""

from __future__ import annotations

import numpy as np

from rayfed.actors.base import Message, StepContext
from rayfed.data.scaling import features_of
from rayfed.federation import Single
from rayfed.ldp.patterns import one_hot, public_sample
from rayfed.privacy import Measurement
from rayfed.protocols.pattern_count.steps import estimate_step


# --- servers ---------------------------------------------------------------------------------------
def pattern_bits_step(
    ctx: StepContext,
    heavy: dict | None,
    *,
    releases: dict[str, Measurement],
    size: int,
    round: int,
    source: str = "labels",
    sample_rate: float = 1.0,
) -> Message:
    """Server: one-hot of its per-user value — the local label (``source="labels"``), or x^(j)
    (``"column"``) with the heavy coordinates L of the CC's message ``heavy`` zeroed — and per-bit
    randomized response (its release); a value >= size encodes as all-zero. With ``sample_rate``
    < 1 only the users of the public sample S (Thm B.2; the same S at every server) are sent."""
    if source == "labels":
        values = ctx.state["labels"]
    else:
        values = features_of(ctx.table, ctx.meta["columns"])[:, 0].astype(np.int64)
        if heavy is not None:  # the CC's message {"L": ..., "M": ...}
            values[heavy["L"]] = 0
    values = np.where(values < size, values, -1)[public_sample(ctx.seed, values.size, sample_rate)]
    bits, event = releases[ctx.name](ctx.noise, one_hot(values, size), round=round)
    return Message(
        "rr_bits",
        {"bits": np.packbits(bits, axis=1), "users": int(values.size)},
        dp_event=event,
    )


# --- the round -------------------------------------------------------------------------------------
def count_patterns(
    fed,
    order: list[str],
    releases: dict[str, Measurement],
    eps_prime: float,
    heavy: Single | None,
    size: int,
    round: int,
    sample_rate: float = 1.0,
) -> np.ndarray:
    """Charge and run pattern counting over {0..size-1}^v (``releases``: the servers' randomized
    response with bias ``eps_prime``): the raw count of every pattern (C order, scaled by 1/p). ``heavy``: the CC's heavy-set message (lp-moment), passed on to the
    servers without a detour through the driver; None for the local labels. The sample S is
    public and data-independent, so sampling costs no privacy (and none is claimed from it: S is
    known)."""
    fed.charge([releases[p].charge(p) for p in order])
    bits = fed.parties.run(
        pattern_bits_step,
        heavy,
        releases=releases,
        size=size,
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
    return np.asarray(counts)
