"""A small semi-honest MPC engine in the preprocessing model: M parties sample one discrete
Laplace variable per coordinate in additive shares of Z_(2^b), so that only Σ values + DLap is
ever revealed (hfl-kmeans ``ring_noise=mpc``, thesis §7.3.2; spec hfl-kmeans §1.8 F2).

Everything here is a pure function of share arrays (numpy, vectorised over all coins at once), so
it is tested without Ray; the protocol's steps call it and the driver only XORs openings.

* **Shares.** A secret bit is XOR-shared: party l holds x_l and x = ⊕_l x_l. Bits are packed
  eight to a byte along the last axis (``np.packbits``), so XOR and AND act on whole arrays.
* **Preprocessing.** A dealer, independent of the data, hands out Beaver triples over GF(2)
  (a, b, c = a ∧ b, each XOR-shared) and daBits (a random bit r given both as XOR shares and as
  additive shares mod 2^b). The dealer must be honest and collude with no party and not with the
  driver: it learns nothing by itself, but with the parties' opening shares (which the driver
  relays) it could unmask every AND's inputs.
* **AND** (one opening round): each party opens d_l = x_l ⊕ a_l, e_l = y_l ⊕ b_l; with the opened
  d, e it sets z_l = c_l ⊕ (d ∧ b_l) ⊕ (e ∧ a_l) ⊕ [l = 0](d ∧ e).
* **Biased coin** c = [U < A] for a κ-bit U whose bits every party contributes (XOR of their
  random bits: uniform if one party is honest) and a public A: the carry-lookahead comparison
  with a public constant. Bit i gives (g_i, p_i) = (¬U_i ∧ A_i, ¬(U_i ⊕ A_i)) — linear in the
  shares, party 0 alone XORing in the public constants — and pairs combine MSB-first as (g, p) = (g_hi ⊕ (p_hi ∧ g_lo), p_hi ∧ p_lo): a tree of
  ⌈log₂ κ⌉ AND layers (2 ANDs per pair) instead of κ sequential ones.
* **B2A** with a daBit: open e = c ⊕ r, then [c]_A = [l = 0]e + [r]_A − 2e[r]_A mod 2^b.
* **Geometric by its binary digits.** For P(G = g) ∝ α^g the digits of G are independent:
  bit j is 1 with probability q_j = α^(2^j)/(1 + α^(2^j)). G = Σ_j 2^j c_j over J digits needs J
  coins, against the ~1/a coins of a unary construction (a = ε/Δ is about 1e-6 on the 2^-16
  grid: a unary G would need tens of millions of coins per variable). DLap = G₁ − G₂.

The coin probabilities are A_j/2^κ, not q_j, and J digits truncate G: :class:`BitGeometric`
computes the privacy this sampler really gives (its ``noise_parameter`` a' ≈ a, from the exact
thresholds in integer arithmetic and rounded up, and its ``tail``, rounded up),
from which the event's ε and δ follow (:func:`rayfed.privacy.joint_discrete_laplace_event`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import reduce

import numpy as np

#: bits of the uniform U of every coin (a power of two: the comparison tree has log2 κ layers)
KAPPA = 128
#: truncation: G stops at J digits, with α^(2^J) <= 2^-TAIL_BITS
TAIL_BITS = 40

#: draw(nbytes) -> uint8 array of secret random bytes (a party's or the dealer's noise source)
Draw = Callable[[int], np.ndarray]


# --- the sampler's public plan ---------------------------------------------------------------------
@dataclass(frozen=True)
class BitGeometric:
    """A geometric variable G on {0, …, 2^J − 1} from J independent coins [U < A_j], U uniform on
    κ bits: P(G = g) ∝ Π_j r_j^(g_j) with r_j = A_j/(2^κ − A_j) (g_j the digits of g).

    ``noise_parameter`` is the largest |ln P(g)/P(g+1)| over the support: DLap built from two such
    G is a'-DP per unit of sensitivity up to the truncation, whose cost is ``tail`` (see
    :meth:`tail`)."""

    kappa: int
    thresholds: tuple[int, ...]  # A_j, j = 0 … J-1

    @classmethod
    def plan(cls, a: float, kappa: int = KAPPA, tail_bits: int = TAIL_BITS) -> BitGeometric:
        """The coins for DLap(a): J digits with a·(2^J − 1) >= tail_bits·ln 2 (so α^(2^J − 1) is
        at most 2^-tail_bits), each A_j = q_j·2^κ (q_j's 53 bits, scaled exactly), clamped to
        1 … 2^κ − 1 (at κ = 128 the clamp acts only for a > 60 per grid unit)."""
        if not (math.isfinite(a) and a > 0):
            raise ValueError(f"noise parameter must be > 0, got {a!r}")
        if kappa < 2 or kappa & (kappa - 1):
            raise ValueError(f"kappa must be a power of two >= 2, got {kappa!r}")
        digits = max(1, math.ceil(math.log2(tail_bits * math.log(2) / a + 1.0)))
        top = (1 << kappa) - 1
        thresholds = []
        for j in range(digits):
            x = math.exp(-a * 2.0**j)  # q = x/(1 + x) without overflow at large a·2^j
            # exact scaling by 2^κ (q's 53 bits kept); a coin below 2^-κ is drawn at 2^-κ, more
            # often than planned: a' then falls below a (more noise), and a' is what is charged
            thresholds.append(min(top, max(1, int(x / (1.0 + x) * 2.0**kappa))))
        return cls(kappa, tuple(thresholds))

    @property
    def digits(self) -> int:
        return len(self.thresholds)

    def _ratio(self, m: int) -> Fraction:
        """e^(L_m − Σ_{j<m} L_j) exactly, L_j = ln((2^κ − A_j)/A_j) = −ln r_j: the integers
        (2^κ − A_m)·Π_{j<m} A_j over A_m·Π_{j<m} (2^κ − A_j)."""
        full = 1 << self.kappa
        num, den = full - self.thresholds[m], self.thresholds[m]
        for t in self.thresholds[:m]:
            num, den = num * t, den * (full - t)
        return Fraction(num, den)

    @property
    def noise_parameter(self) -> float:
        """a' = max over carries m of |L_m − Σ_{j<m} L_j|: g → g+1 flips the m trailing ones of g
        to zeros and digit m to one, so ln P(g)/P(g+1) = L_m − Σ_{j<m} L_j (= a exactly for ideal
        coins). Each ratio is exact; its log (log1p of the exact ratio − 1, correctly rounded to
        a float first) is rounded up two ulps, so a' is never below the truth."""
        worst = max(abs(math.log1p(float(self._ratio(m) - 1))) for m in range(self.digits))
        return _up(worst)

    @property
    def tail(self) -> float:
        """η: the total-variation distance between this G and an untruncated G^∞ whose unit-shift
        ratios all lie in [e^-a', e^a'] (its digits j >= J have r_j = e^(-c·2^j), c = (Σ_{j<J} L_j
        + a')/2^J, so every carry past J costs exactly a'). The truncated G is G^∞ given those
        digits are 0, so η = P(some digit j >= J is 1) <= Σ_{j>=J} r_j <= r_J/(1 − r_J), with
        r_J = e^-(Σ_{j<J} L_j + a') = Π_{j<J} r_j · e^-a' (exact product, rounded up)."""
        full = 1 << self.kappa
        product = Fraction(1)
        for t in self.thresholds:
            product *= Fraction(t, full - t)
        r = _up(float(product) * math.exp(-self.noise_parameter))
        return _up(r / (1.0 - r))

    def threshold_planes(self) -> np.ndarray:
        """(κ, J) bool: bit i of A_j (LSB first)."""
        return np.array(
            [[(t >> i) & 1 for t in self.thresholds] for i in range(self.kappa)], dtype=bool
        )


def _up(x: float, ulps: int = 2) -> float:
    """``x`` moved up by ``ulps`` units in the last place: a bound that float rounding cannot
    push below the exact value."""
    for _ in range(ulps):
        x = math.nextafter(x, math.inf)
    return x


# --- packing and sharing ---------------------------------------------------------------------------
def pack(bits: np.ndarray) -> np.ndarray:
    """Bits (bool or 0/1) -> uint8, eight per byte along the last axis."""
    return np.packbits(np.asarray(bits, dtype=bool), axis=-1)


def unpack(packed: np.ndarray, count: int) -> np.ndarray:
    """uint8 -> ``count`` bits (uint8 0/1) along the last axis."""
    return np.unpackbits(np.asarray(packed, dtype=np.uint8), axis=-1, count=count)


def random_bytes(draw: Draw, shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(draw(int(np.prod(shape))), dtype=np.uint8).reshape(shape)


def xor_open(shares: list[np.ndarray]) -> np.ndarray:
    """The value of XOR shares (the driver's opening)."""
    return reduce(np.bitwise_xor, shares)


def xor_share(value: np.ndarray, parties: int, draw: Draw) -> list[np.ndarray]:
    """Split packed bits into ``parties`` XOR shares (the last one fixes the value)."""
    value = np.asarray(value, dtype=np.uint8)
    shares = [random_bytes(draw, value.shape) for _ in range(parties - 1)]
    return [*shares, reduce(np.bitwise_xor, shares, value)]


def additive_share(value: np.ndarray, parties: int, draw: Draw, dtype: np.dtype) -> list:
    """Split ring words into ``parties`` additive shares mod 2^b."""
    value = np.asarray(value, dtype=dtype)
    size = value.size * dtype.itemsize
    shares = [
        random_bytes(draw, (size,)).view(dtype).reshape(value.shape) for _ in range(parties - 1)
    ]
    return [*shares, value - sum(shares, np.zeros_like(value))]


# --- the dealer ------------------------------------------------------------------------------------
def deal_triples(draw: Draw, shape: tuple[int, ...], parties: int) -> list[tuple]:
    """Beaver triples over GF(2) for packed arrays of ``shape``: per party (a_l, b_l, c_l) with
    (⊕a) ∧ (⊕b) = ⊕c."""
    a, b = random_bytes(draw, shape), random_bytes(draw, shape)
    a_sh, b_sh = xor_share(a, parties, draw), xor_share(b, parties, draw)
    c_sh = xor_share(a & b, parties, draw)
    return list(zip(a_sh, b_sh, c_sh, strict=True))


def deal_dabits(draw: Draw, count: int, parties: int, dtype: np.dtype) -> list[tuple]:
    """``count`` daBits: per party (its XOR share of the packed bits r, its additive share of r
    mod 2^b)."""
    r = unpack(random_bytes(draw, (-(-count // 8),)), count)
    xor = xor_share(pack(r), parties, draw)
    add = additive_share(r.astype(dtype), parties, draw, dtype)
    return list(zip(xor, add, strict=True))


# --- AND -------------------------------------------------------------------------------------------
def and_open(x: np.ndarray, y: np.ndarray, triple: tuple) -> np.ndarray:
    """A party's share of the openings (d, e) = (x ⊕ a, y ⊕ b), stacked."""
    a, b, _ = triple
    return np.stack([x ^ a, y ^ b])


def and_finish(opened: np.ndarray, triple: tuple, first: bool) -> np.ndarray:
    """A party's share of x ∧ y from the opened (d, e)."""
    a, b, c = triple
    d, e = opened
    z = c ^ (d & b) ^ (e & a)
    return z ^ (d & e) if first else z


# --- comparison with a public constant, as a tree --------------------------------------------------
def compare_leaves(u: np.ndarray, a_planes: np.ndarray, first: bool) -> tuple:
    """Shares of (g_i, p_i) = (¬U_i ∧ A_i, ¬(U_i ⊕ A_i)) for every bit plane i (LSB first):
    ``u`` and ``a_planes`` are packed (κ, bytes). Every party ANDs its share with the public A
    (AND with a constant is linear over XOR shares), but a public constant XORed into the value
    — the NOT, and A in p — is added by party 0 alone: XORed by all M parties it would cancel
    whenever M is even."""
    ones = np.uint8(0xFF) if first else np.uint8(0)
    g = (u ^ ones) & a_planes
    p = u ^ (a_planes ^ ones) if first else u
    return g, p


def _even(g: np.ndarray, p: np.ndarray, first: bool) -> tuple:
    """Pad an odd number of planes at the bottom with the identity (g, p) = (0, 1)."""
    if len(g) % 2 == 0:
        return g, p
    zero = np.zeros_like(g[:1])
    one = zero | (np.uint8(0xFF) if first else np.uint8(0))
    return np.concatenate([zero, g]), np.concatenate([one, p])


def tree_operands(g: np.ndarray, p: np.ndarray, first: bool) -> tuple:
    """The AND operands of the next tree level: (p_hi, p_hi) ∧ (g_lo, p_lo) for each pair."""
    g, p = _even(g, p, first)
    return np.concatenate([p[1::2], p[1::2]]), np.concatenate([g[0::2], p[0::2]])


def tree_combine(g: np.ndarray, p: np.ndarray, z: np.ndarray, first: bool) -> tuple:
    """The next level's (g, p) from the ANDs z = (p_hi ∧ g_lo, p_hi ∧ p_lo)."""
    g, _ = _even(g, p, first)
    half = len(g) // 2
    return g[1::2] ^ z[:half], z[half:]


def tree_widths(kappa: int) -> list[int]:
    """AND operand planes per tree level for κ bits (2 per pair), top level last."""
    widths, n = [], kappa
    while n > 1:
        n = -(-n // 2)
        widths.append(2 * n)
    return widths


# --- B2A and the noise ---------------------------------------------------------------------------
def b2a_share(opened: np.ndarray, r_words: np.ndarray, first: bool, count: int) -> np.ndarray:
    """A party's additive share of the opened-through-daBit bits: [l = 0]e + [r]_A − 2e[r]_A."""
    e = unpack(opened, count).astype(r_words.dtype)
    out = r_words - (e * r_words) * r_words.dtype.type(2)
    return out + e if first else out


def coin_planes(samplers: list[BitGeometric], lengths: list[int]) -> np.ndarray:
    """Packed (κ, bytes) threshold planes of every coin of one draw: per block, 2·length
    variables (G₁ and G₂ of each coordinate) of J coins each, in that order."""
    planes = [
        np.tile(s.threshold_planes(), (1, 2 * n)) for s, n in zip(samplers, lengths, strict=True)
    ]
    return pack(np.concatenate(planes, axis=1))


def coin_count(samplers: list[BitGeometric], lengths: list[int]) -> int:
    return sum(2 * n * s.digits for s, n in zip(samplers, lengths, strict=True))


def dlap_shares(coins: np.ndarray, samplers: list[BitGeometric], lengths: list[int]) -> np.ndarray:
    """A party's shares of DLap = G₁ − G₂ per coordinate from its additive coin shares (ring
    words, laid out as :func:`coin_planes`): G = Σ_j 2^j c_j, all mod 2^b."""
    out, start = [], 0
    for s, n in zip(samplers, lengths, strict=True):
        block = coins[start : start + 2 * n * s.digits].reshape(2, n, s.digits)
        weights = np.ones(s.digits, coins.dtype) << np.arange(s.digits).astype(coins.dtype)
        g = (block * weights).sum(axis=-1, dtype=coins.dtype)
        out.append(g[0] - g[1])
        start += 2 * n * s.digits
    return np.concatenate(out)
