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
    """t = 2100 > 2^11 = the float64 block: two blocks of the exact product, reduced apart."""
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
    """The largest n is p - 2 (x = id + 1 must stay non-zero and below p); one more is refused
    with a ConfigError naming users, before any search."""
    assert shamir.P == P and shamir.MAX_USERS == P - 2
    check_params(shamir.MAX_USERS, 100, 40, dropout=0.3)
    with pytest.raises(ConfigError, match="users") as err:
        check_params(shamir.MAX_USERS + 1, 100, 40, dropout=0.3)
    assert err.value.field == "users"
    with pytest.raises(ConfigError, match="users"):
        find_params(shamir.MAX_USERS + 1, dropout=0.3)
    assert find_params(2_000_000, dropout=0.3).n == 2_000_000  # beyond the former 2^20 + 5


def test_exact_product_at_its_worst_case_crosses_blocks():
    """Every term at its largest ((p - 1) times a coefficient whose 11-bit limbs are all ones
    where they can be): 4200 terms sum past 2^53 per limb, so one float64 block would round; the
    blocked product must equal the big-int sum."""
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


def test_inverses_match_pow():
    a = np.array([[1, 2, 3, P - 1, P - 2, 2**30, 12345678]])
    want = [pow(int(x), -1, P) for x in a[0]]
    assert shamir._pow_p_minus_2(a[0]).tolist() == want
    assert shamir._inverse(a)[0].tolist() == want
