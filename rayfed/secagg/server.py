"""The server side of secure aggregation: one step per phase, run by the CoordinatorActor.

The round is an explicit state machine over :class:`ServerRound`:

    ADVERTISE  --collect_keys-->   SHARE_KEYS   (U1: users whose public keys arrived)
    SHARE_KEYS --route_shares-->   MASKED_INPUT (U2: users whose encrypted shares arrived)
    MASKED_INPUT --collect_masked--> UNMASK     (U3: users whose masked input is in the sum)
    UNMASK     --finish-->         DONE         (the unmasked sum of U3's inputs)

Each transition checks that the server is in the phase it expects and that at least
``min_survivors`` users are left; otherwise the round ends with BelowThreshold. Before the unmask
request is sent the server has only masked inputs, so such an abort reveals nothing beyond the
transcript; an abort while unmasking (too few responders, or too few shares of one user) leaves it
with at most what a completed round would have given it — the sum over U3.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from rayfed.actors.base import Message, StepContext
from rayfed.errors import BelowThreshold
from rayfed.secagg import _crypto, shamir
from rayfed.secagg.client import (
    KIND_KEY,
    KIND_SELF,
    PLAINTEXT_BYTES,
    add_dealer_masks,
    chunk_rows,
)
from rayfed.secagg.spec import (
    ProtocolViolation,
    RoundSpec,
    dealer_key,
    pair_codes,
    self_codes,
    sign,
)


class Phase(enum.Enum):
    ADVERTISE = "advertise"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    DONE = "done"


@dataclass
class ServerRound:
    spec: RoundSpec
    phase: Phase = Phase.ADVERTISE
    cohort_of: dict[str, np.ndarray] = field(default_factory=dict)
    u1: np.ndarray | None = None
    c_pk: np.ndarray | None = None
    s_pk: np.ndarray | None = None
    u2: np.ndarray | None = None
    u3: np.ndarray | None = None
    graph_seed: int | None = None
    y_sum: np.ndarray | None = None
    counts: dict[str, int] = field(default_factory=dict)


def _state(ctx: StepContext, spec: RoundSpec, expect: Phase) -> ServerRound:
    rounds = ctx.state.setdefault("secagg_server", {})
    if expect is Phase.ADVERTISE:
        rounds.pop(spec.round - 1, None)
        rounds[spec.round] = ServerRound(spec)
    st = rounds[spec.round]
    if st.phase is not expect:
        raise ProtocolViolation(f"server is in phase {st.phase.value}, a {expect.value} step came")
    return st


def _quorum(st: ServerRound, phase: str, alive: int) -> None:
    st.counts[phase] = int(alive)
    if alive < st.spec.min_survivors:
        raise BelowThreshold(phase, int(alive), st.spec.min_survivors, st.spec.round)


def _concat(replies: dict, key: str, dtype, width: int | None = None) -> np.ndarray:
    parts = [np.asarray(r[key]) for r in replies.values() if key in r]
    if not parts:
        return np.zeros((0,) if width is None else (0, width), dtype=dtype)
    return np.concatenate(parts).astype(dtype, copy=False)


# --- transitions ---------------------------------------------------------------------------------
def collect_keys(
    ctx: StepContext, spec: RoundSpec, replies: dict, beacon: int | None = None
) -> Message:
    """U1 and the public-key table (sorted by position), broadcast to the cohorts; the graph's
    seed is the PKI's ``beacon`` when there is one (a secure consistency round)."""
    st = _state(ctx, spec, Phase.ADVERTISE)
    st.cohort_of = {name: np.asarray(r["pos"]) for name, r in replies.items()}
    pos = _concat(replies, "pos", np.int64)
    order = np.argsort(pos)
    st.u1 = pos[order]
    _quorum(st, "advertise", st.u1.size)
    st.graph_seed = _graph_seed(ctx, spec) if beacon is None else int(beacon)
    table: dict = {"pos": st.u1, "graph_seed": st.graph_seed}
    if spec.mode in ("secure", "simulation"):
        st.c_pk = _concat(replies, "c_pk", np.uint8, 32)[order]
        st.s_pk = _concat(replies, "s_pk", np.uint8, 32)[order]
        table.update(c_pk=st.c_pk, s_pk=st.s_pk)
        if spec.consistency:
            table["sign_pk"] = _concat(replies, "sign_pk", np.uint8, 32)[order]
            table["key_sig"] = _concat(replies, "key_sig", np.uint8, 64)[order]
    st.phase = Phase.SHARE_KEYS
    return Message("key_table", table, to=spec.clients)


