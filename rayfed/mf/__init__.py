"""Matrix-factorisation building blocks shared by the federated-MF protocols (spec federated-mf.md).

Ratings are an Arrow table ``(user, item, rating)`` with dense 0-based ``user``/``item`` indices.
Everything here is plain numpy on arrays of ratings — vectorised over ratings and embedding rows,
never a Python loop per rating or per user:

* data: loading a ratings file, a synthetic low-rank generator, the 90/10 split;
* maths: initialisation, the embedding-clipping projection Π (spec §2.4), per-rating gradients
  summed by scatter-add (§2.1), the learning-rate schedule (§7.9), test MSE;
* the non-private central SGD baseline (spec §5.4 / §7.12).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from rayfed.data import load_table, require_clean, require_columns
from rayfed.errors import ConfigError, DataError

COLUMNS = ("user", "item", "rating")


@dataclass(frozen=True)
class Ratings:
    """Ratings with dense indices: ``n`` users, ``m`` items, ratings in [``low``, ``high``]."""

    user: np.ndarray
    item: np.ndarray
    rating: np.ndarray
    n: int
    m: int
    low: float
    high: float

    def __len__(self) -> int:
        return int(self.rating.size)

    def take(self, rows: np.ndarray) -> Ratings:
        return Ratings(
            self.user[rows], self.item[rows], self.rating[rows], self.n, self.m, self.low, self.high
        )

    def to_table(self) -> pa.Table:
        return pa.table({"user": self.user, "item": self.item, "rating": self.rating})


def load_ratings(
    path: str | Path,
    *,
    user: str = "user_id",
    item: str = "item_id",
    rating: str = "rating",
    bounds: tuple[float, float] | None = None,
    format: str = "auto",
) -> Ratings:
    """A ratings file (CSV/Parquet/Arrow) with user, item and rating columns; ids become dense
    indices in sorted order. ``bounds`` declares the rating range (default: the file's own min/max,
    which is public metadata of a ratings scale, not of a user)."""
    table = load_table(path, format)
    require_columns(table, [user, item, rating], "data.columns")
    require_clean(table, [user, item, rating])
    users, u_index = np.unique(
        table.column(user).to_numpy(zero_copy_only=False), return_inverse=True
    )
    items, i_index = np.unique(
        table.column(item).to_numpy(zero_copy_only=False), return_inverse=True
    )
    values = table.column(rating).to_numpy(zero_copy_only=False).astype(np.float64)
    low, high = bounds if bounds is not None else (float(values.min()), float(values.max()))
    if values.min() < low or values.max() > high:
        raise DataError(
            f"data.{rating}",
            f"ratings outside the declared bounds [{low}, {high}]",
            "declare bounds that hold every rating",
        )
    keys = u_index.astype(np.int64) * len(items) + i_index
    if np.unique(keys).size != keys.size:
        raise DataError("data", "a (user, item) pair is rated twice", "one rating per pair")
    return Ratings(
        u_index.astype(np.int64),
        i_index.astype(np.int64),
        values,
        len(users),
        len(items),
        low,
        high,
    )


def synthetic_ratings(
    n: int,
    m: int,
    *,
    rank: int = 5,
    density: float = 0.05,
    noise: float = 0.3,
    low: float = 1.0,
    high: float = 5.0,
    count: int | None = None,
    rng: np.random.Generator,
) -> Ratings:
    """A low-rank rating matrix: X = clip(A Bᵀ + N(0, noise²)), A, B non-negative, observed
    entries chosen with probability ``density`` (every user and item keeps at least one rating),
    or, given ``count``, exactly ``count`` entries (``density`` unused): a random cover of every
    user and item, the rest uniform over the other cells."""
    if not (n >= 1 and m >= 1 and rank >= 1 and 0 < density <= 1):
        raise ConfigError("synthetic", "users, items and rank must be >= 1 and density in (0, 1]")
    if count is not None and not max(n, m) <= count <= n * m:
        raise ConfigError(
            "synthetic", f"count must lie in [max(users, items), users·items], got {count}"
        )
    mid = (low + high) / 2
    a = rng.uniform(0, 1, (n, rank))
    b = rng.uniform(0, 1, (m, rank))
    scale = mid / (a.mean() * b.mean() * rank)
    if count is None:
        observed = rng.random((n, m)) < density
        observed[np.arange(n), rng.integers(0, m, n)] = True
        observed[rng.integers(0, n, m), np.arange(m)] = True
        users, items = np.nonzero(observed)
    else:
        users, items = _exact_cells(n, m, count, rng)
    values = np.einsum("ij,ij->i", a[users], b[items]) * scale + rng.normal(0, noise, users.size)
    return Ratings(
        users.astype(np.int64), items.astype(np.int64), np.clip(values, low, high), n, m, low, high
    )


def _exact_cells(n: int, m: int, count: int, rng: np.random.Generator):
    """``count`` distinct (user, item) cells in row-major order, every user and item in one: a
    cover of max(n, m) cells (user k mod n with item k mod m, both randomly permuted), then a
    uniform sample without replacement of the other cells, in O(count) memory (never an n × m
    array): where the cells outnumber 4·count, linear indices drawn uniformly and the repeats and
    cover cells rejected (the first distinct draws are a uniform sample; three in four or more
    are kept); else a permutation of the other cells' indices (fewer than 4·count of them)."""
    k = np.arange(max(n, m), dtype=np.int64)
    cover = np.sort(rng.permutation(n)[k % n].astype(np.int64) * m + rng.permutation(m)[k % m])
    total, need = n * m, count - cover.size
    if total <= 4 * count:
        others = np.setdiff1d(np.arange(total, dtype=np.int64), cover, assume_unique=True)
        rest = others[rng.permutation(others.size)[:need]]
    else:
        rest = np.empty(0, dtype=np.int64)
        while rest.size < need:
            draws = rng.integers(0, total, size=2 * (need - rest.size) + 16, dtype=np.int64)
            draws = np.concatenate([rest, draws])
            _, first = np.unique(draws, return_index=True)
            first.sort()  # each distinct value at its first draw, in draw order
            fresh = draws[first]
            rest = fresh[~np.isin(fresh, cover, assume_unique=True)][:need]
    cells = np.sort(np.concatenate([cover, rest]))
    return cells // m, cells % m


