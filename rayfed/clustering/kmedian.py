"""Weighted k-median and the k-clustering cost with a power p (p = 2: k-means, p = 1: k-median),
as the DP VFL primitives' Alg. 3 uses them on a weighted product grid."""

from __future__ import annotations

import numpy as np

from rayfed.clustering import nearest, squared_distances, weighted_kmeans


def cost(a: np.ndarray, centers: np.ndarray, p: float, weights: np.ndarray | None = None) -> float:
    """Σ_i w_i · min_c ‖a_i - c‖₂^p."""
    d2 = squared_distances(a, centers).min(axis=1)
    per = d2 if p == 2 else d2 ** (p / 2)
    return float(per.sum() if weights is None else weights @ per)


def weighted_kmedian(
    points: np.ndarray, weights: np.ndarray, k: int, gen: np.random.Generator, iterations: int = 30
) -> np.ndarray:
    """A weighted k-median heuristic: k-means++ start, then Lloyd steps whose center update is the
    weighted geometric median (Weiszfeld iterations)."""
    centers = weighted_kmeans(points, weights, k, gen, n_init=3)
    for _ in range(iterations):
        labels = nearest(points, centers)
        for c in range(k):
            mine = labels == c
            if not (mine.any() and weights[mine].sum() > 0):
                continue
            x, w, z = points[mine], weights[mine], centers[c]
            for _ in range(20):
                dist = np.maximum(np.linalg.norm(x - z, axis=1), 1e-12)
                z = (w / dist) @ x / (w / dist).sum()
            centers[c] = z
    return centers