def _graph_seed(ctx: StepContext, spec: RoundSpec) -> int:
    """The seed of the neighbour graph's permutation. In a secure round the server draws it from
    the OS once every user has advertised, so nobody could have chosen whom to corrupt by it (the
    parameter finder's bounds assume exactly that); otherwise it is the run's seed (reproducible,
    and known in advance to anyone who has it)."""
    if spec.mode != "secure":
        return int(ctx.seed)
    return int.from_bytes(ctx.noise.secret_bytes("secagg-graph", 8, spec.round), "little")


def route_shares(ctx: StepContext, spec: RoundSpec, replies: dict) -> dict[str, Message]:
    """U2, and each cohort's incoming ciphertexts (the server only routes: it cannot read them)."""
    st = _state(ctx, spec, Phase.SHARE_KEYS)
    st.u2 = np.sort(_concat(replies, "pos", np.int64))
    _quorum(st, "share_keys", st.u2.size)
    st.phase = Phase.MASKED_INPUT
    out = {}
    receiver = _concat(replies, "receiver", np.int64)
    sender = _concat(replies, "sender", np.int64)
    ct = _concat(replies, "ct", np.uint8, PLAINTEXT_BYTES + _crypto.TAG_BYTES)
    in_u2 = np.zeros(spec.n, dtype=bool)
    in_u2[st.u2] = True
    keep = in_u2[sender]
    receiver, sender, ct = receiver[keep], sender[keep], ct[keep]
    cohort_index = np.full(spec.n, -1, dtype=np.int64)
    names = sorted(st.cohort_of)
    for i, name in enumerate(names):
        cohort_index[st.cohort_of[name]] = i
    dest = cohort_index[receiver]
    for i, name in enumerate(names):
        if name not in replies:
            continue
        mine = dest == i
        payload = {"u2": st.u2}
        if spec.mode in ("secure", "simulation"):
            payload.update(sender=sender[mine], receiver=receiver[mine], ct=ct[mine])
        out[name] = Message("routed_shares", payload, to=name)
    return out


def route_context(ctx: StepContext, spec: RoundSpec) -> Message:
    """What the shards need to route shares: each cohort's user positions (from advertise)."""
    st = _state(ctx, spec, Phase.SHARE_KEYS)
    return Message("route_context", dict(st.cohort_of), to="shards")


def shard_route(
    ctx: StepContext, spec: RoundSpec, cohort_of: dict, replies: dict, owned: tuple[int, int]
) -> dict[str, Message]:
    """One shard's part of :func:`route_shares`: the shares whose receiver it owns (every cohort
    sent it only those), forwarded to the receiver's cohort, and U2 for the coordinator."""
    u2 = np.sort(_concat(replies, "pos", np.int64))
    if u2.size < spec.min_survivors:  # the coordinator's quorum check, before routing anything
        raise BelowThreshold("share_keys", int(u2.size), spec.min_survivors, spec.round)
    lo, hi = owned
    receiver = _concat(replies, "receiver", np.int64)
    sender = _concat(replies, "sender", np.int64)
    ct = _concat(replies, "ct", np.uint8, PLAINTEXT_BYTES + _crypto.TAG_BYTES)
    in_u2 = np.zeros(spec.n, dtype=bool)
    in_u2[u2] = True
    keep = in_u2[sender] & (receiver >= lo) & (receiver < hi)
    receiver, sender, ct = receiver[keep], sender[keep], ct[keep]
    cohort_index = np.full(spec.n, -1, dtype=np.int64)
    names = sorted(cohort_of)
    for i, name in enumerate(names):
        cohort_index[np.asarray(cohort_of[name])] = i
    dest = cohort_index[receiver]
    out = {"coordinator": Message("u2", {"u2": u2}, to="coordinator")}
    for i, name in enumerate(names):
        if name not in replies:
            continue
        mine = dest == i
        payload = {}
        if spec.mode in ("secure", "simulation"):
            payload.update(sender=sender[mine], receiver=receiver[mine], ct=ct[mine])
        out[name] = Message("routed_shares", payload, to=name)
    return out


