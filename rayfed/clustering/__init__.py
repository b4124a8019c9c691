"""Numerical building blocks of the clustering protocols: weighted k-means, DPLSF, FM sketches and
the metrics the papers report. Pure functions of arrays and a numpy Generator; no Ray."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import v_measure_score


def seed_of(rng: np.random.Generator) -> int:
    """A 31-bit seed for scikit-learn, drawn from a rayfed stream."""
    return int(rng.integers(0, 2**31 - 1))


def weighted_kmeans(
    points: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator, n_init: int = 10
) -> np.ndarray:
    """k centers by k-means++ / Lloyd on weighted points (scikit-learn). Points of weight <= 0 are
    dropped; with k or fewer distinct points left, they are the centers (repeated), so the result
    always has k rows."""
    keep = weights > 0
    points, weights = points[keep], weights[keep]
    if len(points) == 0:
        raise ValueError("weighted k-means needs at least one point of positive weight")
    distinct = np.unique(points, axis=0)
    if len(distinct) <= k:
        return distinct[np.resize(np.arange(len(distinct)), k)].copy()
    km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed_of(rng))
    return km.fit(points, sample_weight=weights).cluster_centers_


def product_grid(centers: list[np.ndarray], positions: list[list[int]], d: int) -> np.ndarray:
    """(k^v, d): every concatenation of the v parties' local centers (one from each), placed at
    the parties' column positions; cells enumerate in C order over (party 0's center, …)."""
    k = centers[0].shape[0]
    index = np.indices((k,) * len(centers)).reshape(len(centers), -1)
    grid = np.empty((index.shape[1], d))
    for j, (c, pos) in enumerate(zip(centers, positions, strict=True)):
        grid[:, pos] = c[index[j]]
    return grid


def squared_distances(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """(n, k) squared Euclidean distances, ‖x‖² - 2x·c + ‖c‖² clipped at 0."""
    d2 = (x**2).sum(1)[:, None] - 2.0 * x @ centers.T + (centers**2).sum(1)[None, :]
    return np.maximum(d2, 0.0)


def nearest(x: np.ndarray, centers: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Index of the nearest center (squared Euclidean) of every row of ``x``."""
    out = np.empty(len(x), dtype=np.int64)
    c2 = (centers**2).sum(axis=1)
    for a in range(0, len(x), chunk):
        part = x[a : a + chunk]
        out[a : a + len(part)] = np.argmin(c2[None, :] - 2.0 * part @ centers.T, axis=1)
    return out


def normalised_loss(x: np.ndarray, centers: np.ndarray) -> float:
    """(1/n) Σ_x min_c ||x - c||² — the k-means loss per point the VFL k-means paper reports."""
    diff = x - centers[nearest(x, centers)]
    return float(np.einsum("ij,ij->", diff, diff) / len(x))


def v_measure(reference: np.ndarray, x: np.ndarray, centers: np.ndarray) -> float:
    """V-measure (β = 1) of the nearest-center labels against reference labels."""
    return float(v_measure_score(reference, nearest(x, centers)))


def kcluster(d: np.ndarray, k: int, rng: np.random.Generator, max_iter: int = 300) -> np.ndarray:
    """kCluster (Sun, Zhao & Ye, Alg. 2) on a distance matrix: start from k random records as
    singleton clusters, then repeatedly move every record to the cluster with the smallest *average
    distance* to its members (self-distance included; an empty cluster is never chosen) until no
    label changes. Returns the labels."""
    n = d.shape[0]
    seeds = rng.choice(n, k, replace=False)
    labels = np.argmin(d[:, seeds], axis=1)
    for _ in range(max_iter):
        members = np.zeros((n, k), dtype=d.dtype)
        members[np.arange(n), labels] = 1
        count = members.sum(axis=0)
        average = (d @ members) / np.maximum(count, 1)
        average[:, count == 0] = np.inf
        new = np.argmin(average, axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels
