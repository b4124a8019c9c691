"""The Shamir field GF(2^31 - 1) against an independent reference in Python integers: shares are
the polynomial evaluated with big ints, secrets come back by exact Lagrange interpolation with
``pow(x, -1, p)``; and the field's size is the users limit of secure aggregation."""

from __future__ import annotations

import numpy as np
import pytest

from rayfed.errors import ConfigError
from rayfed.secagg import shamir
from rayfed.secagg.params import check_params, find_params

P = 2**31 - 1  # stated here, not read from the module under test


def ref_coefficients(secret: bytes, words: np.ndarray, t: int) -> list[list[int]]:
    """Per chunk c: [a_0, …, a_{t-1}] with a_0 the c-th 30-bit chunk of the secret (big-endian,
    zero-padded to 270 bits) and a_k = (w1 · 2^64 + w2) mod p for the k-th pair of words."""
    value = int.from_bytes(secret, "big")
    chunks = [(value >> (30 * (8 - c))) & (2**30 - 1) for c in range(9)]
    out = []
    for c in range(9):
        row = [chunks[c]]
        for k in range(t - 1):
            w1, w2 = int(words[k, 2 * c]), int(words[k, 2 * c + 1])
            row.append((w1 * 2**64 + w2) % P)
        out.append(row)
    return out


def ref_share(coefs: list[list[int]], x: int) -> list[int]:
    out = []
    for row in coefs:  # Horner
        acc = 0
        for a in reversed(row):
            acc = (acc * x + a) % P
        out.append(acc)
    return out


def ref_lagrange(xs: list[int]) -> list[int]:
    """λ_j = Π_{m≠j} x_m / (x_m - x_j) mod p, one inverse per j."""
    lams = []
    for j, xj in enumerate(xs):
        num = den = 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % P
                den = den * (xm - xj) % P
        lams.append(num * pow(den, -1, P) % P)
    return lams


def ref_interpolate(xs: list[int], ys: list[list[int]]) -> bytes:
    lams = ref_lagrange(xs)
    chunks = [sum(lam * y[c] for lam, y in zip(lams, ys, strict=True)) % P for c in range(9)]
    value = sum(ch << (30 * (8 - c)) for c, ch in enumerate(chunks))
    return value.to_bytes(32, "big")


def check_against_reference(
    t: int, points: np.ndarray, n_secrets: int, seed: int, checked: int | None = None
) -> None:
    """Shares at the first ``checked`` points (all by default) equal the reference's; t shares
    picked at random interpolate, by the reference and by the module, to the secrets."""
    gen = np.random.default_rng(seed)
    secrets = gen.integers(0, 256, (n_secrets, 32), dtype=np.uint8)
    secrets[0] = 255  # every chunk at its largest
    words = gen.integers(0, 2**64, (n_secrets, t - 1, shamir.COEF_WORDS), dtype=np.uint64)
    words[0] = 2**64 - 1  # the largest words
    shares = shamir.split(secrets, points, t, words)
    all_points = np.broadcast_to(points, (n_secrets, points.shape[-1]))
    for s in range(n_secrets):
        coefs = ref_coefficients(secrets[s].tobytes(), words[s], t)
        want = [ref_share(coefs, int(x)) for x in all_points[s][:checked]]
        assert shares[s][:checked].tolist() == want, f"secret {s}"
    pick = np.stack([gen.choice(points.shape[-1], t, replace=False) for _ in range(n_secrets)])
    xs = np.take_along_axis(all_points, pick, axis=1)
    ys = np.take_along_axis(shares, pick[:, :, None], axis=1)
    got = shamir.reconstruct(xs, ys)
    for s in range(n_secrets):
        assert ref_interpolate(xs[s].tolist(), ys[s].tolist()) == secrets[s].tobytes()
        assert got[s].tobytes() == secrets[s].tobytes()


@pytest.mark.parametrize("t", [1, 2, 7])
def test_small_thresholds_match_big_int_reference(t):
    gen = np.random.default_rng(t)
    points = np.stack([gen.choice(np.arange(1, 5000), t + 3, replace=False) for _ in range(4)])
    check_against_reference(t, points, 4, seed=10 + t)


def test_points_near_p_match_reference():
    """x close to p: powers wrap many times, x - x_j differences span the whole field."""
    points = np.array([P - 1, P - 2, P - 3, P - 1000, 1, 2, 2**30, 2**31 - 2**20])
    check_against_reference(5, points, 3, seed=2)
    check_against_reference(5, np.stack([points, points[::-1]]), 2, seed=3)