def collect_u2(ctx: StepContext, spec: RoundSpec, parts: dict) -> Message:
    """The coordinator's end of a sharded route_shares: U2 (every shard counted the same)."""
    st = _state(ctx, spec, Phase.SHARE_KEYS)
    seen = [np.asarray(parts[name]["u2"]) for name in sorted(parts)]
    if any(not np.array_equal(u2, seen[0]) for u2 in seen[1:]):
        raise ProtocolViolation("the server shards counted different U2s")
    st.u2 = seen[0]
    _quorum(st, "share_keys", st.u2.size)
    st.phase = Phase.MASKED_INPUT
    return Message("u2", {"u2": st.u2}, to="cohorts")


def collect_masked(ctx: StepContext, spec: RoundSpec, replies: dict) -> Message:
    """U3 and the running sum of masked inputs; asks the survivors to unmask."""
    st = _state(ctx, spec, Phase.MASKED_INPUT)
    pos = _concat(replies, "pos", np.int64)
    st.u3 = np.sort(pos)
    _quorum(st, "masked_input", st.u3.size)
    total = np.zeros(spec.dim, dtype=np.uint64)
    for name in sorted(replies):
        y = np.asarray(replies[name]["y"])
        if y.size:
            total += y.sum(axis=0, dtype=np.uint64)
    st.y_sum = total
    if spec.consistency:
        st.phase = Phase.CONSISTENCY
        return Message("sign_request", {"survivors": st.u3}, to=spec.clients)
    st.phase = Phase.UNMASK
    return Message("unmask_request", _unmask_request(st), to=spec.clients)


def _unmask_request(st: ServerRound) -> dict:
    return {"survivors": st.u3, "dropped": np.setdiff1d(st.u2, st.u3)}


def collect_signatures(ctx: StepContext, spec: RoundSpec, replies: dict) -> Message:
    """The consistency round: the survivors' signatures on U3 go out with the unmask request,
    so every user can check that more than (n + c)/2 users signed the list it signed."""
    st = _state(ctx, spec, Phase.CONSISTENCY)
    signers = _concat(replies, "pos", np.int64)
    _quorum(st, "consistency", signers.size)
    needed = spec.signatures_needed()
    if signers.size < needed:  # the users would refuse to unmask: abort now, revealing nothing
        raise BelowThreshold(
            "consistency",
            int(signers.size),
            needed,
            spec.round,
            what="signatures on U3",
            needed="signatures the users require",
        )
    signatures = _concat(replies, "sig", np.uint8, 64)
    st.phase = Phase.UNMASK
    payload = {**_unmask_request(st), "signers": signers, "signatures": signatures}
    return Message("unmask_request", payload, to=spec.clients)


def _pick_shares(
    owner, holder, share, owners_needed: np.ndarray, t: int, phase: str, spec: RoundSpec
):
    """The first t shares (by holder position) of each needed owner: xs (S, t), ys (S, t, CHUNKS)."""
    if owners_needed.size == 0:
        return np.zeros((0, t), np.int64), np.zeros((0, t, shamir.CHUNKS), np.int64)
    order = np.lexsort((holder, owner))
    owner, holder, share = owner[order], holder[order], share[order]
    starts = np.searchsorted(owner, owners_needed, side="left")
    ends = np.searchsorted(owner, owners_needed, side="right")
    have = ends - starts
    if have.min() < t:
        raise _short_of_shares(phase, have, owners_needed, t, spec)
    idx = starts[:, None] + np.arange(t)[None, :]
    return holder[idx] + 1, share[idx]


