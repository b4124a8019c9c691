"""General Wave mechanisms (spec §2.7; the thesis's Def. 3.5.1 and Thm 3.5.1) and the transition
matrix of any of them as a structured operator (O(d) per product instead of a dense d̃ x d array).

A General Wave reports ṽ ∈ [-b, 1+b] with density M_v(ṽ) = W(ṽ - v), W = q outside [-b, b] and
q <= W <= e^ε q inside. The family here is the thesis's §3.6.4: a symmetric trapezoid whose top
(at height e^ε q) is ``ratio`` times its base 2b (spec A12: plateau e^ε q on |z| <= ratio·b,
linear down to q at |z| = b). ratio = 1 is the Square Wave (SW), ratio = 0 the triangle. The
normalisation q·(1 + 2b) + (e^ε - 1)·q·b·(1 + ratio) = 1 gives

    q = 1 / (1 + 2b + (e^ε - 1)·b·(1 + ratio)),

so every shape is ε-LDP (its densities lie in [q, e^ε q]) and, for ratio < 1, has a larger q than
SW at the same b — Lemma 1's W1 factor 1 - (2b + 1)q is smaller (Thm 3.5.2: SW is best).

Write W = q + (e^ε q - q)·K with K the unit-height shape. The transition matrix is then

    M[j, i] = q·W̃ + (e^ε q - q)·(1/Δ)·∬_{B_i x B̃_j} K(t - v) dt dv,

and the double integral is a signed sum of a second antiderivative K₂ of K at the rectangle's four
corners (:func:`transition_matrix`). For the structured product, K is a sum of shifted steps
(square) or ramps (trapezoid); the convolution of such a term with a piecewise-constant density
is that density's next antiderivative, so M·x needs the density's antiderivatives at a few points
per bucket — from prefix sums, O(d + d̃) (:class:`WaveOperator`).
"""

from __future__ import annotations

import math

import numpy as np

from rayfed.ldp import square_wave as sw

#: top/bottom length ratios of the shapes the thesis compares (§3.6.4, Fig. 3.5)
SHAPES = {"square": 1.0, "triangle": 0.0}


def densities(eps: float, b: float, ratio: float) -> tuple[float, float]:
    """(e^ε q, q) of the wave with band half-width b and top/bottom ratio ``ratio``: q = 1/(1 +
    2b + (e^ε - 1)·b·(1 + ratio)) (waves other than SW take ε <= 5, so e^ε never overflows)."""
    if ratio == 1.0:
        return sw.densities(eps, b)
    e = math.exp(eps)
    q = 1 / (1 + 2 * b + (e - 1) * b * (1 + ratio))
    return e * q, q


def perturb(values: np.ndarray, eps: float, b: float, ratio: float, u: np.ndarray) -> np.ndarray:
    """One report per user from three uniforms (columns of ``u``).

    The density is a mixture: with probability q·(1 + 2b) uniform on [-b, 1+b] (the floor q), and
    otherwise v plus the normalised shape K. A symmetric trapezoid of half-widths (ratio·b, b) is
    the sum of two centred uniforms of widths (1 + ratio)·b and (1 - ratio)·b, so the bump needs
    two uniforms and no inversion. (SW itself keeps :func:`rayfed.ldp.square_wave.perturb`.)"""
    _, q = densities(eps, b, ratio)
    floor = -b + u[:, 1] * (1 + 2 * b)
    bump = values + (u[:, 1] - 0.5) * (1 + ratio) * b + (u[:, 2] - 0.5) * (1 - ratio) * b
    return np.where(u[:, 0] < q * (1 + 2 * b), floor, bump)


def _shape_area2(x: np.ndarray, b: float, ratio: float) -> np.ndarray:
    """K₂(x) = ∫_{-∞}^{x} (x - z) K(z) dz for the trapezoid, piece by piece so that nothing is
    divided by the (possibly small) slope width b(1 - ratio) after a subtraction:
    0 below -b; (x + b)³/(6s) up to -ratio·b; (A² + AB + B²)/6 with A = x + b, B = x + ratio·b
    on the plateau ((A³ - B³)/(6s) with A - B = s); b(1 + ratio)·x + (b - x)³/(6s) up to b (from
    K₂(x) - K₂(-x) = x·∫K); b(1 + ratio)·x beyond. s = b(1 - ratio)."""
    s = b * (1 - ratio)
    top = ratio * b
    a_, b_ = x + b, x + top
    return np.select(
        [x <= -b, x <= -top, x < top, x < b],
        [
            0.0,
            a_**3 / (6 * s),
            (a_ * a_ + a_ * b_ + b_ * b_) / 6,
            b * (1 + ratio) * x + (b - x) ** 3 / (6 * s),
        ],
        b * (1 + ratio) * x,
    )


