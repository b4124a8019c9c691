"""Keyed randomness: the only place where rayfed builds random generators.

Two tools, both keyed by (root seed, purpose, round, identity) so that a draw never depends on
which process, cohort or arrival order computed it:

* :func:`stream` returns a ``numpy.random.Generator`` for one (purpose, round, id), built from
  ``SeedSequence(root, spawn_key=...)`` (numpy's recommended way to derive independent streams).
* :func:`keyed_uniform` draws per-user uniforms *vectorised over user ids*: a counter-based
  generator (Philox4x32-10, Salmon et al., SC'11) evaluated on counters (user id, draw index), so a
  user's draws are the same whether it sits in cohort 0 of 1 or cohort 3 of 7. numpy exposes
  Philox only one key at a time; here it is written over arrays, and checked against the
  Random123 known-answer vectors in the tests.

Purposes are stable integers, never ``hash(str)`` (salted per process): the table below for the
built-in ones, and for any other name (a new protocol's own purpose) a code derived from a
BLAKE2b digest of the name, in a range the table never uses — so a protocol registers a purpose by
naming it, without editing this table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

#: Stable integer code per built-in purpose. Append only: changing a code changes every result.
PURPOSES: dict[str, int] = {
    "synthetic": 1,
    "partition": 2,
    "randomized-response": 3,
    "laplace": 4,
    "gaussian": 5,
    "discrete-laplace": 6,
    "sample": 7,
    "dropout": 8,
    "secagg-keys": 9,
    "secagg-masks": 10,
    "init": 11,
    "clustering": 12,
    "sketch": 13,
    "secagg-graph": 14,
    "secagg-pairs": 15,
    "secagg-shares": 16,
    "trim": 17,
    "replacement": 18,
    "dropout-round2": 19,
    "finetune": 20,
    "hash-key": 21,
    "olh-hash": 22,
    "evaluation": 23,
    "anchors": 24,
    "group-key": 25,
    "gaussian-share": 26,
    "ldp-report": 27,
    "availability": 28,
    "latency": 29,
    "secagg-sign": 30,
    "split-discrete-laplace": 31,
    "objective-perturbation": 32,
    "mpc-coins": 41,  # hfl-kmeans ring_noise=mpc: a client's random bits of the coins
    "mpc-dealer": 42,  # its dealer's Beaver triples and daBits
    "test": 99,
}


def ident_words(ident: int | str | Iterable[int | str]) -> tuple[int, ...]:
    """Map an identity (int, name or tuple of them) to 32-bit words, stably across processes."""
    if isinstance(ident, (int, np.integer)):
        value = int(ident)
        if value < 0:
            raise ValueError(f"identity must be >= 0, got {value}")
        return (value & 0xFFFFFFFF, value >> 32) if value >> 32 else (value,)
    if isinstance(ident, str):
        digest = hashlib.blake2b(ident.encode(), digest_size=8).digest()
        return (0x5A5A5A5A, *np.frombuffer(digest, dtype="<u4").tolist())
    words: list[int] = []
    for part in ident:
        words.extend(ident_words(part))
    return tuple(words)


#: codes of named purposes start here (the table's codes are all below it)
_NAMED_PURPOSES = 1 << 31


def _purpose(purpose: str) -> int:
    """The purpose's code: the table's, else 2^31 + the first 31 bits of BLAKE2b(name)."""
    if purpose in PURPOSES:
        return PURPOSES[purpose]
    if not isinstance(purpose, str) or not purpose:
        raise ValueError(f"a randomness purpose is a non-empty name, got {purpose!r}")
    digest = hashlib.blake2b(purpose.encode(), digest_size=4, person=b"rayfed-purpose").digest()
    return _NAMED_PURPOSES | (int.from_bytes(digest, "little") >> 1)


def seed_sequence(root: int, purpose: str, round: int = 0, ident=0) -> np.random.SeedSequence:
    """The SeedSequence of one (purpose, round, id) stream under ``root``."""
    return np.random.SeedSequence(
        int(root), spawn_key=(_purpose(purpose), int(round), *ident_words(ident))
    )


def stream(root: int, purpose: str, round: int = 0, ident=0) -> np.random.Generator:
    """A fresh Generator for one (purpose, round, id); the same arguments give the same stream."""
    return np.random.Generator(np.random.PCG64(seed_sequence(root, purpose, round, ident)))


# --- Philox4x32-10, vectorised -------------------------------------------------------------------
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_SHIFT = np.uint64(32)
_CHUNK_BLOCKS = 1 << 15
_UNIFORM_CHUNK_WORDS = 1 << 22  # keyed_uniform's working set: 32 MiB of words at a time


def _philox_words(c0, c1, c2, c3, key: tuple[int, int], rounds: int = 10):
    """The Philox4x32 rounds on four uint32 counter arrays (products in uint64, the rest in uint32)."""
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0 = c0.astype(np.uint64) * _M0
        p1 = c2.astype(np.uint64) * _M1
        c0, c1, c2, c3 = (
            (p1 >> _SHIFT).astype(np.uint32) ^ c1 ^ np.uint32(k0),
            p1.astype(np.uint32),
            (p0 >> _SHIFT).astype(np.uint32) ^ c3 ^ np.uint32(k1),
            p0.astype(np.uint32),
        )
    return c0, c1, c2, c3


def philox4x32(counter: np.ndarray, key: tuple[int, int], rounds: int = 10) -> np.ndarray:
    """Philox4x32 block function on an array of counters.

    Parameters
    ----------
    counter:
        ``(..., 4)`` array of 32-bit counter words (any unsigned or int dtype; taken mod 2^32).
    key:
        Two 32-bit key words.

    Returns
    -------
    ``(..., 4)`` uint32 array of output words.
    """
    c = (np.asarray(counter).astype(np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return np.stack(_philox_words(*(c[..., i] for i in range(4)), key, rounds), axis=-1)


def _philox_key(root: int, purpose: str, round: int) -> tuple[int, int]:
    words = seed_sequence(root, purpose, round).generate_state(2, dtype=np.uint32)
    return int(words[0]), int(words[1])


def keyed_bits64(root: int, purpose: str, round: int, ids: np.ndarray, n: int) -> np.ndarray:
    """``(len(ids), n)`` uint64 words, a pure function of (root, purpose, round, id, draw index)."""
    ids = np.asarray(ids, dtype=np.uint64)
    if n <= 0:
        return np.zeros((ids.size, 0), dtype=np.uint64)
    blocks = (n + 1) // 2  # each Philox block gives 4 x 32 bits = two 64-bit words
    key = _philox_key(root, purpose, round)
    out = np.empty((ids.size, 2 * blocks), dtype=np.uint64)
    per_chunk = max(1, _CHUNK_BLOCKS // blocks)  # keep the temporaries in cache
    index = np.tile(np.arange(blocks, dtype=np.uint32), min(per_chunk, ids.size))
    zeros = np.zeros_like(index)
    for a in range(0, ids.size, per_chunk):
        part = ids[a : a + per_chunk]
        m = part.size * blocks
        lo = np.repeat((part & np.uint64(0xFFFFFFFF)).astype(np.uint32), blocks)
        hi = np.repeat((part >> _SHIFT).astype(np.uint32), blocks)
        w0, w1, w2, w3 = _philox_words(lo, hi, index[:m], zeros[:m], key)
        view = out[a : a + part.size].reshape(m, 2)
        view[:, 0] = (w0.astype(np.uint64) << _SHIFT) | w1
        view[:, 1] = (w2.astype(np.uint64) << _SHIFT) | w3
    return out[:, :n]


def keyed_uniform(root: int, purpose: str, round: int, ids: np.ndarray, n: int = 1) -> np.ndarray:
    """``(len(ids), n)`` uniforms in [0, 1) keyed per user id, with 53 random bits each.

    Drawn in chunks of ids (a user's draws do not depend on its neighbours'), so 10^6 users x 1,000
    draws need the output and one chunk, not three full-size temporaries."""
    ids = np.asarray(ids)
    out = np.empty((ids.size, max(n, 0)), dtype=np.float64)
    per_chunk = max(1, _UNIFORM_CHUNK_WORDS // max(n, 1))
    for a in range(0, ids.size, per_chunk):
        words = keyed_bits64(root, purpose, round, ids[a : a + per_chunk], n)
        np.multiply(
            (words >> np.uint64(11)).astype(np.float64), 1.0 / (1 << 53), out=out[a : a + per_chunk]
        )
    return out