def _reconstruct_complete(owner, holder, share, owners_needed, responders, spec: RoundSpec):
    """Complete graph: every responder holds a share of every owner, so each owner's holder set can
    be C = the first t+1 responders minus one point (the owner itself, or else the last one), and
    all their Lagrange coefficients come from one O(t²) computation. None if a share is missing."""
    t = spec.threshold
    if responders.size < t + 1:
        return None
    c = responders[: t + 1]
    lam = shamir.lagrange_leave_one_out(c + 1)
    where = np.searchsorted(c, owners_needed)
    inside = (where <= t) & (c[np.minimum(where, t)] == owners_needed)
    removed = np.where(inside, where, t)
    codes = owner.astype(np.int64) * spec.n + holder
    order = np.argsort(codes)
    want = owners_needed[:, None].astype(np.int64) * spec.n + c[None, :]
    at = np.minimum(np.searchsorted(codes[order], want), codes.size - 1)
    found = codes[order][at] == want
    found[np.arange(owners_needed.size), removed] = True  # the removed point has weight 0
    if not found.all():
        return None
    ys = np.where(found[:, :, None], share[order][at], 0)
    return shamir.combine(lam[removed], ys)


def _reconstruct(
    owner, holder, share, owners_needed, spec: RoundSpec, phase: str, responders: np.ndarray
) -> np.ndarray:
    if spec.complete and owners_needed.size:
        fast = _reconstruct_complete(owner, holder, share, owners_needed, responders, spec)
        if fast is not None:
            return fast
    xs, ys = _pick_shares(owner, holder, share, owners_needed, spec.threshold, phase, spec)
    if xs.shape[0] == 0:
        return np.zeros((0, 32), np.uint8)
    return shamir.reconstruct(xs, ys)


def finish(ctx: StepContext, spec: RoundSpec, replies: dict) -> dict:
    """Reconstruct what the survivors revealed, remove every mask, decode the sum of U3's inputs."""
    st = _state(ctx, spec, Phase.UNMASK)
    responders = np.sort(_concat(replies, "pos", np.int64))
    _quorum(st, "unmask", responders.size)
    view = _view(ctx, spec, st)
    correction = _correction(spec, view, replies, responders, 0, spec.n)
    return _done(spec, st, st.y_sum - correction)


# --- the sharded server ----------------------------------------------------------------------------
# With S >= 2 server shards (ServerShardActor), shard i owns the user positions
# [bounds(n, S, i)): it reconstructs its owners' self-mask seeds and dropped keys, expands the masks
# to remove and answers one partial correction (dim words, a wrap-around uint64 sum); the
# coordinator subtracts the partials from y_sum. Sums mod 2^64 are order-free, so the result is
# bit-identical to :func:`finish`.
def bounds(n: int, shards: int, index: int) -> tuple[int, int]:
    """The contiguous position range [lo, hi) that shard ``index`` of ``shards`` owns."""
    return index * n // shards, (index + 1) * n // shards


def shard_ranges(n: int, names: list[str]) -> dict[str, tuple[int, int]]:
    """Each shard ``shard-<i>`` and the contiguous positions [lo, hi) it owns: shard i owns
    range i, by its numeric index (a text sort puts ``shard-10`` before ``shard-2``)."""
    ordered = sorted(names, key=lambda name: int(name.rsplit("-", 1)[1]))
    return {name: bounds(n, len(ordered), i) for i, name in enumerate(ordered)}


def finish_context(ctx: StepContext, spec: RoundSpec) -> Message:
    """What every shard needs of the coordinator's round state (O(n), never O(n·k)): the key
    table, U2, U3, the graph's seed and, in dealer mode, the dealer's key."""
    st = _state(ctx, spec, Phase.UNMASK)
    view = _view(ctx, spec, st)
    view["counts"] = dict(st.counts)
    return Message("finish_context", view, to="shards")


def shard_finish(
    ctx: StepContext, spec: RoundSpec, view: dict, replies: dict, owned: tuple[int, int]
) -> Message:
    """One shard's part of :func:`finish`: the correction for the owners in ``owned`` = [lo, hi),
    from each cohort's shares of those owners (and all its responders' positions)."""
    responders = np.sort(_concat(replies, "pos", np.int64))
    partial = {"correction": np.zeros(spec.dim, np.uint64), "responders": int(responders.size)}
    if responders.size < spec.min_survivors:  # the coordinator's quorum check aborts the round
        return Message("partial_correction", partial, to="coordinator")
    lo, hi = owned
    try:
        partial["correction"] = _correction(spec, view, replies, responders, lo, hi)
    except BelowThreshold as err:  # the coordinator raises the fewest of all shards'
        partial["deficit"] = {
            "stage": getattr(err, "stage", 0),
            "alive": err.alive,
            "position": err.position,
            "threshold": err.threshold,
            "what": err.what,
            "needed": err.needed,
        }
    return Message("partial_correction", partial, to="coordinator")


