"""Matrix-factorisation building blocks (spec federated-mf.md §2.1, §2.4, §5.4)."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from rayfed.errors import DataError
from rayfed.mf import (
    Ratings,
    central_sgd,
    gradient_sums,
    learning_rate,
    load_ratings,
    project,
    split,
    synthetic_ratings,
)

ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens-100k" / "ratings.csv"


def test_projection_is_the_euclidean_projection_onto_the_clipped_set():
    gen = np.random.default_rng(0)
    x = gen.normal(0, 3, (200, 5))
    px = project(x, bound=4.0)
    assert np.all(px >= 0) and np.all(np.linalg.norm(px, axis=1) <= 2.0 + 1e-12)
    assert np.allclose(project(px, 4.0), px)  # idempotent
    # no feasible point is closer (Lemma 5): compare with many random feasible points
    feasible = project(np.abs(gen.normal(0, 3, (2000, 5))), 4.0)
    for row in range(20):
        best = np.linalg.norm(x[row] - px[row])
        assert np.all(np.linalg.norm(feasible - x[row], axis=1) >= best - 1e-12)


def test_gradient_sums_equal_the_per_rating_formula():
    gen = np.random.default_rng(1)
    u, v = gen.random((6, 3)), gen.random((4, 3))
    batch = Ratings(
        np.array([0, 0, 5, 2]), np.array([1, 3, 1, 0]), np.array([4.0, 2.0, 5.0, 1.0]), 6, 4, 1, 5
    )
    g_u, g_v = gradient_sums(u, v, batch)
    ref_u, ref_v = np.zeros_like(u), np.zeros_like(v)
    for i, j, x in zip(batch.user, batch.item, batch.rating, strict=True):
        r = x - u[i] @ v[j]
        ref_u[i] += -2 * r * v[j]
        ref_v[j] += -2 * r * u[i]
    assert np.allclose(g_u, ref_u) and np.allclose(g_v, ref_v)


def test_synthetic_ratings_and_splits():
    gen = np.random.default_rng(2)
    r = synthetic_ratings(300, 200, density=0.05, rng=gen)
    assert np.unique(r.user).size == 300 and np.unique(r.item).size == 200
    assert r.rating.min() >= 1 and r.rating.max() <= 5
    train, test = split(r, 0.1, gen)
    assert len(train) + len(test) == len(r) and abs(len(test) / len(r) - 0.1) < 4 * np.sqrt(
        0.09 / len(r)
    )
    train_u, test_u = split(r, 0.1, gen, by_user=True)
    per_user = np.bincount(r.user, minlength=300)
    got = np.bincount(test_u.user, minlength=300)  # 10 % of each user's ratings, randomly rounded
    assert np.all(
        (got >= np.floor(0.1 * per_user)) & (got <= np.ceil(0.1 * per_user)) & (got < per_user)
    )
    assert len(train_u) + len(test_u) == len(r)
    assert abs(got.sum() - 0.1 * len(r)) < 4 * np.sqrt(
        0.25 * 300
    )  # rounding noise: <= 1/4 per user


def _exact_count_checks(r, n: int, m: int, count: int) -> None:
    cells = r.user * m + r.item
    assert len(r) == count and (r.n, r.m) == (n, m)
    assert np.all(np.diff(cells) > 0)  # distinct, row-major
    assert np.unique(r.user).size == n and np.unique(r.item).size == m  # every user and item


def test_synthetic_count_at_ten_billion_cells_is_sparse():
    """``count=`` at n·m = 10^10 (ML-10M and LibimSeTi are of this order) with a small count: the
    cells are sampled in O(count) memory (a dense n × m score array would be 80 GB)."""
    import time
    import tracemalloc

    n, m, count = 100_000, 100_000, 150_000
    tracemalloc.start()
    try:
        started = time.perf_counter()
        r = synthetic_ratings(n, m, count=count, rng=np.random.default_rng(5))
        took = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _exact_count_checks(r, n, m, count)
    assert peak < 64 * 2**20 and took < 10, (peak, took)
    again = synthetic_ratings(n, m, count=count, rng=np.random.default_rng(5))
    assert np.array_equal(again.user, r.user) and np.array_equal(again.item, r.item)
    assert np.array_equal(again.rating, r.rating)  # deterministic from its generator


def test_synthetic_count_memory_is_of_the_count_not_the_cells():
    """At 4,000 × 4,000 cells (the dense sampler's scores alone: 128 MB) a count of 8,000 peaks
    far below the cells' size."""
    import tracemalloc

    tracemalloc.start()
    try:
        r = synthetic_ratings(4000, 4000, count=8000, rng=np.random.default_rng(6))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _exact_count_checks(r, 4000, 4000, 8000)
    assert peak < 8 * 2**20, peak


@pytest.mark.parametrize("n, m, count", [(100, 100, 200), (40, 25, 300), (30, 7, 30)])
def test_synthetic_count_samples_the_cells_uniformly(n, m, count):
    """Every cell is in the sample with probability count / (n·m), by symmetry of the cover and
    of the uniform rest: over 300 seeds each row's and each column's frequency lies within 6 sd
    of count/n and count/m (the sparse branch at 100 × 100, the permutation branch at 40 × 25 and
    30 × 7 where 30 = max(n, m) is the cover alone)."""
    rows = np.zeros(n)
    cols = np.zeros(m)
    seeds = 300
    for seed in range(seeds):
        r = synthetic_ratings(n, m, count=count, rng=np.random.default_rng(seed))
        _exact_count_checks(r, n, m, count)
        rows += np.bincount(r.user, minlength=n)
        cols += np.bincount(r.item, minlength=m)
    p = count / (n * m)
    for got, size in ((rows, m), (cols, n)):  # a row holds m cells, a column n
        mean = seeds * size * p
        sd = np.sqrt(seeds * size * p * (1 - p))
        assert np.all(np.abs(got - mean) < 6 * sd + 1e-9), (got.min(), got.max(), mean, sd)


def test_learning_rate_schedule():
    assert learning_rate(0, 100, 1.0, 0.1) == 1.0
    assert learning_rate(40, 100, 1.0, 0.1) == pytest.approx(0.55)
    assert learning_rate(80, 100, 1.0, 0.1) == learning_rate(99, 100, 1.0, 0.1) == 0.1


def test_bad_ratings_files(tmp_path):
    path = tmp_path / "r.csv"
    pacsv.write_csv(pa.table({"user_id": [1, 1], "item_id": [2, 2], "rating": [3, 4]}), path)
    with pytest.raises(DataError, match="rated twice"):
        load_ratings(path)
    pacsv.write_csv(pa.table({"user_id": [1, 2], "item_id": [2, 2], "rating": [3, 9]}), path)
    with pytest.raises(DataError, match="bounds"):
        load_ratings(path, bounds=(1, 5))


@pytest.mark.slow
@pytest.mark.parametrize("clip", [None, 5.0], ids=["plain", "clipped"])
def test_central_non_private_mf_on_movielens_100k(clip):
    """Spec §6 acceptance: the non-private central reference lands in the usual 0.85-0.95 MSE range."""
    assert ML100K.exists(), (
        f"the tests read ML-100K from {ML100K} (../shared/data beside the repository)"
    )
    ratings = load_ratings(ML100K, bounds=(1, 5))
    assert (ratings.n, ratings.m, len(ratings)) == (943, 1682, 100_000)
    gen = np.random.default_rng(0)
    train, test = split(ratings, 0.1, gen)
    result = central_sgd(
        train, test, epochs=30, reg=0.1 if clip is None else 0.05, clip=clip, rng=gen
    )
    assert 0.85 <= result.test_mse <= 0.95, result.history


def test_clipping_bounds_the_per_rating_gradients():
    """Spec check C2: with u, v in the clipped sets and X in [0, R], ‖∇u‖, ‖∇v‖ <= 2R^{3/2} and the
    joint step <= 2√2 R^{3/2}; equality at X = R with disjoint supports and ‖u‖² = ‖v‖² = R."""
    bound = 5.0
    gen = np.random.default_rng(3)
    u = project(np.abs(gen.normal(0, 3, (5000, 4))), bound)
    v = project(np.abs(gen.normal(0, 3, (5000, 4))), bound)
    x = gen.uniform(0, bound, 5000)
    resid = x - np.einsum("ij,ij->i", u, v)
    gu, gv = -2 * resid[:, None] * v, -2 * resid[:, None] * u
    limit = 2 * bound**1.5
    assert np.all(np.linalg.norm(gu, axis=1) <= limit + 1e-9) and np.all(
        np.linalg.norm(gv, axis=1) <= limit + 1e-9
    )
    assert np.all(
        np.hypot(np.linalg.norm(gu, axis=1), np.linalg.norm(gv, axis=1))
        <= np.sqrt(2) * limit + 1e-9
    )
    ue, ve = np.array([np.sqrt(bound), 0, 0, 0]), np.array([0, np.sqrt(bound), 0, 0])
    assert np.linalg.norm(-2 * (bound - ue @ ve) * ve) == pytest.approx(limit)
