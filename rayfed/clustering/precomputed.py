"""Clustering a precomputed n x n distance matrix (the collector of ldp-bitvector has no points,
only estimated distances): kCluster with restarts, DBSCAN and agglomerative clustering."""

from __future__ import annotations

import math

import numpy as np
from sklearn.cluster import DBSCAN, AgglomerativeClustering

from rayfed.clustering import kcluster


def best_kcluster(d: np.ndarray, k: int, gen: np.random.Generator, restarts: int) -> np.ndarray:
    """kCluster from ``restarts`` random starts; the labels of the start with the smallest Eq. 17
    objective Σ_i (average distance of record i to its own cluster's members)."""
    best, best_cost = None, math.inf
    for _ in range(restarts):
        labels = kcluster(d, k, gen)
        members = np.zeros((d.shape[0], k), dtype=d.dtype)
        members[np.arange(d.shape[0]), labels] = 1
        cost = float(
            (
                (d @ members)[np.arange(d.shape[0]), labels] / np.maximum(members.sum(0), 1)[labels]
            ).sum()
        )
        if cost < best_cost:
            best, best_cost = labels, cost
    return best


def dbscan(d: np.ndarray, eps: float, min_samples: int) -> np.ndarray:
    """DBSCAN labels (-1: noise) of a distance matrix."""
    return DBSCAN(eps=eps, min_samples=min_samples, metric="precomputed").fit_predict(d)


def agglomerative(d: np.ndarray, k: int, linkage: str) -> np.ndarray:
    """Agglomerative clustering of a distance matrix into k clusters."""
    return AgglomerativeClustering(n_clusters=k, metric="precomputed", linkage=linkage).fit_predict(
        d
    )
