"""The maths of Private-GD-DR, the LDP baseline of LFL (Shin, Kim, Shin and Xiao, TKDE 2018; spec
federated-mf.md §2.10), vectorised over users and ratings.

User i's private input is the gradient of the loss on its own ratings with respect to V, averaged
over its L_i rated items (row j = -2 (r_ij - ⟨u_i, v_j⟩) u_i / L_i for each rated j, 0 elsewhere: which
items it rated is private too). A public random projection Φ (k x m, entries ±1/√k) reduces it to
G_i = Φ ∇_i (k x p), of which the user reports one sampled entry through the one-bit mechanism
(:func:`rayfed.privacy.sampled_one_bit`). With embeddings in 𝒰/𝒱 (non-negative, ‖·‖² <= R) and
ratings in [0, R], |r_ij - ⟨u_i, v_j⟩| <= R and |u_ib| <= √R, so every entry of G_i lies in
[-c, c] with c = 2R^{3/2}/√k (:func:`entry_bound`): no clipping is needed at that c.
"""

from __future__ import annotations

import math

import numpy as np

from rayfed import rng
from rayfed.mf import row_gradient_radius


def projection(seed: int, k: int, m: int) -> np.ndarray:
    """Φ (k x m), entries ±1/√k from the run seed: public, the same for every user and the server
    (E[ΦᵀΦ] = I)."""
    signs = rng.stream(seed, "init", 0, "gddr-projection").integers(0, 2, size=(k, m))
    return (2.0 * signs - 1.0) / math.sqrt(k)


def entry_bound(bound: float, k: int) -> float:
    """c = 2R^{3/2}/√k: the largest |G_i[a, b]| any user's averaged, projected gradient can have
    (its row's radius, :func:`~rayfed.mf.row_gradient_radius`, through Φ's ±1/√k entries)."""
    return row_gradient_radius(bound) / math.sqrt(k)


def projected_entries(
    u: np.ndarray,
    v: np.ndarray,
    phi: np.ndarray,
    rows: np.ndarray,
    items: np.ndarray,
    ratings: np.ndarray,
    index: np.ndarray,
    users: np.ndarray,
) -> np.ndarray:
    """G_i[a_i, b_i] for the users at ``users`` (rows of ``u``), flat index a·p + b: only those
    entries, Σ_j Φ[a_i, j] ∇_i[j, b_i] = -2 u_i[b_i]/L_i · Σ_j Φ[a_i, j](r_ij - ⟨u_i, v_j⟩), summed
    per user by scatter-add. ``rows`` is each rating's row of ``u``."""
    p = v.shape[1]
    a, b = np.divmod(index, p)
    # each rating's sampled projection row: that of its user, if the user reports
    slot = np.full(len(u), -1, dtype=np.int64)
    slot[users] = np.arange(len(users))
    mine = slot[rows] >= 0
    r_rows, r_items, r_slot = rows[mine], items[mine], slot[rows[mine]]
    resid = ratings[mine] - np.einsum("ij,ij->i", u[r_rows], v[r_items])
    total = np.bincount(r_slot, weights=phi[a[r_slot], r_items] * resid, minlength=len(users))
    count = np.bincount(r_slot, minlength=len(users))
    return -2.0 * u[users, b] * total / np.maximum(count, 1)


def estimated_gradient(
    phi: np.ndarray, p: int, index: np.ndarray, reports: np.ndarray, scale: float
) -> np.ndarray:
    """Φᵀ Ĝ (m x p), Ĝ the mean of the reports (y = ±B at its index, 0 elsewhere): an unbiased
    estimate of Φᵀ(mean of G_i). The signs are counted as integers, so the estimate does not
    depend on the order the reports arrive in."""
    k = phi.shape[0]
    signs = np.sign(reports)
    g_hat = np.bincount(index, weights=signs, minlength=k * p) * (scale / max(len(index), 1))
    return phi.T @ g_hat.reshape(k, p)