def test_large_threshold_across_a_block_boundary_matches_reference():
    """t = 2100 > 2^8 = the float64 block: nine blocks of the exact product, summed in int64."""
    gen = np.random.default_rng(4)
    t = 2100
    points = gen.choice(np.arange(P - 10**6, P), t + 2, replace=False)
    check_against_reference(t, points, 1, seed=5, checked=4)


def test_threshold_300_per_secret_points_match_reference():
    gen = np.random.default_rng(6)
    points = np.stack([gen.choice(np.arange(P - 10**5, P), 310, replace=False) for _ in range(2)])
    check_against_reference(300, points, 2, seed=7)


def test_lagrange_coefficients_match_reference():
    xs = np.array([[P - 1, 3, 2**30, 17, P - 5000]])
    want = []
    for j, xj in enumerate(xs[0].tolist()):
        lam = 1
        for m, xm in enumerate(xs[0].tolist()):
            if m != j:
                lam = lam * xm * pow(xm - xj, -1, P) % P
        want.append(lam)
    assert shamir.lagrange_at_zero(xs)[0].tolist() == want
    assert ref_lagrange(xs[0].tolist()) == want


def test_field_boundary_is_the_users_limit():
    """The largest n is p - 2; one more is refused with a ConfigError naming users, before any
    search. x = id + 1 lies in [1, n], non-zero and below p, so p - 1 users would still fit:
    keeping p - 2 is conservative by one user."""
    assert shamir.P == P and shamir.MAX_USERS == P - 2
    check_params(shamir.MAX_USERS, 100, 40, dropout=0.3)
    with pytest.raises(ConfigError, match="users") as err:
        check_params(shamir.MAX_USERS + 1, 100, 40, dropout=0.3)
    assert err.value.field == "users"
    with pytest.raises(ConfigError, match="users"):
        find_params(shamir.MAX_USERS + 1, dropout=0.3)
    assert find_params(2_000_000, dropout=0.3).n == 2_000_000  # beyond the former 2^20 + 5


def test_exact_product_at_its_worst_case_crosses_blocks():
    """The largest residues (p - 1, p - 2: balanced -1, -2) times 2^31 - 2 and 2^22 - 1 over 4200
    terms, 17 blocks: the blocked product must equal the big-int sum."""
    k = 4200
    a = np.full((2, 1, k), P - 1, dtype=np.int64)
    a[1, 0, ::3] = P - 2
    b = np.full((2, k, 2), 2**31 - 2, dtype=np.int64)
    b[:, :, 1] = 2**22 - 1
    got = shamir._matmul_mod(a, b)
    for s in range(2):
        for c in range(2):
            want = sum(int(x) * int(y) for x, y in zip(a[s, 0], b[s, :, c], strict=True)) % P
            assert got[s, 0, c] == want


HALF = (P - 1) // 2


def _balanced_with_low_limb(lo: int, hi: int) -> int:
    """The residue in [0, p) whose balanced value (in [-HALF, HALF]) is lo + hi · 2^16."""
    value = lo + hi * 2**16
    assert -HALF <= value <= HALF
    return value % P


def _worst_case(k: int) -> tuple[np.ndarray, np.ndarray]:
    """(2, k) @ (k, 4) at the product's largest terms: a = ±HALF (balanced 2^30 - 1, odd; one even
    term per row, so every sum is odd), b with an odd low 16-bit limb of ±(2^15 - 1) (or -2^15 + 1)
    and an odd high limb of the largest magnitude: every term is odd, near 2^45 and of one sign."""
    a = np.full((2, k), HALF, dtype=np.int64)
    a[1] = HALF + 1  # balanced -HALF
    a[0, 0], a[1, 0] = HALF - 1, HALF + 2
    cols = [
        _balanced_with_low_limb(2**15 - 1, 2**14 - 1),
        _balanced_with_low_limb(-(2**15) + 1, -(2**14) + 1),
        _balanced_with_low_limb(2**15 - 1, -(2**14) + 1),
        2**31 - 3,  # p - 2: balanced -1
    ]
    return a, np.tile(np.array(cols, dtype=np.int64), (k, 1))


def _big_int_product(a: np.ndarray, b: np.ndarray) -> list[list[int]]:
    rows = [[int(x) for x in row] for row in a]
    cols = [[int(x) for x in col] for col in b.T]
    return [[sum(x * y for x, y in zip(r, c, strict=True)) % P for c in cols] for r in rows]


def test_exact_product_of_odd_terms_in_one_block_of_512():
    """512 odd terms near 2^45 of one sign (one even per row): a float64 block of 512 sums to an
    odd integer above 2^53 in magnitude, which no float64 holds whatever order BLAS adds in; blocks
    of 2^8 stay below 2^53 and exact."""
    a, b = _worst_case(512)
    assert shamir._matmul_mod(a, b).tolist() == _big_int_product(a, b)


