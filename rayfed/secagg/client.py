"""Client steps of secure aggregation, run by a UserCohortActor for all of its users at once.

Each step takes the cohort's context, the round's :class:`RoundSpec` and the server's last message,
and returns the users' messages to the server as arrays (one row per user or per user pair). Work
that is per user is vectorised (Shamir sharing, encodings, dealer masks); what is inherently per
user pair — an X25519 agreement, an AES-GCM encryption, a keystream under a pair key — is a loop
over pairs, which is the protocol's own cost.

Per-user state of the round lives in ``ctx.state["secagg"][round]``. Users drop out as the
round's availability says (:func:`rayfed.secagg.phases.drop_codes`); a user never reveals both the key share and the self-mask share of
the same peer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from dp_accounting.dp_event import DpEvent

from rayfed.actors.base import Message, StepContext
from rayfed.secagg import _crypto, shamir
from rayfed.secagg.encoding import RingWords
from rayfed.secagg.phases import ADVERTISE, MASKED_INPUT, NEVER, SHARE_KEYS, drop_codes
from rayfed.secagg.spec import (
    ProtocolViolation,
    RoundSpec,
    UnauthenticatedKeys,
    check_source,
    dealer_key,
    mask_blocks,
    pair_codes,
    self_codes,
    sign,
)

SHARE_WORDS = 2 * shamir.CHUNKS  # a key share and a self-mask share per ciphertext
PLAINTEXT_BYTES = 4 * SHARE_WORDS
KIND_KEY, KIND_SELF = 0, 1


@dataclass
class ClientRound:
    """One cohort's users in one round (rows sorted by user id)."""

    ids: np.ndarray
    pos: np.ndarray
    drop: np.ndarray
    active: np.ndarray
    c_sk: list = field(default_factory=list)
    s_sk: list = field(default_factory=list)
    s_sk_bytes: np.ndarray | None = None
    c_pk: np.ndarray | None = None
    s_pk: np.ndarray | None = None
    b_seed: np.ndarray | None = None
    table_pos: np.ndarray | None = None
    table_c_pk: list | None = None  # X25519PublicKey objects of U1, by table row
    table_s_pk: list | None = None
    sign_sk: list = field(default_factory=list)  # Ed25519 keys (consistency round only)
    sign_pk: np.ndarray | None = None
    pki_sign_pk: np.ndarray | None = None  # (n, 32) raw Ed25519 keys by position, from the PKI
    pki_known: np.ndarray | None = None  # (n,) the positions the PKI has a key for
    pair_code: np.ndarray | None = None  # (holder, peer) codes of the encryption keys, sorted
    pair_key: np.ndarray | None = None
    received: dict | None = None
    revealed: dict = field(default_factory=dict)
    u2: np.ndarray | None = None
    graph_seed: int | None = None  # the server's, with the key table
    signed: bytes | None = None  # the survivors list its users signed (consistency round)
    masking_index: dict | None = None  # position -> index among the users who mask
    stage: str = "advertise"


STAGES = ("advertise", "share_keys", "masked_input", "consistency", "unmask")


def _state(ctx: StepContext, spec: RoundSpec, stage: str) -> ClientRound:
    """The round's state, checked to be one stage before ``stage`` (out-of-order input is refused)."""
    st = ctx.state.get("secagg", {}).get(spec.round)
    stages = STAGES if spec.consistency else tuple(s for s in STAGES if s != "consistency")
    previous = stages[stages.index(stage) - 1]
    if st is None or st.stage != previous:
        have = "no round" if st is None else f"stage {st.stage}"
        raise ProtocolViolation(
            f"{ctx.name}: a {stage} request arrived in {have} of round {spec.round}"
        )
    st.stage = stage
    return st


def _graph(ctx: StepContext, spec: RoundSpec):
    """The round's neighbour graph, from the seed the server sent with the key table."""
    seed = ctx.state["secagg"][spec.round].graph_seed
    cache = ctx.state.setdefault("secagg_graphs", {})
    key = (spec.round, spec.n, spec.degree, spec.complete, seed)
    if key not in cache:
        cache.clear()
        cache[key] = spec.graph(seed)
    return cache[key]


def _member(n: int, positions: np.ndarray) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[positions] = True
    return out


#: a chunk of users holds about this many bytes per (users x width) float64 or int64 array
_CHUNK_BYTES = 64 << 20
#: rows per chunk when set (tests set a small one), else sized from the width by _CHUNK_BYTES
_CHUNK_ROWS: int | None = None


