"""Fixed-point encoding: the modulus is sized in integers, so no n·R near a power of two wraps.

References are exact Python integers computed here, never through FixedPoint's own arithmetic.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rayfed.errors import ConfigError
from rayfed.secagg import FixedPoint


def wrapped_sum(word: int, n: int, bits: int) -> int:
    """What n users all sending ``word`` leave in Z_(2^bits): computed with Python integers."""
    return (word * n) % (1 << bits)


def signed_ref(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


@given(
    k=st.integers(min_value=1, max_value=63),
    a=st.integers(min_value=0, max_value=20),
    d=st.sampled_from([-1, 0, 1]),
    frac=st.sampled_from([0, 8, 32]),
)
@example(
    k=53, a=2, d=0, frac=0
)  # 4 users x 2^51: the wrap issue 15 found (reported EXACT at -2^53)
@example(k=37, a=16, d=0, frac=32)  # 65,536 users, clip 32 at 2^32: the same band
def test_sum_at_and_around_every_power_of_two_decodes_exactly(k, a, d, frac):
    n = 1 << min(a, k - 1)
    r = (1 << (k - min(a, k - 1))) + d  # n·R at, just below or just above 2^k
    if r < 1:
        return
    clip = float(Fraction(r, 1 << frac))
    exact_r = Fraction(clip) * (1 << frac)  # what the encoder must use, computed exactly
    if exact_r.denominator != 1:  # clip not representable at this scale: skip the draw
        return
    r = int(exact_r)
    total = n * r
    if total >= 1 << 63:  # no 64-bit two's complement word holds it
        with pytest.raises(ConfigError):
            FixedPoint.choose(n, clip, frac)
        return
    enc = FixedPoint.choose(n, clip, frac)
    assert 1 << (enc.modulus_bits - 1) > total  # holds +n·R and -n·R
    if enc.modulus_bits > 8:  # and is the smallest that does: one bit less would not
        assert 1 << (enc.modulus_bits - 2) <= total
    for sign in (1, -1):
        word = int(enc.encode(np.array([sign * clip]))[0])
        assert signed_ref(word, enc.modulus_bits) == sign * r
        words = np.array([wrapped_sum(word, n, enc.modulus_bits)], dtype=np.uint64)
        assert int(enc.signed(words)[0]) == sign * total


def test_a_given_modulus_that_would_wrap_is_refused():
    with pytest.raises(ConfigError, match="modulus_bits.*overflow"):
        FixedPoint.choose(4, 2.0**51, 0, modulus_bits=54)  # 4 x 2^51 = 2^53 needs 55 bits
    assert FixedPoint.choose(4, 2.0**51, 0, modulus_bits=55).modulus_bits == 55


def test_sixty_four_bit_modulus_decodes_the_extremes():
    enc = FixedPoint.choose(2, 2.0**61, 0)
    assert enc.modulus_bits == 64
    top = np.array([(1 << 63) - 1, 1 << 63], dtype=np.uint64)
    assert enc.signed(top).tolist() == [(1 << 63) - 1, -(1 << 63)]
