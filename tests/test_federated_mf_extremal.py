"""federated-mf's sensitivities against the query's worst case (spec federated-mf §2.4): the
empirical sensitivity check (tests/conformance/test_sensitivity.py) runs the examples' data, which
never pushes the embeddings to their bounds (its moves reach at most half of Δ), so it cannot tell
a right Δ from a halved one. This test evaluates the released query itself — the protocol's own
gradient sums (:func:`rayfed.mf.gradient_sums`, DP-SGLD's clipped ones) — at the point where a
protected unit moves it farthest, and compares that move with the Δ the plan's measurement
declares or derives.

The worst case: u_i = √R·e₀ and every v_j = √R·e₁ (both rows on the boundary of 𝒰/𝒱, orthogonal,
so ⟨u_i, v_j⟩ = 0) and every rating X_ij = R: the residual is R, as large as [0, R] allows, and
each rating's gradient row (−2R·√R·e₁ for u_i, −2R·√R·e₀ for v_j) has the largest norm the ball
allows; the user's θ kept ratings are on θ distinct items (a user rates an item once: a file with a
pair twice is refused) and their u_i parts all point the same way. Removing the unit (the user, or
the rating) leaves the other units' rows as they are, so the move is the unit's own contribution:
2R^{3/2} (one v_j row), 2√2R^{3/2} (a rating's joint (u_i, v_j) row), √θ·2R^{3/2} (θ v_j rows),
√(θ² + θ)·2R^{3/2} (θ v_j rows and their sum on u_i) — the supremum of each bound, reached."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rayfed
from rayfed import mf
from rayfed.errors import ConfigError
from rayfed.mf.baselines import clipped_gradient_sums
from rayfed.protocols import get_protocol
from rayfed.protocols.federated_mf.config import FederatedMFConfig

PLAN = get_protocol("federated-mf").plan
#: small synthetic data; RDP keeps the plans' calibration quick (Δ does not depend on it)
SMALL = dict(users=150, items=30, iterations=2, accountant="rdp")


def extremal_move(theta: int, joint: bool, bound: float, rank: int, sums=mf.gradient_sums) -> float:
    """The ℓ2 move of the released gradient sums (of (U, V) jointly, or of V) when a user with
    ``theta`` ratings at the worst case above is removed (``theta = 1``: one rating removed)."""
    n, m = 3, theta + 2  # other users and items stay untouched: their rows are zero either way
    u, v = np.zeros((n, rank)), np.zeros((m, rank))
    u[0, 0] = math.sqrt(bound)
    v[:theta, 1] = math.sqrt(bound)
    users, items = np.zeros(theta, dtype=np.int64), np.arange(theta, dtype=np.int64)
    batch = mf.Ratings(users, items, np.full(theta, bound), n, m, 0.0, bound)
    g_u, g_v = sums(u, v, batch)
    with_unit = np.concatenate([g_u.ravel(), g_v.ravel()]) if joint else g_v.ravel()
    empty = mf.Ratings(users[:0], items[:0], np.zeros(0), n, m, 0.0, bound)
    g_u, g_v = sums(u, v, empty)
    without = np.concatenate([g_u.ravel(), g_v.ravel()]) if joint else g_v.ravel()
    return float(np.linalg.norm(with_unit - without))


def _sgld_sums(bound):
    return lambda u, v, batch: clipped_gradient_sums(u, v, batch, bound)


#: (id, options, the plan's release, joint (U, V) or V only, per user)
RELEASES = [
    ("vfl-rating-joint", dict(setting="vfl"), "local", True, False),
    ("vfl-rating-finetune", dict(setting="vfl"), "finetune", False, False),
    ("vfl-user-joint", dict(setting="vfl", privacy_unit="user"), "local", True, True),
    ("vfl-user-finetune", dict(setting="vfl", privacy_unit="user"), "finetune", False, True),
    (
        "vfl-local-user",
        dict(setting="vfl", method="local", privacy_unit="user"),
        "local",
        True,
        True,
    ),
    ("hfl-rating", dict(setting="hfl", privacy_unit="rating"), "local", False, False),
    ("hfl-user", dict(setting="hfl"), "local", False, True),
    ("lfl-round1", dict(setting="lfl"), "round1", False, False),
    ("sgld-rating", dict(setting="vfl", method="dp-sgld", parties=1), "local", True, False),
    (
        "sgld-user",
        dict(setting="vfl", method="dp-sgld", parties=1, privacy_unit="user"),
        "local",
        True,
        True,
    ),
]


def _case(options: dict, release: str, joint: bool):
    """(the release's Δ, the worst-case move of its query) under the plan's own θ, R and p."""
    cfg = FederatedMFConfig(**SMALL, **options)
    plan = PLAN(cfg, 0)
    measurement = getattr(plan.params.releases, release)
    theta = getattr(plan.params, "trim", None) or 1
    sums = _sgld_sums(cfg.bound) if options.get("method") == "dp-sgld" else mf.gradient_sums
    return measurement.sensitivity, extremal_move(theta, joint, cfg.bound, cfg.rank, sums), theta


@pytest.mark.parametrize(
    "options,release,joint,per_user", [r[1:] for r in RELEASES], ids=[r[0] for r in RELEASES]
)
def test_every_release_covers_its_querys_worst_case_move(options, release, joint, per_user):
    """Δ >= the supremum of the move (a halved Δ, or a per-user Δ divided by θ, fails here), and
    Δ is that supremum: no more noise than the query needs (per user, a user's θ ratings are on
    distinct items: √θ·2R^{3/2} V-only, √(θ²+θ)·2R^{3/2} jointly, not θ times one rating's)."""
    sens, moved, theta = _case(options, release, joint)
    assert (theta > 1) == per_user
    assert moved <= sens * (1 + 1e-12), (moved, sens)
    assert sens == pytest.approx(moved, rel=1e-12)


@pytest.mark.parametrize(
    "options,release,joint",
    [r[1:4] for r in RELEASES if r[4]],
    ids=[r[0] for r in RELEASES if r[4]],
)
def test_the_theses_per_user_bound_is_theta_times_one_ratings_and_covers_the_move(
    options, release, joint
):
    """``user_sensitivity=thesis``: θ times one rating's Δ (the thesis's triangle inequality),
    above the supremum by √(2θ/(θ+1)) jointly and √θ for V alone."""
    sens, moved, theta = _case({**options, "user_sensitivity": "thesis"}, release, joint)
    one = 2 * math.sqrt(2) * 5.0**1.5 if joint else 2 * 5.0**1.5
    assert sens == pytest.approx(theta * one, rel=1e-12)
    ratio = math.sqrt(2 * theta / (theta + 1)) if joint else math.sqrt(theta)
    assert sens == pytest.approx(ratio * moved, rel=1e-12)


@pytest.mark.parametrize(
    "options",
    [
        dict(setting="lfl"),
        dict(setting="vfl"),
        dict(setting="hfl", privacy_unit="rating"),
        dict(setting="vfl", method="objpert", parties=1, privacy_unit="user"),
    ],
    ids=["lfl", "vfl-rating", "hfl-rating", "objpert"],
)
def test_the_per_user_bound_option_is_refused_where_no_user_is_trimmed_for_dp_sgd(options):
    with pytest.raises(ConfigError, match="user_sensitivity"):
        rayfed.run(
            "federated-mf", backend="local", out_dir=None, user_sensitivity="thesis", **options
        )