def chunk_rows(width: int) -> int:
    """Users per chunk for (users x ``width``) arrays: peak memory stays flat as n grows."""
    if _CHUNK_ROWS is not None:
        return _CHUNK_ROWS
    return max(1, _CHUNK_BYTES // (8 * max(width, 1)))


def by_user(fn):
    """Mark an ``input_fn`` whose rows depend on their own user id only (no state, no draw
    shared between users): :func:`masked_input` may then call it on chunks of users, so a
    cohort never holds all its users' vectors at once. Unmarked functions get every user in
    one call (their noise or state may span users).

    A marked function that returns a DP event is refused (its noise would span the chunk, not
    the release); nothing else is checked: it must depend only on the user ids it is given —
    no draws from an ordered stream shared by the users (keyed draws per user id are fine), no
    writes to ``ctx.state`` — or the streamed sum silently differs from the one-call sum."""
    fn.by_user = True
    return fn


def _count_in(graph, pos: np.ndarray, member: np.ndarray) -> np.ndarray:
    """Per user at ``pos``: how many of its neighbours ``member`` marks, computed in chunks of
    users (the (users x k) neighbour table never exists for all of them at once)."""
    out = np.zeros(len(pos), dtype=np.int64)
    step = chunk_rows(graph.degree)
    for a in range(0, len(pos), step):
        out[a : a + step] = graph.count_in(pos[a : a + step], member)
    return out


def registered_users(ctx: StepContext) -> np.ndarray:
    """The cohort's users: those the plan registered with it (``meta["users"]``, sorted: a
    registered user takes part whether or not its table holds a row of it), else those its table
    holds (a user may own several rows)."""
    if "users" in ctx.meta:
        return np.asarray(ctx.meta["users"], dtype=np.int64)
    return np.unique(ctx.table.column("user_id").to_numpy())


# --- phase 1: advertise keys ---------------------------------------------------------------------
def advertise(ctx: StepContext, spec: RoundSpec, ids: np.ndarray | None = None) -> Message:
    """Each user draws two X25519 key pairs (c: share encryption, s: pairwise masks) and sends
    the public keys. Keys come from the member's noise source: the OS in a secure run (``secure``
    mode), the run's stream keyed by user id otherwise. The member's users are ``ids`` when the
    driver gives them (a party is one user: its index in the party order), else its registered
    users."""
    check_source(spec, ctx.noise)
    if spec.round in ctx.state.get("secagg", {}):
        raise ProtocolViolation(
            f"{ctx.name}: round {spec.round} was already started; keys are never re-issued"
        )
    ids = registered_users(ctx) if ids is None else np.asarray(ids, dtype=np.int64)
    pos = spec.positions(ids)
    drop = drop_codes(spec.dropout, ctx.seed, spec.round, ids)
    active = drop > ADVERTISE
    st = ClientRound(ids=ids, pos=pos, drop=drop, active=active)
    ctx.state.setdefault("secagg", {})
    ctx.state["secagg"] = {r: s for r, s in ctx.state["secagg"].items() if r >= spec.round - 1}
    ctx.state["secagg"][spec.round] = st
    payload: dict = {"pos": pos[active]}
    if spec.mode in ("secure", "simulation"):
        raw = ctx.noise.user_bytes("secagg-keys", spec.round, ids[active], 64)
        c_pk = np.empty((raw.shape[0], 32), dtype=np.uint8)
        s_pk = np.empty_like(c_pk)
        for i in range(raw.shape[0]):
            c, c_pk_raw = _crypto.keypair(raw[i, :32].tobytes())
            s, s_pk_raw = _crypto.keypair(raw[i, 32:].tobytes())
            st.c_sk.append(c)
            st.s_sk.append(s)
            c_pk[i] = np.frombuffer(c_pk_raw, np.uint8)
            s_pk[i] = np.frombuffer(s_pk_raw, np.uint8)
        st.s_sk_bytes = np.ascontiguousarray(raw[:, 32:])
        st.c_pk, st.s_pk = c_pk, s_pk
        payload.update(c_pk=c_pk, s_pk=s_pk)
        if spec.consistency:
            payload["sign_pk"] = _signing_keys(ctx, spec, st, ids[active])
            payload["key_sig"] = _sign_keys(spec, st, ids[active])
    return Message("public_keys", payload, to=spec.server)


def _signing_keys(ctx: StepContext, spec: RoundSpec, st: ClientRound, ids) -> np.ndarray:
    """Each user's Ed25519 key pair for the consistency round; the raw public keys. They reach
    the other users through the simulated PKI (the driver, ``_pki_directory``), so the server
    can neither sign for a user nor substitute its keys."""
    raw = ctx.noise.user_bytes("secagg-sign", spec.round, ids, 32)
    st.sign_pk = np.empty((raw.shape[0], 32), dtype=np.uint8)
    for i in range(raw.shape[0]):
        sk, pk = _crypto.signing_keypair(raw[i].tobytes())
        st.sign_sk.append(sk)
        st.sign_pk[i] = np.frombuffer(pk, np.uint8)
    return st.sign_pk


def _sign_keys(spec: RoundSpec, st: ClientRound, ids) -> np.ndarray:
    """Each user's Ed25519 signature on (round, its id, c_pk, s_pk): the server forwards it with
    the keys, and every user that uses them checks it against the PKI's key (``_verify_rows``)."""
    sig = np.empty((len(ids), 64), dtype=np.uint8)
    for i, uid in enumerate(ids.tolist()):
        message = spec.keys_message(uid, st.c_pk[i], st.s_pk[i])
        sig[i] = np.frombuffer(st.sign_sk[i].sign(message), np.uint8)
    return sig


# --- phase 2: share keys -------------------------------------------------------------------------
def _table_rows(table_pos: np.ndarray, positions) -> np.ndarray:
    """The key-table rows of ``positions``, every one of which must be in the table: a user the
    server left out is refused, never read from the next row (which nobody may have verified)."""
    positions = np.asarray(positions, dtype=np.int64)
    rows = np.searchsorted(table_pos, positions)
    found = rows < len(table_pos)
    found[found] = table_pos[rows[found]] == positions[found]
    if not found.all():
        missing = np.unique(positions[~found])[:5].tolist()
        raise ProtocolViolation(
            f"users at positions {missing} are named as peers but are not in the key table: refused"
        )
    return rows


def _check_table_shape(spec: RoundSpec, table: dict) -> None:
    """The key table's positions strictly increase within [0, n), and every key column has one
    row per position: a malformed table is refused, not indexed."""
    pos = np.asarray(table["pos"])
    if pos.ndim != 1 or not np.issubdtype(pos.dtype, np.integer):
        raise ProtocolViolation("the key table's positions are not a list of integers")
    if pos.size and (pos[0] < 0 or pos[-1] >= spec.n or np.any(np.diff(pos) <= 0)):
        raise ProtocolViolation("the key table's positions are not increasing within the registry")
    for column in ("c_pk", "s_pk", "sign_pk", "key_sig"):
        if column in table and len(table[column]) != pos.size:
            raise ProtocolViolation(f"the key table's {column} column has not one row per user")


def _check_key_table(st: ClientRound, table: dict, rows: np.ndarray) -> None:
    """Flower's checks: public keys distinct, and the users' own keys came back unchanged."""
    if np.unique(table["c_pk"], axis=0).shape[0] != len(table["pos"]) or np.unique(
        table["s_pk"], axis=0
    ).shape[0] != len(table["pos"]):
        raise ProtocolViolation("the key table repeats a public key")
    where = np.searchsorted(table["pos"], st.pos[st.active])
    ok = (where < len(table["pos"])) & (
        table["pos"][np.minimum(where, len(table["pos"]) - 1)] == st.pos[st.active]
    )
    if not ok.all() or not (
        np.array_equal(table["c_pk"][where], st.c_pk[rows])
        and np.array_equal(table["s_pk"][where], st.s_pk[rows])
        and (st.sign_pk is None or np.array_equal(table["sign_pk"][where], st.sign_pk[rows]))
    ):
        raise ProtocolViolation("the key table does not hold this cohort's users' own public keys")


def _pki_directory(spec: RoundSpec, st: ClientRound, pki: dict | None) -> None:
    """The simulated PKI: the users' Ed25519 public keys by position, read from the cohorts' own
    advertise replies, which the driver hands to every cohort directly (it stands for a trusted
    directory) — never from the server. Only the signing keys are read from them."""
    if pki is None:
        raise ProtocolViolation("a consistency round's share_keys needs the PKI directory")
    st.pki_sign_pk = np.zeros((spec.n, 32), dtype=np.uint8)
    st.pki_known = np.zeros(spec.n, dtype=bool)
    for reply in pki.values():
        pos = np.asarray(reply["pos"])
        if st.pki_known[pos].any() or np.unique(pos).size != pos.size:
            raise ProtocolViolation("the PKI lists a user twice: refused")
        st.pki_sign_pk[pos] = np.asarray(reply["sign_pk"])
        st.pki_known[pos] = True


def _pki_verify(st: ClientRound, pos: int, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is valid under the PKI's key of the user at ``pos``; False for a
    user the PKI does not know (its placeholder row, all zero, is a small-order Ed25519 point
    under which signatures can be forged, so it is never used)."""
    if not st.pki_known[pos]:
        return False
    return _crypto.verify(st.pki_sign_pk[pos].tobytes(), signature, message)


def _verify_rows(ctx: StepContext, spec: RoundSpec, st: ClientRound, table: dict, used) -> None:
    """Every key-table row at positions ``used`` must carry its user's signature on (round, id,
    c_pk, s_pk) under the PKI's key: else the server substituted keys, and the round is refused
    before any share is encrypted under them."""
    u1 = np.asarray(table["pos"])
    sigs = np.asarray(table.get("key_sig", np.zeros((0, 64), np.uint8)))
    if sigs.shape != (len(u1), 64):
        raise ProtocolViolation("the key table does not carry one key signature per user")
    bad = []
    for p, row in zip(used.tolist(), _table_rows(u1, used).tolist(), strict=True):
        message = spec.keys_message(spec.registry[p], table["c_pk"][row], table["s_pk"][row])
        if not _pki_verify(st, p, sigs[row].tobytes(), message):
            bad.append(p)
    if bad:
        raise UnauthenticatedKeys(spec.registry[bad], ctx.name)


def _check_graph_seed(ctx: StepContext, spec: RoundSpec, seed: int, beacon: int | None) -> None:
    """The graph's seed is the run's outside secure mode, and the PKI's beacon in a secure
    consistency round; otherwise (secure, no PKI) it is the server's draw, taken on trust — a
    semi-honest server's (see the docs)."""
    if spec.mode != "secure" and seed != int(ctx.seed):
        raise ProtocolViolation(f"{ctx.name}: the key table's graph seed is not the run's")
    if beacon is not None and seed != int(beacon):
        raise ProtocolViolation(
            f"{ctx.name}: the key table's graph seed is not the PKI beacon's: the server chose "
            "the neighbour graph"
        )


def share_keys(
    ctx: StepContext,
    spec: RoundSpec,
    table: dict,
    pki: dict | None = None,
    beacon: int | None = None,
) -> Message:
    """Each user t-out-of-k Shamir-shares its mask key and a fresh self-mask seed among its
    neighbours, and encrypts each neighbour's two shares under the pair's agreed key (AES-GCM,
    associated data = tag, round, sender, receiver). A user with fewer than t neighbours left
    cannot protect its secrets and drops out. In a consistency round ``pki`` is the advertise
    replies (the simulated PKI) and every neighbour's keys must be signed under its PKI key; in a
    secure one the graph's seed must be the PKI's ``beacon``, else the server chose the graph."""
    st = _state(ctx, spec, "share_keys")
    _check_table_shape(spec, table)
    u1 = np.asarray(table["pos"])
    st.graph_seed = int(table["graph_seed"])
    _check_graph_seed(ctx, spec, st.graph_seed, beacon)
    in_u1 = _member(spec.n, u1)
    if spec.mode in ("secure", "simulation"):
        _check_key_table(st, table, np.arange(len(st.c_sk)))
    active = st.active & in_u1[st.pos]
    rows = np.flatnonzero(active)  # rows of st.ids; index into key lists via key_rows
    # every mode follows the same participation rule, so dealer and plain runs drop the same users
    graph = _graph(ctx, spec)
    # a user lost at share_keys advertised its keys (it counts in its neighbours' U1) and sends no
    # shares
    enough = (_count_in(graph, st.pos[rows], in_u1) >= spec.threshold) & (
        st.drop[rows] > SHARE_KEYS
    )
    active[:] = False
    active[rows[enough]] = True
    st.active = active
    if spec.mode in ("plain", "dealer"):
        return Message("shares", {"pos": st.pos[active]}, to=spec.server)
    key_rows = np.searchsorted(np.flatnonzero(st.drop > ADVERTISE), rows)
    st.table_pos = u1
    st.table_c_pk = _crypto.public_keys(np.asarray(table["c_pk"]))
    st.table_s_pk = _crypto.public_keys(np.asarray(table["s_pk"]))
    rows, key_rows = rows[enough], key_rows[enough]
    nb = graph.neighbours(st.pos[rows])  # (U, k) positions: the users' shares need them all
    alive_nb = in_u1[nb]
    if spec.consistency:
        _pki_directory(spec, st, pki)
        _verify_rows(ctx, spec, st, table, np.unique(nb[alive_nb]))

    st.b_seed = np.zeros((len(st.ids), 32), dtype=np.uint8)
    st.b_seed[rows] = ctx.noise.user_bytes("secagg-masks", spec.round, st.ids[rows], 32)
    t = spec.threshold
    coef = ctx.noise.user_words(
        "secagg-shares", spec.round, st.ids[rows], 2 * (t - 1) * shamir.COEF_WORDS
    )
    coef = coef.reshape(len(rows), 2, t - 1, shamir.COEF_WORDS)
    points = (np.arange(spec.n) + 1) if graph.complete else nb + 1
    key_shares = shamir.split(st.s_sk_bytes[key_rows], points, t, coef[:, 0])
    self_shares = shamir.split(st.b_seed[rows], points, t, coef[:, 1])
    # pairs (user row i, neighbour column j) to neighbours still in U1
    pi, pj = np.nonzero(alive_nb)
    receiver = nb[pi, pj]
    col = receiver if graph.complete else pj
    plain = np.concatenate([key_shares[pi, col], self_shares[pi, col]], axis=1).astype("<u4")
    plain = plain.view(np.uint8).reshape(len(pi), PLAINTEXT_BYTES)
    sender = st.pos[rows][pi]

    ct, keys = _encrypt_shares(
        st,
        spec,
        plain,
        own=key_rows[pi],
        peer=_table_rows(u1, receiver),
        pairs=(sender, receiver),
    )
    code = sender.astype(np.uint64) * np.uint64(spec.n) + receiver.astype(np.uint64)
    order = np.argsort(code)
    st.pair_code, st.pair_key = code[order], keys[order]
    return Message(
        "shares",
        {"pos": st.pos[rows], "sender": sender, "receiver": receiver, "ct": ct},
        to=spec.server,
    )


def share_keys_split(
    ctx: StepContext, spec: RoundSpec, table: dict, *pki, ranges: dict[str, tuple[int, int]]
) -> dict[str, Message]:
    """:func:`share_keys` for a sharded server: the encrypted shares split by their receiver's
    range, one message per server shard, each with the senders' positions (U2's part)."""
    payload = share_keys(ctx, spec, table, *pki).payload
    receiver = payload.get("receiver")
    out = {}
    for name, (lo, hi) in ranges.items():
        if receiver is None:  # dealer and plain modes share nothing: U2's part only
            out[name] = Message("shares", payload, to=name)
            continue
        rows = (receiver >= lo) & (receiver < hi)
        part = {k: (v if k == "pos" else v[rows]) for k, v in payload.items()}
        out[name] = Message("shares", part, to=name)
    return out


# --- phase 3: masked input -----------------------------------------------------------------------
def _encrypt_shares(
    st: ClientRound, spec: RoundSpec, plain: np.ndarray, *, own, peer, pairs
) -> tuple[np.ndarray, np.ndarray]:
    """(ciphertexts, pair keys): each row of ``plain`` encrypted under the key user ``own`` (a
    key row) agrees with ``peer`` (a row of the advertised table); ``pairs`` = (sender, receiver)
    positions, bound into the associated data. Where both users of a pair live in this cohort,
    their agreed key (the same from either side: Diffie-Hellman) is computed once for both."""
    sender, receiver = pairs
    ct = np.empty((len(plain), PLAINTEXT_BYTES + _crypto.TAG_BYTES), dtype=np.uint8)
    keys = np.empty((len(plain), 32), dtype=np.uint8)
    here = set(sender.tolist())
    agreed: dict[tuple[int, int], bytes] = {}
    for e in range(len(plain)):
        u, v = int(sender[e]), int(receiver[e])
        key = agreed.pop((v, u), None)  # its partner's, if it came first
        if key is None:
            secret = _crypto.shared_secret(st.c_sk[own[e]], st.table_c_pk[peer[e]])
            key = _crypto.hkdf(secret, _crypto.INFO_SHARE, spec.salt)
            if v in here:
                agreed[(u, v)] = key
        keys[e] = np.frombuffer(key, np.uint8)
        sealed = _crypto.encrypt_share(
            key,
            plain[e].tobytes(),
            tag=spec.tag,
            round=spec.round,
            sender=int(sender[e]),
            receiver=int(receiver[e]),
        )
        ct[e] = np.frombuffer(sealed, np.uint8)
    return ct, keys


def _pair_masks_real(
    spec: RoundSpec,
    st: ClientRound,
    rows: np.ndarray,
    u2_member: np.ndarray,
    graph,
    y: np.ndarray,
    masking: np.ndarray,
    spill: np.ndarray,
) -> None:
    """Add Σ_v sign(u, v)·PRG(HKDF(X25519(s_u, s_v))) to each user's row of y (per pair: the cost).

    ``rows`` are a chunk of the cohort's masking users ``masking`` (y holds the chunk's rows). A
    pair whose two users both mask in this cohort has one seed (the same from either side:
    Diffie-Hellman), so it is agreed and expanded once, with the smaller position, and added to
    both rows with opposite signs — to ``spill`` (one uint64 row, added to the cohort's sum) when
    the other row lies in another chunk (earlier or later: a cohort's users need not be sorted by
    position); the words wrap, so the order of the additions does not matter.
    """
    key_index = np.searchsorted(np.flatnonzero(st.drop > ADVERTISE), rows)
    nb = graph.neighbours(st.pos[rows])
    dtype = spec.word_dtype
    here = _masking_index(st, masking)  # every peer of theirs in U2 is a peer
    base = int(np.searchsorted(masking, rows[0])) if len(rows) else 0
    for i, row in enumerate(rows):
        peers = nb[i][u2_member[nb[i]]]
        sk = st.s_sk[key_index[i]]
        t_rows = _table_rows(st.table_pos, peers)
        u = int(st.pos[row])
        for v, tr in zip(peers.tolist(), t_rows.tolist(), strict=True):
            j = here.get(v)
            if j is not None and v < u:
                continue  # done with v
            seed = _crypto.hkdf(
                _crypto.shared_secret(sk, st.table_s_pk[tr]), _crypto.INFO_MASK, spec.salt
            )
            mask = _crypto.expand(seed, spec.dim, dtype)
            if u > v:
                y[i] += mask
            else:
                y[i] -= mask
            if j is None:
                continue
            # v > u: v's side adds the mask u's side subtracted, in this chunk's row of v, else
            # in spill (v's row lies in another chunk, earlier or later: rows need not be sorted)
            if 0 <= j - base < len(y):
                y[j - base] += mask
            else:
                spill += mask.astype(np.uint64)


def _masking_index(st: ClientRound, masking: np.ndarray) -> dict[int, int]:
    """Position -> index among the cohort's masking users ``masking`` (built once per round)."""
    if st.masking_index is None:
        st.masking_index = {int(p): i for i, p in enumerate(st.pos[masking])}
    return st.masking_index


_DEALER_CHUNK_BYTES = 1 << 24
_ENCODE_CHUNK_ROWS = 1 << 12  # rows a dealer or plain cohort encodes and masks at a time


def add_dealer_masks(
    key: bytes, spec: RoundSpec, codes: np.ndarray, signs: np.ndarray, into: np.ndarray
) -> None:
    """Add Σ_{r,j} signs[r, j]·mask(codes[r, j]) to the one row ``into`` (1 x dim); a pair with a
    sign of 0 is skipped (no mask is drawn). Masks come from the dealer's PRF in chunks, each
    reduced with one contiguous sum per sign."""
    rows, k = codes.shape
    dtype = spec.word_dtype
    blocks = mask_blocks(spec)
    per_chunk = max(1, _DEALER_CHUNK_BYTES // (16 * blocks * max(k, 1)))
    prf = _crypto.Prf(key, blocks, min(per_chunk, max(rows, 1)) * max(k, 1))
    for a in range(0, rows, per_chunk):
        s = signs[a : a + per_chunk].reshape(-1)
        c = codes[a : a + per_chunk].reshape(-1)
        for side, add in ((s > 0, np.add), (s < 0, np.subtract)):
            if side.any():
                masks = prf(c[side]).view(dtype)[:, : spec.dim]
                add(into[0], masks.sum(axis=0, dtype=dtype), out=into[0])


def masked_input_parts(
    ctx: StepContext, spec: RoundSpec, u2: dict, parts: dict, input_fn, input_args: tuple
) -> Message:
    """:func:`masked_input` on a sharded server: U2 from the coordinator, this cohort's incoming
    ciphertexts from every shard (``parts``, by shard)."""
    routed = {"u2": u2["u2"]}
    names = sorted(parts)
    for key in ("sender", "receiver", "ct"):
        if names and key in parts[names[0]]:
            routed[key] = np.concatenate([np.asarray(parts[n][key]) for n in names])
    return masked_input(ctx, spec, routed, input_fn, input_args)


def masked_input(
    ctx: StepContext, spec: RoundSpec, routed: dict, input_fn, input_args: tuple
) -> Message:
    """Each surviving user sends y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u) ∩ U2} ±PRG(s_uv) mod 2^b; in
    ``plain`` mode y_u = x_u (no protection: a labelled baseline only).

    ``input_fn`` returns the users' inputs, or ``(inputs, event)`` when it adds DP noise through a
    :mod:`rayfed.privacy` mechanism: every cohort's message then carries the event of the one
    release their sum is (scope ``"run"``), or ``(inputs, event, scope)`` for another scope (a
    party's own noise: its name)."""
    st = _state(ctx, spec, "masked_input")
    u2 = np.asarray(routed["u2"])
    if st.table_pos is not None and not np.isin(u2, st.table_pos).all():
        raise ProtocolViolation("the server's U2 names users outside the key table's U1: refused")
    st.u2 = u2
    u2_member = _member(spec.n, u2)
    st.active &= u2_member[st.pos] & (st.drop > MASKED_INPUT)
    # a user left with fewer than t neighbours in U2 aborts (Flower's check): its mask would be
    # spread over too few peers
    rows = np.flatnonzero(st.active)
    st.active[rows[_count_in(_graph(ctx, spec), st.pos[rows], u2_member) < spec.threshold]] = False
    st.received = {k: routed[k] for k in ("sender", "receiver", "ct") if k in routed}
    rows = np.flatnonzero(st.active)
    if getattr(input_fn, "by_user", False):
        y = _streamed_sum(ctx, spec, st, rows, u2_member, input_fn, input_args)
        return Message("masked_input", {"pos": st.pos[rows], "y": y[None, :]}, to=spec.server)
    x, event, scope = _inputs(ctx, spec, st.ids[rows], input_fn, input_args)
    return Message(
        "masked_input",
        {"pos": st.pos[rows], "y": _masked_sum(ctx, spec, st, rows, u2_member, x)[None, :]},
        to=spec.server,
        dp_event=event,
        scope=scope if event is not None else None,
    )


def _inputs(ctx: StepContext, spec: RoundSpec, ids: np.ndarray, input_fn, input_args: tuple):
    """(inputs, event, scope) of the users ``ids``, checked to be (len(ids) x dim)."""
    x, event, scope = input_fn(ctx, spec.round, ids, *input_args), None, "run"
    if isinstance(x, tuple) and len(x) in (2, 3) and isinstance(x[1], DpEvent):
        x, event, scope = x if len(x) == 3 else (*x, scope)
    x = _as_inputs(spec, x)
    if x.shape != (len(ids), spec.dim):
        raise ValueError(
            f"input function returned shape {x.shape}, expected {(len(ids), spec.dim)}"
        )
    return x, event, scope


def _streamed_sum(
    ctx: StepContext, spec: RoundSpec, st: ClientRound, rows, u2_member, input_fn, input_args
) -> np.ndarray:
    """:func:`_masked_sum` with the inputs generated, encoded and masked chunk by chunk
    (``input_fn`` marked :func:`by_user`): in dealer and plain rounds a cohort's memory does not
    grow with its users (secure and simulation rounds hold their users' keys anyway). The words
    wrap, so the sum is the one-chunk sum word for word."""
    total = np.zeros(spec.dim, np.uint64)
    # pairs of two users who both mask in this cohort cancel in its sum, across chunks too
    peers = u2_member & ~_member(spec.n, st.pos[rows]) if spec.mode == "dealer" else None
    step = chunk_rows(spec.dim)
    for a in range(0, len(rows), step):
        part = rows[a : a + step]
        x, event, _ = _inputs(ctx, spec, st.ids[part], input_fn, input_args)
        if event is not None:
            raise ValueError("an input function marked by_user must not draw DP noise")
        total += _masked_sum(ctx, spec, st, part, u2_member, x, peers=peers, masking=rows)
    return spec.encoding.reduce(total)


def _as_inputs(spec: RoundSpec, x) -> np.ndarray:
    """:class:`~rayfed.secagg.encoding.RingWords` become uint64 words (checked in [0, 2^b));
    any other input, integers included, is values, as float64."""
    if isinstance(x, RingWords):
        return x.checked(spec.encoding.modulus_bits)
    return np.asarray(x, dtype=np.float64)


def _encode(spec: RoundSpec, x: np.ndarray) -> np.ndarray:
    """Inputs as words mod 2^b: values fixed-point encoded (clipped, scaled, rounded); ring words
    (uint64, from RingWords, already in [0, 2^b)) taken as they are — a protocol that sums words
    of its own ring gets its words' sum back exactly in ``AggregationResult.words``."""
    if x.dtype == np.uint64:
        return spec.encoding.reduce(x)
    return spec.encoding.encode(x)


def _masked_sum(
    ctx: StepContext,
    spec: RoundSpec,
    st: ClientRound,
    rows: np.ndarray,
    u2_member,
    x: np.ndarray,
    peers: np.ndarray | None = None,
    masking: np.ndarray | None = None,
) -> np.ndarray:
    """Σ_u y_u mod 2^b over this cohort's masking users.

    The cohort forwards its users' masked inputs already added up: the server only ever adds them,
    and a sum of masked inputs tells it no more than the inputs one by one, while the message
    shrinks from (users x dim) to one row. Dealer and plain rounds encode and mask in chunks of
    rows, so a cohort of 10^5 users never holds all their words at once.

    In a dealer round the pair masks of two users who both mask here are left out: one adds
    what the other subtracts, so the sum is the same word for word (the words wrap) and the
    server sees exactly what it would (``peers``: the neighbours whose pairs are masked, by
    position; default, every U2 member outside ``rows``). A dealer round simulates what the
    server sees, not the users' work; secure and simulation rounds still expand every pair's
    mask (once per pair). ``rows`` may be a chunk of the cohort's masking users ``masking``
    (default: ``rows`` are all of them).
    """
    dtype = spec.word_dtype
    if spec.mode in ("dealer", "plain"):
        if spec.mode == "dealer" and peers is None:  # pairs inside this sum cancel: leave them out
            peers = u2_member & ~_member(spec.n, st.pos[rows])
        total = np.zeros(spec.dim, np.uint64)
        masks = np.zeros((1, spec.dim), dtype)
        for a in range(0, len(rows), _ENCODE_CHUNK_ROWS):
            part = rows[a : a + _ENCODE_CHUNK_ROWS]
            total += _encode(spec, x[a : a + _ENCODE_CHUNK_ROWS]).sum(axis=0, dtype=np.uint64)
            if spec.mode == "dealer":
                _add_dealer_round_masks(ctx, spec, st.pos[part], peers, masks)
        return spec.encoding.reduce(total + masks[0].astype(np.uint64))
    y = _encode(spec, x)
    spill = np.zeros(spec.dim, np.uint64)
    if len(rows):
        for i, row in enumerate(rows):
            y[i] += _crypto.expand(st.b_seed[row].tobytes(), spec.dim, dtype)
        masking = rows if masking is None else masking
        _pair_masks_real(spec, st, rows, u2_member, _graph(ctx, spec), y, masking, spill)
    return spec.encoding.reduce(y.sum(axis=0, dtype=np.uint64) + spill)


def _add_dealer_round_masks(
    ctx: StepContext, spec: RoundSpec, pos: np.ndarray, peers: np.ndarray, y: np.ndarray
) -> None:
    """Add to the one row ``y`` the self masks and the signed pair masks (with the neighbours
    ``peers`` marks, a boolean per position) of the users at ``pos``."""
    key = dealer_key(ctx.seed, spec.round)
    add_dealer_masks(key, spec, self_codes(pos)[:, None], np.ones((len(pos), 1), np.int8), y)
    nb = _graph(ctx, spec).neighbours(pos)
    signs = np.where(peers[nb], sign(pos[:, None], nb), 0).astype(np.int8)
    add_dealer_masks(key, spec, pair_codes(pos[:, None], nb, spec.n), signs, y)


# --- consistency round ---------------------------------------------------------------------------
def consistency(ctx: StepContext, spec: RoundSpec, request: dict) -> Message:
    """Each user still online whose masked input is in U3 signs U3 (Bonawitz et al.'s
    ConsistencyCheck), once per round: a server that shows different users different survivor
    lists cannot gather enough signatures for two of them (``_check_signatures``). A list below
    the quorum is refused (``_check_quorum``)."""
    st = _state(ctx, spec, "consistency")
    survivors = np.asarray(request["survivors"])
    _check_quorum(spec, survivors)
    if not _member(spec.n, st.u2)[survivors].all():
        raise ProtocolViolation("the server's survivors list names users outside U2: refused")
    signing = np.flatnonzero(st.active & _member(spec.n, survivors)[st.pos] & (st.drop == NEVER))
    message = spec.survivors_message(survivors)
    st.signed = message  # its users sign one list per round, and unmask for that list only
    key_at = np.searchsorted(np.flatnonzero(st.drop > ADVERTISE), signing)
    sig = np.empty((len(signing), 64), dtype=np.uint8)
    for i, k in enumerate(key_at.tolist()):
        sig[i] = np.frombuffer(st.sign_sk[k].sign(message), np.uint8)
    return Message("signatures", {"pos": st.pos[signing], "sig": sig}, to=spec.server)


def _check_quorum(spec: RoundSpec, survivors: np.ndarray) -> None:
    """The users' own quorum (consistency rounds): a survivors list U3 of fewer than
    ``spec.min_survivors`` distinct users is neither signed nor unmasked. The server checks the
    same quorum, but a malicious server skips its own checks: it could declare users dropped
    until the sum covers fewer users than the parameters (and a protocol's DP accounting, e.g.
    LFL's |U1| >= ⌈(1-ω)n⌉) assume. U3 is signed, so every honest user checks the same list."""
    survivors = np.asarray(survivors)
    if survivors.ndim != 1 or not np.issubdtype(survivors.dtype, np.integer):
        raise ProtocolViolation("the server's survivors list is not a list of positions: refused")
    if survivors.size and (
        survivors[0] < 0 or survivors[-1] >= spec.n or np.any(np.diff(survivors) <= 0)
    ):
        raise ProtocolViolation(
            "the server's survivors list is not increasing within the registry: refused"
        )
    if survivors.size < spec.min_survivors:
        raise ProtocolViolation(
            f"the server's survivors list holds {survivors.size} users, fewer than the quorum "
            f"of {spec.min_survivors}: refused (no signature, no share)"
        )


def _check_signatures(st: ClientRound, spec: RoundSpec, request: dict) -> None:
    """A user reveals shares only for the survivors list it signed itself, and only if more than
    (n + c)/2 users of that list signed it too (``RoundSpec.signatures_needed``): a server
    that shows different users different lists cannot gather that many for two of them.
    Signatures are checked in order until enough are valid (once per cohort: every user of the
    cohort signed the same list and would reach the same verdict); at most one per U1 member."""
    survivors = np.asarray(request["survivors"])
    _check_quorum(spec, survivors)
    message = spec.survivors_message(survivors)
    if message != st.signed:
        raise ProtocolViolation("the unmask request shows another survivors list than was signed")
    signers, sigs = np.asarray(request["signers"]), np.asarray(request["signatures"])
    needed = spec.signatures_needed()
    if len(signers) != len(sigs) or len(signers) > len(st.table_pos):
        raise ProtocolViolation("the request's signatures do not match its signers: refused")
    in_u3 = _member(spec.n, survivors)
    valid = set()
    for pos, sig in zip(signers.tolist(), sigs, strict=True):
        row = int(np.searchsorted(st.table_pos, pos))
        known = 0 <= pos < spec.n and row < len(st.table_pos) and st.table_pos[row] == pos
        if known and in_u3[pos] and pos not in valid:  # under the PKI's key
            if _pki_verify(st, pos, sig.tobytes(), message):
                valid.add(pos)
        if len(valid) >= needed:
            return
    raise ProtocolViolation(
        f"only {len(valid)} users signed the survivors list this request shows, {needed} "
        f"(more than half of the {spec.n} users and {spec.corrupt_users} corrupt) are needed: "
        "refused"
    )


# --- phase 4: unmask -----------------------------------------------------------------------------
def unmask(ctx: StepContext, spec: RoundSpec, request: dict) -> Message:
    """Each user still online reveals, for every peer whose shares it holds, the self-mask share if
    the peer's masked input is in the sum (U3) or the key share if the peer dropped (U2 \\ U3) —
    never both for one peer, whatever the server asks."""
    st = _state(ctx, spec, "unmask")
    survivors, dropped = np.asarray(request["survivors"]), np.asarray(request["dropped"])
    if spec.consistency:
        _check_signatures(st, spec, request)
    if np.intersect1d(survivors, dropped).size:
        raise ProtocolViolation("the server asked for both shares of the same users: refused")
    u2 = _member(spec.n, st.u2)
    if not (u2[survivors].all() and u2[dropped].all()):
        raise ProtocolViolation("the server's unmask request names users outside U2: refused")
    in_u3 = _member(spec.n, survivors)
    st.active &= in_u3[st.pos] & (st.drop == NEVER)
    # a user with fewer than t surviving neighbours reveals nothing
    rows = np.flatnonzero(st.active)
    st.active[rows[_count_in(_graph(ctx, spec), st.pos[rows], in_u3) < spec.threshold]] = False
    empty = {
        "holder": np.zeros(0, np.int64),
        "owner": np.zeros(0, np.int64),
        "kind": np.zeros(0, np.uint8),
        "share": np.zeros((0, shamir.CHUNKS), np.int64),
    }
    if spec.mode in ("plain", "dealer") or not st.received or not len(st.received["ct"]):
        return Message("unmask_shares", {**empty, "pos": st.pos[st.active]}, to=spec.server)
    in_drop = _member(spec.n, dropped)
    holder, owner, ct = st.received["receiver"], st.received["sender"], st.received["ct"]
    mine = _member(spec.n, st.pos[st.active])[holder]
    wanted = mine & (in_u3[owner] | in_drop[owner])
    holder, owner, ct = holder[wanted], owner[wanted], ct[wanted]
    kind = np.where(in_u3[owner], KIND_SELF, KIND_KEY).astype(np.uint8)
    for h, o, k in zip(holder.tolist(), owner.tolist(), kind.tolist(), strict=True):
        if st.revealed.setdefault((h, o), k) != k:
            raise ProtocolViolation(
                f"user at position {h} was asked for both shares of position {o}: refused"
            )
    codes = holder.astype(np.uint64) * np.uint64(spec.n) + owner.astype(np.uint64)
    key_at = np.searchsorted(st.pair_code, codes)
    if len(codes) and (
        key_at.max() >= len(st.pair_code) or not np.array_equal(st.pair_code[key_at], codes)
    ):
        raise ProtocolViolation("a routed ciphertext comes from a user that is not a neighbour")
    shares = _decrypt_shares(st, spec, ct, key_at, kind, pairs=(owner, holder))
    payload = {
        "pos": st.pos[st.active],
        "holder": holder,
        "owner": owner,
        "kind": kind,
        "share": shares,
    }
    return Message("unmask_shares", payload, to=spec.server)


def unmask_split(
    ctx: StepContext, spec: RoundSpec, request: dict, ranges: dict[str, tuple[int, int]]
) -> dict[str, Message]:
    """:func:`unmask` for a sharded server: the revealed shares split by their owner's range, one
    message per server shard (``ranges``: shard -> [lo, hi) of owner positions); each carries the
    responders' positions, so every shard counts the same responders."""
    payload = unmask(ctx, spec, request).payload
    owner = payload["owner"]
    out = {}
    for name, (lo, hi) in ranges.items():
        rows = (owner >= lo) & (owner < hi)
        part = {k: (v if k == "pos" else v[rows]) for k, v in payload.items()}
        out[name] = Message("unmask_shares", part, to=name)
    return out


def _decrypt_shares(
    st: ClientRound, spec: RoundSpec, ct: np.ndarray, key_at: np.ndarray, kind, *, pairs
) -> np.ndarray:
    """Each routed ciphertext decrypted under its pair key (row ``key_at``), keeping the self-mask
    or the key share as ``kind`` says; ``pairs`` = (owner, holder) positions, as in the associated
    data. A ciphertext that fails authentication is a ProtocolViolation."""
    owner, holder = pairs
    shares = np.empty((len(ct), shamir.CHUNKS), dtype=np.int64)
    for e in range(len(ct)):
        try:
            plain = _crypto.decrypt_share(
                st.pair_key[key_at[e]].tobytes(),
                ct[e].tobytes(),
                tag=spec.tag,
                round=spec.round,
                sender=int(owner[e]),
                receiver=int(holder[e]),
            )
        except _crypto.InvalidTag:
            raise ProtocolViolation(
                f"the share ciphertext from position {owner[e]} to {holder[e]} failed "
                "authentication: rejected"
            ) from None
        words = np.frombuffer(plain, dtype="<u4").astype(np.int64)
        shares[e] = words[shamir.CHUNKS :] if kind[e] == KIND_SELF else words[: shamir.CHUNKS]
    return shares