def test_exact_product_past_the_int64_reduction_interval():
    """2^18 + 10^4 worst-case terms: 1,064 blocks whose sums near 2^53 of one sign would pass 2^63
    in int64 without the reduction every 128 blocks."""
    a, b = _worst_case(2**18 + 10**4)
    b = b[:, :2]
    assert shamir._matmul_mod(a, b).tolist() == _big_int_product(a, b)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_reduction_at_its_edges_matches_python(dtype):
    """_red on p, 2p - 1 (one fold leaves exactly p: the final subtraction), 2^62, 2^63 - 1,
    (p - 1)^2 and, for uint64, 2^64 - 1."""
    values = [0, 1, P - 1, P, P + 1, 2 * P - 1, 2 * P, 2**62, 2**63 - 1, (P - 1) ** 2]
    if dtype is np.uint64:
        values += [2**63, 2**64 - 1, 2**64 - 2]
    got = shamir._red(np.array(values, dtype=dtype))
    assert got.dtype == dtype
    assert got.tolist() == [v % P for v in values]


def test_duplicate_or_zero_points_are_refused_not_reconstructed_to_zero():
    """Duplicate points make a Lagrange denominator 0 (and every inverse of its row 0, a silent
    all-zero secret); a point ≡ 0 mod p would share the secret itself."""
    with pytest.raises(ValueError, match="distinct"):
        shamir.lagrange_at_zero(np.array([[1, 2, 3], [4, 5, 4]]))
    with pytest.raises(ValueError, match="distinct"):
        shamir.lagrange_at_zero(np.array([[1, P + 2, 2]]))  # P + 2 ≡ 2
    with pytest.raises(ValueError, match="non-zero"):
        shamir.lagrange_at_zero(np.array([[1, P, 2]]))
    with pytest.raises(ValueError, match="distinct"):
        shamir.lagrange_leave_one_out(np.array([3, 9, 3, 4]))
    gen = np.random.default_rng(8)
    secrets = gen.integers(0, 256, (2, 32), dtype=np.uint8)
    words = gen.integers(0, 2**64, (2, 2, shamir.COEF_WORDS), dtype=np.uint64)
    shares = shamir.split(secrets, np.array([1, 2, 3]), 3, words)
    with pytest.raises(ValueError, match="distinct"):
        shamir.reconstruct(np.array([[1, 2, 3], [1, 1, 2]]), shares[:, [0, 1, 2]])
    for bad in ([0, 1, 2], [1, P, 2], [1, -P, 2], [2 * P, 1, 2]):
        with pytest.raises(ValueError, match="non-zero"):
            shamir.split(secrets, np.array(bad), 3, words)
        with pytest.raises(ValueError, match="non-zero"):
            shamir.split(secrets, np.array([bad, [1, 2, 3]]), 3, words)


def test_a_perturbed_share_is_detected_by_the_top_bits():
    """A 32-byte secret fills 256 of the 270 bits of 9 chunks: the first chunk's top 14 bits are 0.
    Perturbing chunk 0 of one share moves chunk 0 of the result to λ·δ away, a near-uniform
    element: below 2^30 but with a top bit set (caught only by the 256-bit check) about half the
    time, at or above 2^30 (the range check) the other half. Every perturbed set is refused and,
    with this seed, both checks are met."""
    gen = np.random.default_rng(11)
    s_count, t = 24, 5
    secrets = gen.integers(0, 256, (s_count, 32), dtype=np.uint8)
    words = gen.integers(0, 2**64, (s_count, t - 1, shamir.COEF_WORDS), dtype=np.uint64)
    points = np.arange(1, t + 3)
    shares = shamir.split(secrets, points, t, words)
    xs = np.broadcast_to(points[:t], (s_count, t))
    assert np.array_equal(shamir.reconstruct(xs, shares[:, :t]), secrets)
    messages = []
    for s in range(s_count):
        ys = shares[s : s + 1, :t].copy()
        j = int(gen.integers(0, t))
        ys[0, j, 0] = (int(ys[0, j, 0]) + int(gen.integers(1, P))) % P
        with pytest.raises(ValueError, match="inconsistent") as err:
            shamir.reconstruct(xs[s : s + 1], ys)
        messages.append(str(err.value))
    assert any("exceeds 256 bits" in m for m in messages)
    assert any("out of range" in m for m in messages)


def test_inverses_match_pow():
    a = np.array([[1, 2, 3, P - 1, P - 2, 2**30, 12345678]])
    want = [pow(int(x), -1, P) for x in a[0]]
    assert shamir._pow_p_minus_2(a[0]).tolist() == want
    assert shamir._inverse(a)[0].tolist() == want