def transition_matrix(eps: float, b: float, ratio: float, d: int, d_out: int) -> np.ndarray:
    """M[j, i] = Pr[ṽ in output bucket j | v uniform in input bucket i], exact (dense d̃ x d).

    SW (ratio 1) is :func:`rayfed.ldp.square_wave.transition_matrix`. Otherwise the shape's share
    is the signed sum of K₂ at the rectangle's four corner offsets, as SW's ramp areas are."""
    if ratio == 1.0:
        return sw.transition_matrix(eps, b, d, d_out)
    high, q = densities(eps, b, ratio)
    width_in, width_out = 1.0 / d, (1 + 2 * b) / d_out
    a = (np.arange(d) * width_in)[None, :]
    c = (-b + np.arange(d_out) * width_out)[:, None]
    area = (
        _shape_area2(a + width_in - c, b, ratio)
        - _shape_area2(a - c, b, ratio)
        - _shape_area2(a + width_in - c - width_out, b, ratio)
        + _shape_area2(a - c - width_out, b, ratio)
    )
    return q * width_out + (high - q) * area / width_in


# --- the structured operator --------------------------------------------------------------------
def _kernel_pairs(b: float, ratio: float) -> tuple[int, list[tuple[float, float, float]]]:
    """K as Σ_g w_g·[S_m(z - z_a) - S_m(z - z_b)] (z_a < z_b), S_0 the unit step, S_1 the ramp
    max(z, 0): (m, [(w_g, z_a, z_b)]). Square: one step pair at ∓b; trapezoid: two ramp pairs,
    (-b, -ratio·b) up and (ratio·b, b) down, each of weight 1/(b(1 - ratio))."""
    if ratio == 1.0:
        return 0, [(1.0, -b, b)]
    s = b * (1 - ratio)
    return 1, [(1 / s, -b, -ratio * b), (-1 / s, ratio * b, b)]


def _power_differences(a, c, delta, top: int) -> list:
    """[a^l - c^l for l = 1..top], each as delta·Σ_{i<l} a^i c^(l-1-i) (delta = a - c, given
    exactly): S_1 = 1, S_(l+1) = c·S_l + a^l, by running products (no pow)."""
    out, partial, a_power = [], 1, 1
    for _ in range(top):
        out.append(delta * partial)
        a_power = a_power * a
        partial = c * partial + a_power
    return out


class _Antiderivatives:
    """The n-th antiderivative F_n (F_n = 0 left of the grid) of a piecewise-constant density with
    ``heights`` on the cells [k·width, (k+1)·width) of a grid (coordinates relative to its
    start): prefix values at the cell edges from the exact recurrence
    F_m(e + w) = Σ_l F_{m-l}(e)·w^l/l! (F_0 = the cell's height), and inside a cell the same
    Taylor sum. In extended precision, as prefix sums' rounding grows with the number of cells.

    :meth:`difference` gives F_n(base + hi) - F_n(base + lo) without subtracting two values of
    F_n when the points are close (a band narrower than a bucket at large ε): inside one cell the
    Taylor sums' difference is factored through hi - lo, taken from the offsets themselves."""

    def __init__(self, heights: np.ndarray, width: float, order: int):
        self.width, self.order = width, order
        h = np.concatenate([np.asarray(heights, np.longdouble), [np.longdouble(0)]])
        w = np.longdouble(width)
        prefix = [h]  # prefix[m][k] = F_m(e_k), prefix[0] the heights (0 right of the grid)
        for m in range(1, order + 1):
            step = h[:-1] * w**m / math.factorial(m)
            for j in range(1, m):
                step = step + prefix[m - j][:-1] * w**j / math.factorial(j)
            prefix.append(np.concatenate([[np.longdouble(0)], np.cumsum(step)]))
        self.prefix = prefix

    def _cell(self, y: np.ndarray) -> np.ndarray:
        cells = self.prefix[0].size - 1
        return np.clip(np.floor(y / self.width), 0, cells).astype(np.int64)

    def _taylor(self, k, powers) -> np.ndarray:
        """Σ_{l=1..n} F_{n-l}(e_k)·powers[l-1]/l! (powers[l-1]: s^l, or a difference of them)."""
        n = self.order
        return sum(
            self.prefix[n - j][k] * powers[j - 1] / math.factorial(j) for j in range(1, n + 1)
        )

    def difference(self, base: np.ndarray, hi: float, lo: float) -> np.ndarray:
        n, w = self.order, np.longdouble(self.width)
        y1, y2 = base + hi, base + lo
        k1, k2 = self._cell(y1), self._cell(y2)
        k2 = np.minimum(k2, k1)
        base_ld = np.asarray(base, np.longdouble)
        s1 = (base_ld - k1 * w) + np.longdouble(hi)
        s2 = (base_ld - k2 * w) + np.longdouble(lo)
        clamped = y2 <= 0  # F_n = 0 left of the grid: start the difference at 0
        s2 = np.where(clamped, np.longdouble(0), s2)
        s1 = np.where(y1 <= 0, np.longdouble(0), s1)
        delta = np.where(clamped, s1, np.longdouble(hi) - np.longdouble(lo))
        same = self._taylor(k1, _power_differences(s1, s2, delta, n))
        rest = ((k2 + 1) * w - base_ld) - np.longdouble(lo)  # e_{k2+1} - y2
        rest = np.where(clamped, w, rest)
        apart = (
            self._taylor(k1, _power_differences(s1, np.longdouble(0), s1, n))  # F(y1) - F(e_k1)
            + (self.prefix[n][k1] - self.prefix[n][np.minimum(k2 + 1, k1)])
            + self._taylor(k2, _power_differences(w, s2, rest, n))  # F(e_{k2+1}) - F(y2)
        )
        return np.where(k1 == k2, same, apart)


