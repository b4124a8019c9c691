"""Fixed-point encoding of real vectors into Z_(2^b) for secure aggregation.

Each coordinate is clipped to [-clip, clip], scaled by 2^f and rounded to the nearest integer,
then taken mod 2^b (two's complement). The sum of n users lies in [-n·R, n·R] with
R = round(clip·2^f); it decodes exactly when n·R < 2^(b-1). The modulus is sized in integers
(``int.bit_length``, never a floating-point log), and one that could overflow is a ConfigError
(never a silent wrap-around).

The clip in :meth:`FixedPoint.encode` is a saturation the encoder does not count: a caller whose
inputs may lie outside [-clip, clip] checks them first (secure-sum's plan refuses a data file's
values outside, or clips and counts them with :func:`rayfed.privacy.enforce`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfed.errors import ConfigError

MAX_BITS = 64


def bits_for_sum(n: int, max_abs: int) -> int:
    """Bits b of the smallest two's-complement modulus 2^b holding every sum in [-n·R, n·R]:
    2^(b-1) > n·R, i.e. b = bit_length(n·R) + 1 (a sign bit)."""
    return (int(n) * int(max_abs)).bit_length() + 1


@dataclass(frozen=True)
class FixedPoint:
    clip: float
    frac_bits: int
    modulus_bits: int

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint32 if self.modulus_bits <= 32 else np.uint64)

    @property
    def mask(self) -> int:
        return (1 << self.modulus_bits) - 1

    @property
    def max_abs(self) -> int:
        return round(self.clip * 2**self.frac_bits)

    @staticmethod
    def choose(n: int, clip: float, frac_bits: int, modulus_bits: int | None = None) -> FixedPoint:
        """The smallest modulus that holds the sum of ``n`` inputs, or check the one given."""
        if not (math.isfinite(clip) and clip > 0):
            raise ConfigError("clip", f"must be a finite number > 0, got {clip}")
        if not 0 <= frac_bits <= 52:
            raise ConfigError("frac_bits", f"must be in [0, 52], got {frac_bits}")
        max_abs = round(clip * 2**frac_bits)
        if max_abs < 1:
            raise ConfigError(
                "clip", f"clip {clip} at 2^{frac_bits} rounds to 0", "a larger clip or frac_bits"
            )
        need = bits_for_sum(n, max_abs)
        if need > MAX_BITS:
            raise ConfigError(
                "frac_bits",
                f"{n} users x clip {clip} at 2^{frac_bits} needs a {need}-bit modulus",
                f"at most {MAX_BITS} bits: lower frac_bits or clip",
            )
        if modulus_bits is None:
            modulus_bits = max(need, 8)
        elif not need <= modulus_bits <= MAX_BITS:
            raise ConfigError(
                "modulus_bits",
                f"2^{modulus_bits} can overflow: the sum of {n} users reaches "
                f"±{n * max_abs} and needs {need} bits",
                f"{need} to {MAX_BITS}",
            )
        return FixedPoint(clip, frac_bits, modulus_bits)

    def encode(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ConfigError("inputs", "NaN or infinite input to secure aggregation")
        q = np.rint(np.clip(x, -self.clip, self.clip) * 2.0**self.frac_bits).astype(np.int64)
        return (q.astype(np.uint64) & np.uint64(self.mask)).astype(self.dtype)

    def signed(self, total: np.ndarray) -> np.ndarray:
        """The exact signed integer (int64) of a sum mod 2^b: two's complement sign extension."""
        shift = np.uint64(64 - self.modulus_bits)
        s = np.asarray(total).astype(np.uint64) & np.uint64(self.mask)
        return (s << shift).view(np.int64) >> np.int64(shift)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """Signed value of a sum mod 2^b, divided by 2^f (float64: exact while |sum| < 2^53)."""
        return np.ldexp(self.signed(total).astype(np.float64), -self.frac_bits)

    def reduce(self, words: np.ndarray) -> np.ndarray:
        """Words (uint32/uint64 sums that wrapped mod 2^32 or 2^64) reduced mod 2^b."""
        return (np.asarray(words).astype(np.uint64) & np.uint64(self.mask)).astype(self.dtype)


@dataclass(frozen=True)
class RingWords:
    """An input function's rows given as words of the round's ring Z_2^b — integers in
    [0, 2^b), summed as they are (no scaling, clipping or rounding), the sum's words in
    ``AggregationResult.words`` — for a protocol that encodes in its own ring (hfl-kmeans's padded
    uploads). Opt-in: any other input, integers included, is a value, fixed-point encoded. A word
    outside [0, 2^b) is an error, not reduced."""

    words: Any

    def checked(self, bits: int) -> np.ndarray:
        """The words as uint64, or ValueError naming the range."""
        w = np.asarray(self.words)
        if w.size and not np.issubdtype(w.dtype, np.integer):
            raise ValueError(f"RingWords holds {w.dtype} values, not integer words of Z_2^{bits}")
        if w.size and (int(w.min()) < 0 or int(w.max()) >= 1 << bits):
            raise ValueError(
                f"RingWords outside the ring: words must lie in [0, 2^{bits}), got "
                f"[{int(w.min())}, {int(w.max())}] (reduce them mod 2^{bits} first)"
            )
        return w.astype(np.uint64)
