"""The central DP baselines of the thesis's Fig. 4.4 (spec federated-mf §2.10), at s = 1: DP-SGLD
(Liu, Wang & Smola, RecSys'15) and ObjPertb (Hua, Xia & Zhong, IJCAI'15). The papers were not
available here: both are implemented from the spec's summary and the constructions they build on
(SGLD as a sampled Gaussian mechanism; Chaudhuri, Monteleoni & Sarwate's objective perturbation),
so the papers' exact constants are not reproduced. Every guarantee below is proved in the
docstrings. Plain numpy, vectorised over ratings and rows.

Notation: R bounds the ratings (in [0, R]) and the squared row norms; p the rank; q the Poisson
sampling rate (of users, or of ratings: :func:`~rayfed.mf.training.poisson_batch`); θ the ratings
kept per user (``trim_mask``).
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event

from rayfed.errors import ConfigError
from rayfed.mf import Ratings, predict, project, row_sums
from rayfed.mf.training import poisson_batch, releases_event
from rayfed.privacy import Measurement, NoiseSource

#: DP-SGLD's Gaussian prior N(0, I/λ) on every entry of U and V: λ = 1, a weak prior next to the
#: clipping (‖row‖² <= R) that bounds the posterior anyway
SGLD_PRIOR = 1.0
#: ObjPertb's ridge on each u_i: U is never the DP release, so its weight is free (spec §2.10)
OBJPERT_USER_REG = 1.0
#: the least default ridge of the V-solve: at a huge ε the privacy choice tends to 0 and the
#: batched solves would lose their conditioning (a larger λ only leaves more of ε_k to the noise)
OBJPERT_MIN_DEFAULT_REG = 1.0


# --- DP-SGLD ---------------------------------------------------------------------------------------
def sgld_sensitivity(bound: float) -> float:
    """L, the L2 norm bound of one rating's gradient of (U, V) jointly under the clipped-prediction
    likelihood ℓ = (r − clip(⟨u_i, v_j⟩, 0, R))².

    Derivation: ∇_{u_i} ℓ = −2 e v_j and ∇_{v_j} ℓ = −2 e u_i with e = r − clip(⟨u_i, v_j⟩, 0, R)
    where the prediction lies in [0, R] (zero outside, where the clip is flat); every other row's
    gradient is 0. With r ∈ [0, R] and the clipped prediction in [0, R], |e| <= R, and with the
    rows in 𝒰/𝒱 (‖·‖² <= R), ‖(∇_u, ∇_v)‖² <= 4R²(R + R): L = 2√2·R^{3/2}, VFL's Δ_joint (spec
    §2.4). The clip is what makes the bound hold for any (U, V), not only projected ones: it is the
    papers' "bounding |prediction − rating|". A user with θ ratings (on θ distinct items):
    √(θ² + θ)·2R^{3/2}, or the thesis's θL (``user_sensitivity``; the federated-mf plan's
    ``gradient_bounds``)."""
    return 2 * math.sqrt(2) * bound**1.5


def sgld_temperature(z: float, step: float, rate: float, sensitivity: float) -> float:
    """τ = 2q/(z√η·L): the temperature at which one SGLD step of size η is the sampled Gaussian
    mechanism with noise multiplier z on the gradient sum (see :func:`sgld`)."""
    return 2 * rate / (z * math.sqrt(step) * sensitivity)


def clipped_gradient_sums(
    u: np.ndarray, v: np.ndarray, batch: Ratings, bound: float
) -> tuple[np.ndarray, np.ndarray]:
    """Σ over the batch of ∇ℓ for ℓ = (r − clip(⟨u_i, v_j⟩, 0, R))² (:func:`sgld_sensitivity`)."""
    pred = predict(u, v, batch.user, batch.item)
    inside = (pred >= 0) & (pred <= bound)
    coef = np.where(inside, -2.0 * (batch.rating - pred), 0.0)[:, None]
    g_u = row_sums(batch.user, coef * v[batch.item], u.shape[0])
    g_v = row_sums(batch.item, coef * u[batch.user], v.shape[0])
    return g_u, g_v


def sgld(
    noise: NoiseSource,
    u: np.ndarray,
    v: np.ndarray,
    train: tuple[np.ndarray, np.ndarray, np.ndarray],
    n: int,
    *,
    steps: int,
    round: int,
    step: float,
    rate: float,
    release: Measurement,
    bound: float,
    sampled: str,
) -> tuple[np.ndarray, np.ndarray, dp_event.DpEvent]:
    """``steps`` projected SGLD steps on θ = (U, V), sampling the tempered posterior
    ∝ exp(−λ‖θ‖²/2 − τ Σ_Ω ℓ) (λ = SGLD_PRIOR, ℓ of :func:`clipped_gradient_sums`):

        θ <- Π(θ − (η/2)(λθ + (τ/q) Σ_{i∈S} ∇ℓ_i) + N(0, η I)),  S a Poisson sample at rate q.

    Privacy: with τ = 2q/(z√η L) (:func:`sgld_temperature`), (η/2)(τ/q) = √η/(zL), so the step is
    θ <- Π(θ − (η/2)λθ − (√η/(zL)) (Σ_S ∇ℓ + N(0, z²L² I))): the only data-dependent quantity is
    the gradient sum, released through the Gaussian mechanism ``release`` (noise multiplier z at
    L2 sensitivity L, θ·L per user) on a Poisson sample of ``sampled`` units — one sampled
    Gaussian event per step (no amplification for one rating of a sampled user), so the noise on
    θ is exactly N(0, η I). The prior and Π are post-processing. Returns (U, V, the event of the
    ``steps`` releases)."""
    users, items, ratings = train
    shrink = 1.0 - step / 2 * SGLD_PRIOR
    scale = math.sqrt(step) / (release.mechanism.noise_multiplier * release.sensitivity)
    for _ in range(steps):
        rows = poisson_batch(noise, users, n, round=round, rate=rate, sampled=sampled)
        batch = Ratings(users[rows], items[rows], ratings[rows], n, v.shape[0], 0, bound)
        g_u, g_v = clipped_gradient_sums(u, v, batch, bound)
        noisy, _ = release(noise, np.concatenate([g_u.ravel(), g_v.ravel()]), round=round)
        u = project(shrink * u - scale * noisy[: u.size].reshape(u.shape), bound)
        v = project(shrink * v - scale * noisy[u.size :].reshape(v.shape), bound)
    return u, v, releases_event(release, steps)


# --- ObjPertb --------------------------------------------------------------------------------------
def objpert_gradient_bound(bound: float) -> float:
    """L, the bound on one rating's ‖∇_v ℓ‖ = 2|r − ⟨u, v⟩|·‖u‖ over the V-solve's domain: v in
    the ball ‖v‖² <= R (the solve's constraint), u in 𝒰 (‖u‖² <= R), r in [0, R]. Then
    ⟨u, v⟩ ∈ [−R, R] (v may be negative), |r − ⟨u, v⟩| <= 2R and L = 4R^{3/2}."""
    return 4 * bound**1.5


def objpert_blocks(unit: str, trim: int) -> tuple[int, float]:
    """(item blocks a neighbour touches, the sum over them of the gradient shifts in units of L)
    in one V-solve (after the first U-solve, U carries the neighbour's data; the first V-solve,
    from a data-independent U, touches fewer blocks per rating, but the bound is used for all):

    * per user (add/remove a user with its <= θ kept ratings): the user's θ items each lose one
      term: θ blocks, shift θ·L;
    * per rating (add/remove rating (i, j)): u_i is re-solved from user i's kept ratings, so it
      moves, and it enters each of user i's items: the kept set may also swap one rating for the
      new one (trimming keeps θ), so up to θ − 1 blocks see u_i replaced (2L each: one term out,
      one in) and two blocks lose or gain a term (L each): θ + 1 blocks, shift 2θ·L.

    So per rating costs more than per user here: removing a user removes its terms, changing one
    rating moves every term of the user ("ObjPertb's per-rating guarantee is no better than its
    per-user one: u_i carries the rating into every item of user i")."""
    if unit == "user":
        return trim, float(trim)
    return trim + 1, 2.0 * trim


def objpert_min_reg(epsilon_k: float, *, unit: str, trim: int, bound: float) -> float:
    """The smallest ridge λ with ε' > 0 (:func:`objpert_scale`): λ > R/(e^{ε_k/blocks} − 1)."""
    blocks, _ = objpert_blocks(unit, trim)
    return bound / math.expm1(epsilon_k / blocks)


def objpert_default_reg(epsilon_k: float, *, unit: str, trim: int, bound: float) -> float:
    """Chaudhuri et al.'s choice (Alg. 2) when λ is not given: the λ that leaves ε' = ε_k/2 for the
    noise (the Jacobian term takes the other half): λ = R/(e^{ε_k/(2·blocks)} − 1), at least
    OBJPERT_MIN_DEFAULT_REG."""
    blocks, _ = objpert_blocks(unit, trim)
    return max(bound / math.expm1(epsilon_k / (2 * blocks)), OBJPERT_MIN_DEFAULT_REG)


def objpert_scale(
    epsilon_k: float, *, unit: str, trim: int, bound: float, reg: float
) -> tuple[float, float]:
    """(the norm scale of b_j, ε') for one ε_k-DP V-solve (objective perturbation, Chaudhuri,
    Monteleoni & Sarwate 2011, Thm 9 / Alg. 2, here for a ball constraint and per item block).

    The V-solve, U fixed: for every item j, v_j = argmin_{‖v‖² <= R} J_j(v),
    J_j(v) = Σ_{i rated j} (r_ij − ⟨u_i, v⟩)² + λ‖v‖² + ⟨b_j, v⟩, b_j ∝ exp(−‖b‖/s) (s = scale).

    Proof. J_j is 2λ-strongly convex, so each b_j gives one minimiser; by KKT, v = v_j(b) iff
    b = −∇F(v) − t·v/√R with F the data and ridge terms, t >= 0, and t = 0 inside the ball. The map
    (v, t) -> b is a bijection from (open ball, t = 0) ∪ (sphere × t >= 0) onto R^p, so the law of
    (v, t) has density ν(b(v, t))·|det ∂b/∂(v, t)| (ν the density of b). Inside,
    |det| = det(2A), A = Σ u_i u_iᵀ + λI; on the sphere (orthonormal tangent frame T, normal n),
    |det| = det(Tᵀ(2A + (t/√R) I)T): the normal column is n itself. A neighbour that adds or removes
    one term 2u uᵀ (‖u‖² <= R) multiplies either determinant by a factor in [1, 1 + R/λ] (rank one:
    1 + 2uᵀM⁻¹u with M ≽ 2λI), and replacing one term by another by a factor in
    [1/(1 + R/λ), 1 + R/λ]; it shifts b(v, t) by the change of Σ∇ℓ at v, of norm <= L
    (:func:`objpert_gradient_bound`) per term added or removed, 2L per term replaced, hence ν by at
    most e^{shift/s}. The blocks' b_j are independent and the output is all blocks, so the ratios
    multiply over the blocks the neighbour touches (:func:`objpert_blocks`):
    ln(ratio) <= shift·L/s + blocks·ln(1 + R/λ) at every (v, t); v is a function of (v, t). So
    with ε' = ε_k − blocks·ln(1 + R/λ) > 0 and s = shift·L/ε', the V-solve is ε_k-DP. Per rating
    the first V-solve (U not yet fitted) touches one block only, per user θ as later; every
    V-solve is charged alike.

    Raises ConfigError naming ``objpert_reg`` when ε' <= 0."""
    blocks, shift = objpert_blocks(unit, trim)
    eps_prime = epsilon_k - blocks * math.log1p(bound / reg)
    if eps_prime <= 0:
        low = objpert_min_reg(epsilon_k, unit=unit, trim=trim, bound=bound)
        raise ConfigError(
            "objpert_reg",
            f"λ = {reg:g} leaves no budget for the noise: ε' = ε/K − {blocks}·ln(1 + R/λ) = "
            f"{eps_prime:.3g} <= 0",
            f"objpert_reg > {low:.4g}, or leave it unset (the largest share of ε/K it allows)",
        )
    return shift * objpert_gradient_bound(bound) / eps_prime, eps_prime


def ridge_rows(
    other: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    ratings: np.ndarray,
    n_rows: int,
    *,
    reg: float,
    shift: np.ndarray | None = None,
    radius: float | None = None,
) -> np.ndarray:
    """For every row k of an (n_rows x p) factor, the exact minimiser over ‖x‖ <= ``radius`` (R^p if
    None) of Σ_{ratings of row k} (r − ⟨other[col], x⟩)² + reg‖x‖² + ⟨shift_k, x⟩.

    Closed form x = (A_k + μI)⁻¹(s_k − shift_k/2), A_k = Σ other[col] other[col]ᵀ + reg·I,
    s_k = Σ r·other[col], μ = 0 if that lies in the ball, else the μ > 0 putting it on the sphere
    (the trust-region KKT condition; ‖x(μ)‖ decreases in μ, found by bisection in every row's
    eigenbasis at once: batched ``eigh``)."""
    p = other.shape[1]
    x = other[cols]
    gram = np.empty((n_rows, p, p))
    for a in range(p):  # column by column: an (n_ratings x p x p) array would not fit at scale
        gram[:, a, :] = row_sums(rows, x * x[:, a : a + 1], n_rows)
    gram += reg * np.eye(p)
    target = row_sums(rows, ratings[:, None] * x, n_rows)
    if shift is not None:
        target = target - shift / 2
    w, q = np.linalg.eigh(gram)
    w = np.maximum(w, reg)  # exact arithmetic gives w >= reg; round-off must not make it smaller
    c = np.einsum("kab,ka->kb", q, target)  # the target in each row's eigenbasis
    mu = np.zeros(n_rows)
    if radius is not None:
        outside = np.sum((c / w) ** 2, axis=1) > radius**2
        low = np.zeros(int(outside.sum()))
        high = np.linalg.norm(c[outside], axis=1) / radius  # ‖x(high)‖ <= ‖c‖/high = radius
        co, wo = c[outside], w[outside]
        for _ in range(200):  # halves the bracket each time: far below float precision
            mid = (low + high) / 2
            big = np.sum((co / (wo + mid[:, None])) ** 2, axis=1) > radius**2
            low, high = np.where(big, mid, low), np.where(big, high, mid)
        mu[outside] = high  # the side whose x lies in the ball
    return np.einsum("kab,kb->ka", q, c / (w + mu[:, None]))


def objpert_item_terms(
    u: np.ndarray, users: np.ndarray, items: np.ndarray, ratings: np.ndarray, m: int
) -> np.ndarray:
    """Each item's data terms of its V-solve, (Σ u_i u_iᵀ flattened, Σ r_ij u_i) over its
    ratings (m x (p² + p)): all the V-solve reads of the data, so a neighbour changes the rows
    of the items whose terms it changes (:func:`objpert_blocks`)."""
    x = u[users]
    p = u.shape[1]
    outer = (x[:, :, None] * x[:, None, :]).reshape(len(x), p * p)
    return np.concatenate(
        [row_sums(items, outer, m), row_sums(items, ratings[:, None] * x, m)], axis=1
    )


def objpert_alternation(
    noise: NoiseSource,
    u: np.ndarray,
    train: tuple[np.ndarray, np.ndarray, np.ndarray],
    m: int,
    *,
    round: int,
    reg: float,
    release: Measurement,
    bound: float,
) -> tuple[np.ndarray, np.ndarray, dp_event.DpEvent]:
    """One alternation of ObjPertb: the V-solve with U fixed, every item's objective perturbed by
    ⟨b_j, v_j⟩ (``release``: objective perturbation, ε_k-DP by :func:`objpert_scale` for the item
    blocks a neighbour touches), exact over the ball ‖v‖² <= R; then the U-solve with V fixed, no
    noise: each u_i is a function of V and user i's own ratings only (ridge OBJPERT_USER_REG,
    then Π_𝒰, which the bound L needs), released to user i alone (joint DP, the billboard
    model). Returns (U, V, event)."""
    users, items, ratings = train
    p = u.shape[1]
    v, event = release(
        noise,
        objpert_item_terms(u, users, items, ratings, m),
        round=round,
        solve=lambda b: ridge_rows(
            u, items, users, ratings, m, reg=reg, shift=b, radius=math.sqrt(bound)
        ),
        width=p,
    )
    u = ridge_rows(v, users, items, ratings, u.shape[0], reg=OBJPERT_USER_REG)
    return project(u, bound), v, event