class WaveOperator:
    """M of the wave (ε, b, ratio) from d input to d̃ output buckets, without storing it:
    ``M @ x`` and ``M.T @ y`` in O(d + d̃) time and memory, equal to the dense
    :func:`transition_matrix` products up to rounding: within 1e-12 relative at d = 256, 2e-11
    at 4,096 (the dense matrix's own rounding there); its columns sum to 1 within 2e-10 at
    d = 2^16 for the waves up to ε = 5 (1.1e-10 measured at ratio 0.9), within 1e-14 for SW at any ε.

    (Mx)_j = q·W̃·Σx + (e^ε q - q)·∫_{B̃_j} (K * f)(t) dt with f = Σ_i (x_i/Δ)·1_{B_i}; each pair
    w·[S_m(· - z_a) - S_m(· - z_b)] of K turns the integral over [lo, hi] into
    w·([F(hi - z_a) - F(hi - z_b)] - [F(lo - z_a) - F(lo - z_b)]), F = F_{m+2} the density's
    (m+2)-th antiderivative. Mᵀy is the same with the grids swapped (K is even)."""

    def __init__(self, eps: float, b: float, ratio: float, d: int, d_out: int):
        self.high, self.q = densities(eps, b, ratio)
        self.b, self.d, self.d_out = b, d, d_out
        self.width_in, self.width_out = 1.0 / d, (1 + 2 * b) / d_out
        self.order, self.pairs = _kernel_pairs(b, ratio)
        self.shape = (d_out, d)

    def _convolved(self, heights, width, bases, shift) -> np.ndarray:
        """∫ of (K * density) over each cell between consecutive ``bases`` + ``shift`` (the
        cells' edges relative to the density grid's start, the small shift kept apart)."""
        f = _Antiderivatives(heights, width, self.order + 2)
        at_edges = sum(
            weight * f.difference(bases, shift - z_a, shift - z_b)
            for weight, z_a, z_b in self.pairs
        )
        return np.asarray(np.diff(at_edges), np.float64)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        edges = np.arange(self.d_out + 1) * self.width_out  # c_j + b
        band = self._convolved(x / self.width_in, self.width_in, edges, -self.b)
        return self.q * self.width_out * x.sum() + (self.high - self.q) * band

    def rmatvec(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, np.float64)
        edges = np.arange(self.d + 1) * self.width_in  # a_i, against the grid's start -b
        band = self._convolved(y, self.width_out, edges, self.b)
        return self.q * self.width_out * y.sum() + (self.high - self.q) * band / self.width_in

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        return self.matvec(x)

    @property
    def T(self) -> _Transposed:  # noqa: N802 (numpy's name)
        return _Transposed(self)


class DiscreteOperator:
    """M of discrete SW (B-R) over {0..d-1}, as :func:`rayfed.ldp.square_wave.
    discrete_transition_matrix` without storing it: M[j, i] = q + (p - q)·[|j - b - i| <= b], so
    (Mx)_j = q·Σx + (p - q)·Σ_{i=j-2b}^{j} x_i, a window sum by prefix sums (extended precision)."""

    def __init__(self, eps: float, d: int):
        self.b, self.p, self.q = sw.discrete_parameters(eps, d)
        self.d = d
        self.shape = (d + 2 * self.b, d)

    @staticmethod
    def _window(values: np.ndarray, before: int, after: int, size: int) -> np.ndarray:
        """Σ values[k] for k in [j - before, j + after] ∩ range, for j = 0..size-1."""
        prefix = np.concatenate([[np.longdouble(0)], np.cumsum(values.astype(np.longdouble))])
        j = np.arange(size)
        hi = np.clip(j + after + 1, 0, values.size)
        lo = np.clip(j - before, 0, values.size)
        return np.asarray(prefix[hi] - prefix[lo], np.float64)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        return self.q * x.sum() + (self.p - self.q) * self._window(x, 2 * self.b, 0, self.shape[0])

    def rmatvec(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, np.float64)
        return self.q * y.sum() + (self.p - self.q) * self._window(y, 0, 2 * self.b, self.d)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        return self.matvec(x)

    @property
    def T(self) -> _Transposed:  # noqa: N802
        return _Transposed(self)


class _Transposed:
    """Mᵀ of a structured operator: ``M.T @ y`` is its ``rmatvec``."""

    def __init__(self, op):
        self.op = op
        self.shape = op.shape[::-1]

    def __matmul__(self, y: np.ndarray) -> np.ndarray:
        return self.op.rmatvec(y)