def finish_sharded(ctx: StepContext, spec: RoundSpec, partials: dict) -> dict:
    """The coordinator's end of a sharded finish: y_sum minus every shard's correction."""
    st = _state(ctx, spec, Phase.UNMASK)
    counted = {int(p["responders"]) for p in partials.values()}
    if len(counted) != 1:
        raise ProtocolViolation(
            f"the server shards counted different responders: {sorted(counted)}"
        )
    (responders,) = counted
    _quorum(st, "unmask", responders)
    deficits = [p["deficit"] for p in partials.values() if "deficit" in p]
    if (
        deficits
    ):  # as finish: self masks before dropped keys, then the fewest shares, lowest position
        d = min(deficits, key=lambda d: (d["stage"], d["alive"], d["position"]))
        raise BelowThreshold(
            "unmask", d["alive"], d["threshold"], spec.round, what=d["what"], needed=d["needed"]
        )
    total = st.y_sum.copy()
    for name in sorted(partials):
        total -= np.asarray(partials[name]["correction"], dtype=np.uint64)
    return _done(spec, st, total)


def _view(ctx: StepContext, spec: RoundSpec, st: ServerRound) -> dict:
    view = {"u1": st.u1, "s_pk": st.s_pk, "u2": st.u2, "u3": st.u3, "graph_seed": st.graph_seed}
    if spec.mode == "dealer":
        view["dealer_key"] = dealer_key(ctx.seed, spec.round)
    return view


def _done(spec: RoundSpec, st: ServerRound, total: np.ndarray) -> dict:
    dropped = np.setdiff1d(st.u2, st.u3)
    words = spec.encoding.reduce(total)
    st.phase = Phase.DONE
    st.y_sum = None
    return {
        "sum": spec.encoding.decode(words),
        "words": words,
        "survivors": spec.registry[st.u3],
        "dropped_after_sharing": spec.registry[dropped],
        "counts": dict(st.counts),
        "graph_seed": st.graph_seed,
    }


def _correction(
    spec: RoundSpec, view: dict, replies: dict, responders: np.ndarray, lo: int, hi: int
) -> np.ndarray:
    """The masks to subtract from y_sum for the owners at positions [lo, hi): their self masks if
    in U3, the pairwise masks their survivor neighbours added if dropped (U2 minus U3)."""
    u3 = view["u3"]
    dropped = np.setdiff1d(view["u2"], u3)
    own_u3 = u3[(u3 >= lo) & (u3 < hi)]
    own_dropped = dropped[(dropped >= lo) & (dropped < hi)]
    total = np.zeros(spec.dim, dtype=np.uint64)
    seed = view["graph_seed"]
    if spec.mode in ("dealer", "plain"):
        # no shares to collect, but the same abort rule as the real protocol: every secret the
        # server would need must be held by at least t responding neighbours
        _check_recoverable(spec, seed, np.union1d(own_u3, own_dropped), responders)
    if spec.mode == "dealer":
        _remove_dealer_masks(view["dealer_key"], spec, u3, own_u3, own_dropped, total, seed)
    elif spec.mode != "plain":
        owner = _concat(replies, "owner", np.int64)
        rows = (owner >= lo) & (owner < hi)
        owner = owner[rows]
        holder = _concat(replies, "holder", np.int64)[rows]
        kind = _concat(replies, "kind", np.uint8)[rows]
        share = _concat(replies, "share", np.int64, shamir.CHUNKS)[rows]
        if share.size and (share.min() < 0 or share.max() >= shamir.P):  # would wrap in combine
            raise ProtocolViolation("a cohort sent a Shamir share outside [0, p) to unmask")
        self_rows, key_rows = kind == KIND_SELF, kind == KIND_KEY
        b = _reconstruct(
            owner[self_rows],
            holder[self_rows],
            share[self_rows],
            own_u3,
            spec,
            "unmask",
            responders,
        )
        for seed_bytes in b:
            total += _crypto.expand(seed_bytes.tobytes(), spec.dim, spec.word_dtype).astype(
                np.uint64
            )
        try:
            keys = _reconstruct(
                owner[key_rows],
                holder[key_rows],
                share[key_rows],
                own_dropped,
                spec,
                "unmask",
                responders,
            )
        except BelowThreshold as err:  # checked after every owner's self mask (see finish_sharded)
            err.stage = 1
            raise
        _add_dropped_pair_masks(spec, view, own_dropped, keys, total)
    return total


