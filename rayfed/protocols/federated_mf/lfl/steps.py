"""The step functions of ``federated-mf``'s LFL setting, by role: plain functions of (ctx, inputs)
-> reply. Stage 1 (``pretrain_step``) and the initial V (``init_v_step``) are shared with HFL, in
:mod:`rayfed.protocols.federated_mf.steps`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from dp_accounting import dp_event

from rayfed import mf, rng
from rayfed.actors.base import Message, StepContext
from rayfed.dropout import DropoutSchedule
from rayfed.mf import gddr
from rayfed.mf.training import descend_users
from rayfed.privacy import Measurement
from rayfed.privacy.ledger import RUN_SCOPE
from rayfed.protocols.federated_mf.lfl.params import GddrParams
from rayfed.protocols.federated_mf.steps import descend, user_ratings
from rayfed.secagg.ddp import DdpPlan
from rayfed.secagg.encoding import RingWords


# --- cohorts (users) -------------------------------------------------------------------------------
def lfl_round1_inputs(
    ctx: StepContext,
    round: int,
    ids: np.ndarray,
    v: np.ndarray,
    release: Measurement,
    pipeline: DdpPlan | None = None,
) -> tuple[np.ndarray | RingWords, dp_event.DpEvent]:
    """Round 1 for the online users ``ids``: (G_i + ξ_i flattened (m·p), the event of the sum), as
    secure aggregation's input (:func:`rayfed.secagg.secure_sum` fixes this signature), drawn by
    ``release`` (the distributed Gaussian: each user's share keyed by its id). A registered user
    with no training rating sends the zero row with its share (a dummy row).

    With the integer mechanism's ``pipeline`` (the iteration's: its rotation and rounding keyed
    by round), G_i is clipped, rotated, scaled and conditionally rounded (the rounding keyed by
    user id), ``release`` adds the integer share, and the message is its ring words mod
    2^bits."""
    grads = _gradient_rows(ctx, round, ids, v)
    # the users whose Round-1 share this incarnation drew (not checkpointed: a restarted cohort
    # has drawn none, and in a secure run it could not regenerate them for Round 2)
    ctx.state["round1_drawn"] = (round, np.asarray(ids))
    if pipeline is None:
        return release(ctx.noise, grads, round=round, ids=ids)
    ints, _ = pipeline.quantise(grads, pipeline.keyed_rounding(ctx.noise, ids))
    noisy, event = release(ctx.noise, ints, round=round, ids=ids)
    return pipeline.to_words(np.asarray(noisy)), event


def _gradient_rows(ctx: StepContext, round: int, ids: np.ndarray, v: np.ndarray) -> np.ndarray:
    """G_i for the users ``ids`` (flattened, m·p): -2(x - ⟨u_i, v_j⟩)u_i in row j of one
    rating j sampled per user (keyed by user id: the sample is secret too); zero for a user
    with no training rating."""
    all_ids = ctx.state["ids"]
    rows = np.searchsorted(all_ids, ids)
    users, items, ratings = user_ratings(ctx, "train")
    urows = np.searchsorted(all_ids, users)
    order = np.argsort(urows, kind="stable")
    counts = np.bincount(urows, minlength=all_ids.size)
    starts = np.cumsum(counts) - counts
    draw = ctx.noise.user_uniform("sample", round, ids, 1)[:, 0]  # the sampled rating is secret too
    rated = np.flatnonzero(counts[rows] > 0)
    pick = starts[rows[rated]] + np.floor(draw[rated] * counts[rows[rated]]).astype(np.int64)
    j, x = items[order][pick], ratings[order][pick]
    u = ctx.state["u"][rows[rated]]
    m, p = v.shape
    grads = np.zeros((len(ids), m * p))
    grad = -2.0 * (x - np.einsum("ij,ij->i", u, v[j]))[:, None] * u
    grads.reshape(len(ids), m, p)[rated, j] = grad
    return grads


def lfl_round2_step(
    ctx: StepContext,
    u1: np.ndarray,
    *,
    round: int,
    width: int,
    release: Measurement,
    round1: Measurement,
    zeta2: float,
    dropout: float,
) -> Message:
    """Round 2: each Round-1 survivor (``u1``) still online sends ξ̄_i = -ξ_i + ξ'_i: ξ_i
    regenerated from its own noise source, ξ'_i ~ N(0, ζ2 σ²) with ζ2 from the realised |U1|
    (``release``, part of the iteration's Round-1 release ``round1``, whose event covers it) —
    for the users whose share it can regenerate (:func:`_regenerable`).

    ζ2 comes from the server. Under a malicious server (the cohort's own ``threat_model``, set by
    the plan, not by the caller), whose |U1| the users cannot check, a user takes no less than
    the worst case's ζ2 (|U1| = t, the event's): a server sending a tiny ζ2 would otherwise have
    every message reveal its Round-1 share."""
    if not trusts_counts(ctx):
        zeta2 = max(zeta2, round1.mechanism.replacement)
    ids = _round2_senders(ctx, u1, round, dropout)
    values, _ = release(
        ctx.noise,
        np.zeros((ids.size, width)),  # no data: the message replaces noise only
        round=round,
        ids=ids,
        part_of=round1,
        replacement=zeta2,
    )
    return Message("noise_replacement", {"ids": ids, "values": values}, to="coordinator")


def lfl_round2_removal_step(
    ctx: StepContext,
    u1: np.ndarray,
    *,
    round: int,
    release: Measurement,
    round1: Measurement,
    upto: int,
    dropout: float,
    pipeline: DdpPlan,
) -> Message:
    """Round 2 of the integer mechanism: each Round-1 survivor (``u1``) still online sends
    −(components 0 … upto−1 of its Round-1 Skellam share), regenerated from its own noise source
    (``release``: :class:`~rayfed.privacy.measurement.SkellamExcess`, part of the iteration's
    Round-1 release ``round1``, whose event covers what stays), as ring words mod 2^bits — the
    same users as the Gaussian's Round 2 (:func:`_regenerable`).

    ``upto`` follows the server's |U1|. Under a malicious server (the cohort's own
    ``threat_model``), whose count the users cannot check — one claiming more survivors would
    have them remove too much — a user removes nothing and keeps its whole share, the worst case
    the event is charged for."""
    if not trusts_counts(ctx):
        upto = 0
    ids = _round2_senders(ctx, u1, round, dropout)
    values, _ = release(
        ctx.noise,
        np.zeros((ids.size, pipeline.padded_dim), dtype=np.int64),  # no data: noise only
        round=round,
        ids=ids,
        part_of=round1,
        upto=upto,
    )
    words = pipeline.to_words(np.asarray(values)).words
    return Message("noise_removal", {"ids": ids, "words": words}, to="coordinator")


def trusts_counts(ctx: StepContext) -> bool:
    """Whether the cohort's users take the server's survivor count as given: only against the
    semi-honest server the plan registered them with (``meta["threat_model"]``)."""
    return ctx.meta.get("threat_model", "semi-honest") == "semi-honest"


def _round2_senders(ctx: StepContext, u1: np.ndarray, round: int, dropout: float) -> np.ndarray:
    """The cohort's Round-1 survivors online for Round 2 whose share it can regenerate."""
    ids = ctx.state["ids"][np.isin(ctx.state["ids"], u1)]
    online = rng.keyed_uniform(ctx.seed, "dropout-round2", round, ids, 1)[:, 0] >= dropout
    return ids[online & _regenerable(ctx, round, ids)]


