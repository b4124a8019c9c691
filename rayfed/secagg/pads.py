"""Shared-seed pads for aggregating a few parties' vectors in Z_(2^b) through a server that must
not see them (the thesis's MSA, shared/specs/hfl-kmeans.md §2).

Every pad is an AES-256 PRF output indexed by (iteration, party), so it is fresh per scalar and per
iteration: every party derives every party's pad r_l from the group key the server lacks; the
server sums the uploads and sees ``Σ values + r``, which every party can unpad (r = Σ r_l). The
server and any one party together unmask everyone. Pairwise masks with dropout recovery are the
one secure sum's (:func:`rayfed.secagg.secure_sum` over the parties), added on top of these pads
where a protocol asks for them.

Values are signed integers on the fixed-point grid; two's complement mod 2^b.
"""

from __future__ import annotations

import numpy as np

from rayfed.secagg import _crypto
from rayfed.secagg.groupkey import keyed_words

INFO_PADS = b"rayfed-secagg/v1/shared-pads"
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