def _check_recoverable(
    spec: RoundSpec, seed: int, owners: np.ndarray, responders: np.ndarray
) -> None:
    """BelowThreshold unless each owner has at least t neighbours among the responders."""
    if owners.size == 0:
        return
    responding = np.zeros(spec.n, dtype=bool)
    responding[responders] = True
    graph = spec.graph(seed)
    if graph.complete:
        have = responders.size - responding[owners]
    else:  # in chunks of owners: never the (n x k) neighbour table at once
        step = chunk_rows(graph.degree)
        have = np.concatenate(
            [graph.count_in(owners[a : a + step], responding) for a in range(0, owners.size, step)]
        )
    if have.min() < spec.threshold:
        raise _short_of_shares("unmask", have, owners, spec.threshold, spec)


def _short_of_shares(phase: str, have, owners, t: int, spec: RoundSpec) -> BelowThreshold:
    """The abort for owners with fewer than t shares: the fewest, at its lowest position (kept
    as ``position`` for a sharded server, whose coordinator picks the same one of all shards)."""
    worst = int(owners[np.argmin(have)])
    err = BelowThreshold(
        phase,
        int(have.min()),
        t,
        spec.round,
        what=f"shares of the user at position {worst}",
        needed="Shamir threshold t",
    )
    err.position = worst
    return err


def _add_dropped_pair_masks(spec: RoundSpec, view: dict, dropped, keys, total) -> None:
    """For each dropped u and each survivor neighbour v, v's input carried sign(v, u)·PRG(s_vu):
    the server recomputes s_vu = X25519(s_u, s_v) from u's reconstructed key and adds it to the
    correction it will subtract."""
    u1, s_pk_table = view["u1"], view["s_pk"]
    graph = spec.graph(view["graph_seed"])
    in_u3 = np.zeros(spec.n, dtype=bool)
    in_u3[view["u3"]] = True
    nb = graph.neighbours(dropped) if dropped.size else np.zeros((0, 0), np.int64)
    s_pk = _crypto.public_keys(s_pk_table) if dropped.size else []
    for i, u in enumerate(dropped.tolist()):
        sk, pk = _crypto.keypair(keys[i].tobytes())
        row = np.searchsorted(u1, u)
        if pk != s_pk_table[row].tobytes():
            raise ProtocolViolation(
                f"the key reconstructed for position {u} does not match its public key"
            )
        for v in nb[i][in_u3[nb[i]]].tolist():
            secret = _crypto.shared_secret(sk, s_pk[np.searchsorted(u1, v)])
            mask = _crypto.expand(
                _crypto.hkdf(secret, _crypto.INFO_MASK, spec.salt), spec.dim, spec.word_dtype
            )
            if v > u:
                total += mask.astype(np.uint64)
            else:
                total -= mask.astype(np.uint64)


def _remove_dealer_masks(
    key: bytes, spec: RoundSpec, u3, own_u3, dropped, total, seed: int
) -> None:
    """The dealer knows every seed: the correction holds ``own_u3``'s self masks and, for each
    dropped u, the masks its survivor neighbours v (in ``u3``) added (sign(v, u))."""
    acc = np.zeros((1, spec.dim), dtype=spec.word_dtype)
    add_dealer_masks(
        key, spec, self_codes(own_u3)[:, None], np.ones((own_u3.size, 1), np.int8), acc
    )
    if dropped.size:
        graph = spec.graph(seed)
        in_u3 = np.zeros(spec.n, dtype=bool)
        in_u3[u3] = True
        step = chunk_rows(graph.degree)  # in chunks of dropped users: O(k) each
        for a in range(0, dropped.size, step):
            part = dropped[a : a + step, None]
            nb = graph.neighbours(part[:, 0])
            signs = np.where(in_u3[nb], sign(nb, part), 0).astype(np.int8)
            add_dealer_masks(key, spec, pair_codes(nb, part, spec.n), signs, acc)
    total += acc[0].astype(np.uint64)