def split(
    ratings: Ratings, test_fraction: float, rng: np.random.Generator, *, by_user: bool = False
) -> tuple[Ratings, Ratings]:
    """(train, test): a random ``test_fraction`` of the ratings, or of each user's ratings
    (randomly rounded, so a user with few ratings still contributes test ratings on average)."""
    if not 0 < test_fraction < 1:
        raise ConfigError("test_fraction", f"must be in (0, 1), got {test_fraction}")
    u = rng.random(len(ratings))
    if by_user:  # each user's lowest draws go to the test set: fraction·count, randomly rounded,
        # and never the user's last rating
        counts = np.bincount(ratings.user, minlength=ratings.n)
        quota = np.minimum(
            np.floor(test_fraction * counts + rng.random(ratings.n)), np.maximum(counts - 1, 0)
        )
        order = np.lexsort((u, ratings.user))
        rank = np.arange(len(ratings)) - np.repeat(np.cumsum(counts) - counts, counts)
        test = np.zeros(len(ratings), dtype=bool)
        test[order] = rank < quota[ratings.user[order]]
    else:
        test = u < test_fraction
    if not test.any():  # the test MSE would be the mean of nothing (it read 0.0000)
        single = by_user and not np.any(np.bincount(ratings.user) > 1)
        raise ConfigError(
            "test_fraction",
            f"{test_fraction:g} holds out none of the {len(ratings):,} ratings, so there would be "
            "no test MSE"
            + (
                "; every user has a single rating, and a user's last is never held out"
                if single
                else ""
            ),
            "users with 2 or more ratings (more items, or a denser population)"
            if single
            else f"a fraction that holds out at least one rating (about "
            f"{1 / max(len(ratings), 1):.2g} or more; < 1)",
        )
    return ratings.take(np.flatnonzero(~test)), ratings.take(np.flatnonzero(test))


# --- maths ---------------------------------------------------------------------------------------
def init_embeddings(rows: int, p: int, mean_rating: float, rng: np.random.Generator) -> np.ndarray:
    """Non-negative uniform entries with E⟨u, v⟩ ≈ the mean rating (spec §7.10)."""
    return rng.uniform(0.0, 2.0 * np.sqrt(mean_rating / p), (rows, p))


