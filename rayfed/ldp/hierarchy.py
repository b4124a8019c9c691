"""Hierarchical histograms under LDP (spec §2.5–2.6): HH with constrained inference (Hay et al.),
HH-ADMM, and the Haar-wavelet hierarchy with HRR.

A β-ary tree over d = β^h leaves; layer ℓ = 1..h (1 = leaves) has β^(h+1-ℓ) nodes. Each user
reports one layer, chosen uniformly, with the whole ε (the population is split, not the budget).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import nnls


def depth(d: int, branching: int) -> int:
    """h with branching^h = d, or ValueError."""
    h = round(math.log(d, branching))
    if branching**h != d:
        raise ValueError(f"{d} buckets are not a power of {branching}")
    return h


def layer_sizes(d: int, branching: int) -> list[int]:
    """Node counts of layers 1..h (leaves first)."""
    return [d // branching**level for level in range(depth(d, branching))]


def ancestor(leaf: np.ndarray, layer: np.ndarray, branching: int) -> np.ndarray:
    """Index of each leaf's ancestor at ``layer`` (1 = the leaf itself)."""
    return leaf // branching ** (layer - 1)


def constrained_inference(layers: list[np.ndarray], branching: int) -> list[np.ndarray]:
    """Hay et al.'s least-squares consistency for equal-variance nodes, root fixed to 1: returns
    layers (leaves first) in which every parent equals the sum of its children."""
    k = branching
    z = [layers[0].astype(np.float64)]
    for i, est in enumerate(layers[1:], start=2):  # height i (leaves are height 1)
        children = z[-1].reshape(-1, k).sum(axis=1)
        z.append(((k**i - k ** (i - 1)) * est + (k ** (i - 1) - 1) * children) / (k**i - 1))
    out = [z[-1] + (1.0 - z[-1].sum()) / z[-1].size]  # the root is known: 1
    for level in range(len(z) - 2, -1, -1):
        parent = np.repeat(out[0], k)
        sums = np.repeat(z[level].reshape(-1, k).sum(axis=1), k)
        out.insert(0, z[level] + (parent - sums) / k)
    return out


def aggregation_matrix(d: int, branching: int) -> np.ndarray:
    """T (nodes of layers 1..h, stacked leaves first) x d: row = the leaves under that node."""
    rows = []
    for size in layer_sizes(d, branching):
        span = d // size
        rows.append(np.kron(np.eye(size), np.ones((1, span))))
    return np.vstack(rows)


def admm_leaves(layers: list[np.ndarray], branching: int, weight: float = 1e4) -> np.ndarray:
    """HH-ADMM's optimum (spec §2.6): min ½‖Tℓ - x̃‖² over leaves ℓ >= 0 with Σℓ = 1 — the same
    unique point ADMM converges to — solved by SciPy's NNLS with the sum as a heavily weighted
    row, then renormalised exactly. Every node is then a sum of leaves, so the tree is consistent."""
    d = layers[0].size
    t = aggregation_matrix(d, branching)
    a = np.vstack([t, weight * np.ones((1, d))])
    target = np.concatenate([np.concatenate(layers), [weight]])
    leaves, _ = nnls(a, target, maxiter=50 * d)
    total = leaves.sum()
    return leaves / total if total > 0 else np.full(d, 1.0 / d)


def haar_leaves(coefficients: list[np.ndarray]) -> np.ndarray:
    """Leaves from Haar differences: coefficients[h-1] holds, for each node at height h, the
    estimate of (C_left - C_right)/n; x_leaf = 1/d + Σ_ancestors sign · D_a / 2^h."""
    heights = len(coefficients)
    d = 2**heights
    x = np.full(d, 1.0 / d)
    leaf = np.arange(d)
    for h, coef in enumerate(coefficients, start=1):
        node = leaf >> h
        sign = np.where((leaf >> (h - 1)) & 1, -1.0, 1.0)  # left child of its height-h ancestor: +
        x += sign * coef[node] / 2**h
    return x


def haar_signs(leaf: np.ndarray, height: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(node index at ``height``, ±1): +1 if the leaf lies in that node's left subtree."""
    return leaf >> height, np.where((leaf >> (height - 1)) & 1, -1, 1)