def _regenerable(ctx: StepContext, round: int, ids: np.ndarray) -> np.ndarray:
    """Which users' Round-1 share this cohort can regenerate to cancel it: all of them in a
    seeded run (a share is keyed by the run seed, round and id); in a secure run only those this
    incarnation drew — a cohort restarted after Round 1 holds a new secret, and a replacement
    built on a share it did not add would not cancel (more noise than reported). The others
    count as Round-2 dropouts, which the Round-1 charge already covers."""
    if not ctx.noise.secure:
        return np.ones(ids.size, dtype=bool)
    drawn_round, drawn = ctx.state.get("round1_drawn", (None, np.array([], dtype=np.int64)))
    if drawn_round != round:
        return np.zeros(ids.size, dtype=bool)
    return np.isin(ids, drawn)


def gddr_report_step(
    ctx: StepContext,
    v: np.ndarray,
    *,
    round: int,
    params: GddrParams,
    release: Measurement,
    schedule: DropoutSchedule,
    lr: float,
    bound: float,
) -> Message:
    """GD-DR, one iteration for every online user: its one-bit report of one sampled entry of
    G_i = Φ∇_i (``release``: :class:`~rayfed.privacy.measurement.OneBitReport`), then one local
    step on u_i with V fixed. The message carries the report's ε0-LDP event as shuffled among at
    least ``params.quorum`` users (the charge), run-wide: every user's report is part of one
    shuffled release."""
    ids = ctx.state["ids"]
    online = schedule.one_message(ctx.seed, round, ids)[0]  # a dropout sends nothing
    users, items, ratings = user_ratings(ctx, "train")
    rows = np.searchsorted(ids, users)
    u = ctx.state["u"]
    reporting = np.flatnonzero(online)
    phi = params.projection
    index = release.mechanism.index(ctx.noise, ids[reporting], round=round)
    entries = gddr.projected_entries(u, v, phi, rows, items, ratings, index, reporting)
    (index, y), event = release(ctx.noise, entries, round=round, ids=ids[reporting], index=index)
    stepped = descend_users(u, v, rows, items, ratings, steps=1, lr=lr, bound=bound)
    ctx.state["u"] = np.where(online[:, None], stepped, u)  # offline users did not get V
    return Message(
        "ldp_reports",
        {"index": index, "y": y},  # no ids: the shuffler would show the server the multiset
        to="coordinator",
        dp_event=event,
        scope=RUN_SCOPE,
    )


