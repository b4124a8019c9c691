"""One-time pads for aggregating a few parties' vectors in Z_(2^b) through a server that must not
see them (the horizontal k-means protocols, shared/specs/hfl-kmeans.md §2).

Two kinds, both AES-256 PRF outputs indexed by (iteration, party), so every pad is fresh per
scalar and per iteration:

* **shared-seed pads** (the thesis's MSA): every party derives every party's pad r_l from the
  group key the server lacks; the server sums the uploads and sees ``Σ values + r``, which every
  party can unpad (r = Σ r_l). The server and any one party together unmask everyone.
* **pairwise masks** (Bonawitz-style, without dropout recovery): parties l < j share a secret
  s_lj (X25519 + HKDF); l adds PRF(s_lj) and j subtracts it, so the masks cancel in the sum. On
  their own they would show the server the aggregate, so they are added *on top of* the shared
  pads: the server alone learns nothing, and the server colluding with one party learns the
  aggregate — before the server's noise, which it knows — but, with 3 or more parties, no other
  party's individual upload.

Values are signed integers on the fixed-point grid; two's complement mod 2^b.
"""

from __future__ import annotations

import numpy as np

from rayfed.secagg import _crypto
from rayfed.secagg.groupkey import keyed_words

INFO_PADS = b"rayfed-hfl/v1/shared-pads"
INFO_INIT = b"rayfed-hfl/v1/initial-centroids"
INFO_PAIRS = b"rayfed-hfl/v1/pairwise-masks"
RING_BITS = (32, 64)
_PARTY_BITS = 20  # PRF input = iteration << 20 | party: up to 2^20 parties


def ring_dtype(bits: int) -> np.dtype:
    if bits not in RING_BITS:
        raise ValueError(f"ring must be Z_2^32 or Z_2^64, got 2^{bits}")
    return np.dtype(np.uint32 if bits == 32 else np.uint64)


def subkey(group_key: bytes, info: bytes) -> bytes:
    """A purpose-bound 32-byte key from the group key (HKDF-SHA256)."""
    return _crypto.hkdf(group_key, info, b"")


def to_ring(values: np.ndarray, bits: int) -> np.ndarray:
    """Signed integers -> ring words (two's complement mod 2^b)."""
    return np.asarray(values, dtype=np.int64).astype(ring_dtype(bits))


def from_ring(words: np.ndarray, bits: int) -> np.ndarray:
    """Ring words -> signed int64 (read as b-bit two's complement)."""
    words = np.asarray(words, dtype=ring_dtype(bits))
    return words.view(np.int32 if bits == 32 else np.int64).astype(np.int64)


def _words(key: bytes, iteration: int, index: int, n: int, bits: int) -> np.ndarray:
    code = np.array([(int(iteration) << _PARTY_BITS) | int(index)], dtype=np.uint64)
    return keyed_words(key, code, n, ring_dtype(bits))[0]


def party_pad(pad_key: bytes, iteration: int, party: int, n: int, bits: int) -> np.ndarray:
    """Party ``party``'s pad r_l for this iteration (every party can compute every pad)."""
    return _words(pad_key, iteration, party, n, bits)


def shared_pads(pad_key: bytes, iteration: int, parties: int, n: int, bits: int) -> np.ndarray:
    """(parties, n): every party's pad r_l for this iteration (all parties compute the same)."""
    return np.stack([party_pad(pad_key, iteration, j, n, bits) for j in range(parties)])


def pairwise_mask(
    pair_keys: dict[int, bytes], me: int, iteration: int, n: int, bits: int
) -> np.ndarray:
    """Σ_{j>me} PRF(s_mj) − Σ_{j<me} PRF(s_jm): the masks of all parties sum to 0 mod 2^b."""
    mask = np.zeros(n, dtype=ring_dtype(bits))
    for j, key in pair_keys.items():
        words = _words(key, iteration, 0, n, bits)
        mask = mask + words if j > me else mask - words
    return mask
