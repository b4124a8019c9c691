"""Local training of MF embeddings (spec federated-mf.md §2.5–2.8): users' own gradient steps with
V fixed, joint steps on (U, V), per-user trimming to θ ratings, and DP-SGD with Poisson sampling of
users (the thesis) or of ratings (per-rating privacy, corrected). Plain numpy on arrays; DP-SGD's
sample and noise come from the caller's NoiseSource (both must be secret for the sampled
accounting)."""

from __future__ import annotations

import numpy as np
from dp_accounting import dp_event

from rayfed import rng
from rayfed.mf import Ratings, gradient_sums, learning_rate, project, row_sums
from rayfed.privacy import Measurement, NoiseSource
from rayfed.privacy.ledger import RUN_SCOPE


def descend_users(
    u: np.ndarray,
    v: np.ndarray,
    rows: np.ndarray,
    items: np.ndarray,
    ratings: np.ndarray,
    *,
    steps: int,
    lr: float,
    bound: float,
) -> np.ndarray:
    """Gradient steps on each user's u_i with V fixed, averaged over the user's own ratings, Π_𝒰.
    ``rows`` is each rating's row of ``u``."""
    counts = np.maximum(np.bincount(rows, minlength=len(u)), 1)[:, None]
    for _ in range(steps):
        resid = ratings - np.einsum("ij,ij->i", u[rows], v[items])
        grad = row_sums(rows, -2.0 * resid[:, None] * v[items], len(u))
        u = project(u - lr * grad / counts, bound)
    return u


def descend_jointly(
    u: np.ndarray, v: np.ndarray, batch: Ratings, *, steps: int, lr: float, bound: float
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient steps on U and V together, each row averaged over its own ratings, Π on both."""
    counts_u = np.maximum(np.bincount(batch.user, minlength=u.shape[0]), 1)[:, None]
    counts_v = np.maximum(np.bincount(batch.item, minlength=v.shape[0]), 1)[:, None]
    for _ in range(steps):
        g_u, g_v = gradient_sums(u, v, batch)
        u, v = (
            project(u - lr * g_u / counts_u, bound),
            project(v - lr * g_v / counts_v, bound),
        )
    return u, v


def trim_mask(
    seed: int, users: np.ndarray, items: np.ndarray, n: int, keep_per_user: int
) -> np.ndarray:
    """Mask keeping at most θ ratings per user, chosen by a draw keyed by (user, item): independent
    of row order."""
    draw = rng.keyed_uniform(
        seed, "trim", 0, users.astype(np.uint64) * np.uint64(2**32) + items, 1
    )[:, 0]
    order = np.lexsort((draw, users))
    counts = np.bincount(users, minlength=n)
    rank = np.arange(users.size) - np.repeat(np.cumsum(counts) - counts, counts)
    keep = np.zeros(users.size, dtype=bool)
    keep[order] = rank < keep_per_user
    return keep


def step_rates(lr: float, lr_end: float | None, first: int, steps: int, total: int):
    """The learning rates of steps ``first`` .. ``first + steps - 1`` of ``total``: ``lr`` itself
    when ``lr_end`` is None (constant), else the linear decay from lr to lr_end over the first
    80 % of the ``total`` steps, then lr_end (spec §5.3, §7.9)."""
    if lr_end is None:
        return lr
    return np.array([learning_rate(first + s, total, lr, lr_end) for s in range(steps)])


def poisson_batch(
    noise: NoiseSource, users: np.ndarray, n: int, *, round: int, rate: float, sampled: str
) -> np.ndarray:
    """The rows of one Poisson batch of the training ratings whose users are ``users`` (of ``n``):
    each user with probability ``rate``, all of its ratings with it (``sampled="user"``), or each
    rating on its own (``sampled="rating"``: what amplifies per-rating privacy). Drawn through the
    source's :meth:`~rayfed.privacy.NoiseSource.poisson_sample`: the sample backs the sampled
    event the step's release then registers."""
    if sampled == "rating":
        return np.flatnonzero(noise.poisson_sample(rate, users.size, round=round))
    return np.flatnonzero(noise.poisson_sample(rate, n, round=round)[users])


def releases_event(release: Measurement, times: int) -> dp_event.DpEvent:
    """The event of ``times`` draws of ``release``: what its charge holds (and a message carries)."""
    return release.charge(RUN_SCOPE, times=times)[2]


def dp_sgd(
    noise: NoiseSource,
    u: np.ndarray,
    v: np.ndarray,
    train: tuple[np.ndarray, np.ndarray, np.ndarray],
    n: int,
    *,
    steps: int,
    round: int,
    lr: float | np.ndarray,
    rate: float,
    release: Measurement | None,
    bound: float,
    m_share: float,
    update_u: bool,
    sampled: str,
) -> tuple[np.ndarray, np.ndarray, dp_event.DpEvent | None]:
    """``steps`` DP-SGD steps (spec §2.5) on the (users, items, ratings) ``train`` of ``n`` users:
    a Poisson batch of ``sampled`` units (:func:`poisson_batch`), the released gradient sums plus
    N(0, (zΔ)²) drawn by ``release`` (on (g_U, g_V) jointly when U is updated, Δ their joint
    sensitivity), divided by the public B = η|Ω|, projected. Returns (U, V, the event of the
    ``steps`` releases: ``release``'s — the subsampled Gaussian, or one rating of a sampled
    user's :class:`~rayfed.privacy.ledger.UnitInSampledGroupGaussianDpEvent`).
    ``lr``: one rate, or one per step (:func:`step_rates`). ``release=None``: the same steps
    without noise (the non-private federated reference, spec §6 C3), and no event: nothing is
    DP."""
    users, items, ratings = train
    b = max(rate * users.size, 1.0)
    rates = np.broadcast_to(lr, (steps,))
    for gamma in rates:
        rows = poisson_batch(noise, users, n, round=round, rate=rate, sampled=sampled)
        batch = Ratings(users[rows], items[rows], ratings[rows], n, v.shape[0], 0, bound)
        g_u, g_v = gradient_sums(u, v, batch)
        released = np.concatenate([g_u.ravel(), g_v.ravel()]) if update_u else g_v.ravel()
        noisy = released if release is None else release(noise, released, round=round)[0]
        if update_u:
            u = project(u - gamma * noisy[: u.size].reshape(u.shape) / b, bound)
        v = project(v - gamma * m_share * noisy[-v.size :].reshape(v.shape) / b, bound)
    return u, v, None if release is None else releases_event(release, steps)