def project(x: np.ndarray, bound: float) -> np.ndarray:
    """Π onto {x >= 0, ‖x‖² <= R} row-wise (spec §2.4, Lemma 5): zero the negatives, then rescale."""
    x = np.maximum(x, 0.0)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(1.0, norms / np.sqrt(bound))


def row_gradient_radius(bound: float) -> float:
    """2R^{3/2}: the radius of the ball one rating's gradient row lies in. The row is
    −2(x − ⟨u_i, v_j⟩)·u_i (or ·v_j) with x and the prediction in [0, R] (|x − ⟨u_i, v_j⟩| <= R)
    and every embedding row in 𝒰/𝒱 (‖·‖² <= R, kept there by :func:`project`), so its norm is at
    most 2·R·√R; reached at u_i = √R·e₀, x = R, prediction 0 (tests/test_federated_mf_extremal.py
    checks the supremum)."""
    return 2.0 * bound**1.5


def predict(u: np.ndarray, v: np.ndarray, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", u[users], v[items])


def mse(u: np.ndarray, v: np.ndarray, ratings: Ratings) -> float:
    return float(np.mean((predict(u, v, ratings.user, ratings.item) - ratings.rating) ** 2))


def gradient_sums(u: np.ndarray, v: np.ndarray, batch: Ratings) -> tuple[np.ndarray, np.ndarray]:
    """Σ over the batch of the per-rating gradients (spec §2.1), by scatter-add:
    G_U[i] += -2 r_ij v_j and G_V[j] += -2 r_ij u_i with r_ij = X_ij - ⟨u_i, v_j⟩."""
    resid = batch.rating - predict(u, v, batch.user, batch.item)
    g_u = row_sums(batch.user, -2.0 * resid[:, None] * v[batch.item], u.shape[0])
    g_v = row_sums(batch.item, -2.0 * resid[:, None] * u[batch.user], v.shape[0])
    return g_u, g_v


def row_sums(index: np.ndarray, values: np.ndarray, n_rows: int) -> np.ndarray:
    """out[r] = Σ_{i: index[i] = r} values[i], an (n_rows x width) array: ``np.add.at`` on zeros,
    column by column with ``np.bincount`` — the same additions in the same order (bit for bit),
    without ``np.add.at``'s per-element dispatch."""
    out = np.zeros((n_rows, values.shape[1]), dtype=np.float64)
    for c in range(values.shape[1]):
        out[:, c] = np.bincount(index, weights=values[:, c], minlength=n_rows)
    return out


def learning_rate(step: int, total: int, lr0: float, lr_end: float) -> float:
    """Linear decay from lr0 to lr_end over the first 80 % of steps, then constant (spec §5.3, §7.9)."""
    ramp = max(1, int(0.8 * total))
    return lr_end if step >= ramp else lr0 + (lr_end - lr0) * step / ramp


@dataclass
class CentralResult:
    u: np.ndarray
    v: np.ndarray
    train_mse: float
    test_mse: float
    history: list[tuple[int, float]]


def central_sgd(
    train: Ratings,
    test: Ratings,
    *,
    p: int = 20,
    epochs: int = 30,
    batch: int = 256,
    lr: float = 0.02,
    reg: float = 0.1,
    clip: float | None = None,
    rng: np.random.Generator,
) -> CentralResult:
    """The non-private central reference: minibatch SGD on all ratings, L2 penalty ``reg``, optional
    embedding clipping Π with bound ``clip`` (spec §7.12: report both)."""
    mean = float(train.rating.mean())
    u = init_embeddings(train.n, p, mean, rng)
    v = init_embeddings(train.m, p, mean, rng)
    history = []
    for epoch in range(epochs):
        order = rng.permutation(len(train))
        for a in range(0, order.size, batch):
            b = train.take(order[a : a + batch])
            resid = b.rating - predict(u, v, b.user, b.item)
            grad_u = -2.0 * resid[:, None] * v[b.item] + 2.0 * reg * u[b.user]
            grad_v = -2.0 * resid[:, None] * u[b.user] + 2.0 * reg * v[b.item]
            np.add.at(u, b.user, -lr * grad_u)
            np.add.at(v, b.item, -lr * grad_v)
            if clip is not None:
                u[b.user] = project(u[b.user], clip)
                v[b.item] = project(v[b.item], clip)
        history.append((epoch, mse(u, v, test)))
    return CentralResult(u, v, mse(u, v, train), mse(u, v, test), history)