def checkpoint_step(ctx: StepContext) -> pa.Table:
    """The users' state a restarted cohort resumes from: their ids and u_i rows, as Arrow."""
    u = ctx.state["u"]
    values = pa.array(np.ascontiguousarray(u).reshape(-1))
    return pa.table(
        {
            "user_id": ctx.state["ids"],
            "u": pa.FixedSizeListArray.from_arrays(values, u.shape[1]),
        }
    )


def restore_step(ctx: StepContext, state: pa.Table) -> None:
    """A restarted cohort takes its users' state back from their checkpoint."""
    ctx.state["ids"] = state.column("user_id").to_numpy()
    flat = state.column("u").combine_chunks().flatten().to_numpy()
    ctx.state["u"] = flat.reshape(state.num_rows, -1).copy()


def finetune_step(ctx: StepContext, v: np.ndarray, *, steps: int, lr: float, bound: float) -> None:
    """Stage 3: local, unpublished steps on each user's u_i against the final V."""
    descend(ctx, v, steps=steps, lr=lr, bound=bound)


def evaluate_step(ctx: StepContext, v: np.ndarray, *, split: str = "test") -> tuple[float, int]:
    """Evaluation only (outside the protocol): squared error and count on the users' test (or
    training) ratings."""
    users, items, ratings = user_ratings(ctx, split)
    rows = np.searchsorted(ctx.state["ids"], users)
    pred = np.einsum("ij,ij->i", ctx.state["u"][rows], v[items])
    return float(np.sum((pred - ratings) ** 2)), int(ratings.size)


def stopped_here_step(
    ctx: StepContext, v: np.ndarray, *, steps: int, lr: float, bound: float
) -> tuple[float, int]:
    """Evaluation only: the test error if training stopped at this V — Stage 3 on a copy of every
    user's u_i, then the squared error and count; the users' state is left as it was."""
    kept = ctx.state["u"].copy()
    try:
        finetune_step(ctx, v, steps=steps, lr=lr, bound=bound)
        return evaluate_step(ctx, v)
    finally:
        ctx.state["u"] = kept


# --- the coordinator -------------------------------------------------------------------------------
def update_v_step(
    ctx: StepContext,
    s1: np.ndarray,
    round2: dict,
    *,
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


def update_v_ring_step(
    ctx: StepContext,
    words: np.ndarray,
    round2: dict,
    *,
    pipeline: DdpPlan,
    u1: int,
    lr: float,
    bound: float,
) -> Message:
    """The integer mechanism's server: S = decode(S1 + N2 mod 2^bits), N2 the Round-2 words
    (the survivors' removed components), then V <- Π_𝒱(V - γ/|U1| S) — post-processing of the
    iteration's release. uint64 sums wrap mod 2^64, a multiple of 2^bits: exact."""
    v = ctx.state["v"]
    total = np.asarray(words).astype(np.uint64)
    for r in round2.values():
        total = total + np.asarray(r["words"]).astype(np.uint64).sum(axis=0, dtype=np.uint64)
    s = pipeline.decode(total)
    ctx.state["v"] = mf.project(v - lr / u1 * s.reshape(v.shape), bound)
    return Message("item_embeddings", ctx.state["v"], to="cohorts")


def gddr_update_step(
    ctx: StepContext, reports: dict, *, params: GddrParams, lr: float, bound: float
) -> Message:
    """GD-DR's server: V <- Π_𝒱(V - γ Φᵀ Ĝ), Ĝ the mean of the reports (post-processing of
    the shuffled release; the multiset is all it uses)."""
    v = ctx.state["v"]
    index = np.concatenate([np.asarray(r["index"], dtype=np.int64) for r in reports.values()])
    y = np.concatenate([np.asarray(r["y"], dtype=np.float64) for r in reports.values()])
    grad = gddr.estimated_gradient(params.projection, v.shape[1], index, y, params.scale)
    ctx.state["v"] = mf.project(v - lr * grad, bound)
    return Message("item_embeddings", ctx.state["v"], to="cohorts")


def current_v_step(ctx: StepContext) -> Message:
    """A skipped iteration: V unchanged, broadcast again."""
    return Message("item_embeddings", ctx.state["v"], to="cohorts")
