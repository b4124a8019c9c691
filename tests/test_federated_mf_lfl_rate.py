"""LFL's server step γ from a public rule (issue 30): the plan's γ against the formula written out
here, its independence of the private ratings, a user-given ``lr`` winning, and what the run
reports and steps with."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import rayfed
from rayfed.config import DataConfig
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.lfl import driver
from rayfed.protocols.federated_mf.lfl import plan as lfl_plan

SMALL = dict(users=300, items=40, iterations=3, backend="local", out_dir=None, secagg_mode="dealer")


def expected_gamma(z: float, n: int, omega: float, bound: float, rank: int, iterations: int):
    """γ = min(γ_max, κ_L·t·√(R/p)/(σ_S·√T)), σ_S = z·2R^(3/2)·√F: t = ⌈(1−ω)n⌉ users each add
    ζ1σ² and replace it by ζ2σ², the server weighs N2 by β (corrected mode, c = ⌈0.05n⌉
    colluding users), so F = t(1−β)²ζ1 + tβ²ζ2."""
    t = math.ceil(round((1 - omega) * n, 9))
    c = math.ceil(round(0.05 * n, 9))
    zeta1, zeta2 = 2 / ((1 - omega) * n - c), 2 / (t - c)
    beta = zeta1 / (zeta1 + zeta2)
    f = t * (1 - beta) ** 2 * zeta1 + t * beta**2 * zeta2
    sigma = z * 2 * bound**1.5 * math.sqrt(f)
    kappa, cap = lfl_plan.SERVER_LR_KAPPA, lfl_plan.SERVER_LR_MAX
    return min(cap, kappa * t * math.sqrt(bound / rank) / (sigma * math.sqrt(iterations)))


def _ratings_file(path, users: int, items: int, values: np.ndarray):
    user = np.repeat(np.arange(users), items)
    item = np.tile(np.arange(items), users)
    pacsv.write_csv(pa.table({"user_id": user, "item_id": item, "rating": values}), path)
    return str(path)


def test_the_rule_is_the_formula_and_reads_no_private_rating(tmp_path):
    """Two files with the same users, items and number of ratings but other rating values give
    the same γ, the formula's; a file with more users another one (the rule reads n)."""
    gen = np.random.default_rng(0)
    n, m = 300, 8
    a = _ratings_file(tmp_path / "a.csv", n, m, gen.uniform(1, 5, n * m).round(1))
    b = _ratings_file(tmp_path / "b.csv", n, m, gen.uniform(1, 5, n * m).round(1))
    c = _ratings_file(tmp_path / "c.csv", 2 * n, m, gen.uniform(1, 5, 2 * n * m).round(1))

    def params(path, **kw):
        cfg = FederatedMFConfig(data=DataConfig(path=path), iterations=4, delta=1e-5, **kw)
        return lfl_plan.plan(cfg, seed=0).params

    pa_, pb, pc = params(a), params(b), params(c)
    assert pa_.z == pb.z
    assert pa_.server_lr == pb.server_lr
    want = expected_gamma(pa_.z, n, 0.3, 5.0, 10, 4)
    assert want < lfl_plan.SERVER_LR_MAX  # the formula, not the cap
    assert pa_.server_lr == pytest.approx(want, rel=1e-12)
    assert pc.server_lr == pytest.approx(expected_gamma(pc.z, 2 * n, 0.3, 5.0, 10, 4), rel=1e-12)
    assert pc.server_lr != pytest.approx(pa_.server_lr, rel=1e-3)
    # ε large enough that the rule exceeds the cap: γ_max, the noise-free best
    assert params(a, epsilon=1e4).server_lr == lfl_plan.SERVER_LR_MAX
    # a user-given γ wins; GD-DR keeps its constant; the references take no server step
    assert params(a, lr=0.3).server_lr == 0.3
    assert params(a, method="gd-dr", omega=0.0).server_lr == lfl_plan.GDDR_LR
    assert params(a, method="central").server_lr is None


def test_the_run_steps_with_the_resolved_gamma_and_reports_it(monkeypatch):
    seen = []
    real = driver.update_v_step

    def record(*args, lr, **kwargs):
        seen.append(lr)
        return real(*args, lr=lr, **kwargs)

    monkeypatch.setattr(driver, "update_v_step", record)
    ruled = rayfed.run("federated-mf", **SMALL)
    z = ruled.metrics["noise_multiplier"]
    want = expected_gamma(z, 300, 0.3, 5.0, 10, 3)
    assert seen == [pytest.approx(want, rel=1e-12)] * 3
    assert ruled.metrics["server_lr"] == pytest.approx(want, rel=1e-12)
    assert f"server step γ = {want:.4g}, public rule" in ruled.details[-1]
    seen.clear()
    given = rayfed.run("federated-mf", lr=0.7, **SMALL)
    assert seen == [0.7] * 3 and given.metrics["server_lr"] == 0.7
    assert "server step γ = 0.7, lr, given" in given.details[-1]


def test_a_step_out_of_range_is_refused_naming_lr():
    with pytest.raises(rayfed.ConfigError) as err:
        rayfed.run("federated-mf", lr=0.0, **SMALL)
    assert err.value.field == "lr"


def test_the_main_job_learns_at_its_defaults():
    """The main job's population (LFL: 2,500 users, density 0.1; VFL/HFL keep 1,500 and 0.05) at
    the rule's γ: its test MSE falls at every iteration (seed 0 here; seeds 0-4 in
    benchmarks/README.md), ends below Stage 1 alone, and stays above the central optimum.
    dealer mode: the same sums and noise as the main job's simulation mode."""
    assert (FederatedMFConfig().resolved_users(), FederatedMFConfig().resolved_density()) == (
        2500,
        0.1,
    )
    vfl = FederatedMFConfig(setting="vfl")
    assert (vfl.resolved_users(), vfl.resolved_density()) == (1500, 0.05)
    m = rayfed.run("federated-mf", backend="local", out_dir=None, secagg_mode="dealer").metrics
    curve = m["learning_curve"]
    assert m["users"] == 2500 and len(curve) == 5
    assert all(b <= a for a, b in zip(curve, curve[1:], strict=False)), curve
    assert m["central_test_mse"] < curve[-1] < m["stage1_test_mse"] - 0.1


def test_the_rule_for_the_ldp_baseline_counts_every_users_full_noise():
    """method=ldp: each of the t users adds the full σ² = (zΔ)² and nothing is replaced, so
    σ_S = zΔ·√t (F = t), not LFL's shares' F."""
    p = lfl_plan.plan(FederatedMFConfig(method="ldp", users=300, items=40, iterations=3), 0)
    params = p.params
    n, bound, rank = params.n, 5.0, 10
    t = math.ceil(round(0.7 * n, 9))
    sigma = params.z * 2 * bound**1.5 * math.sqrt(t)
    want = lfl_plan.SERVER_LR_KAPPA * t * math.sqrt(bound / rank) / (sigma * math.sqrt(3))
    assert want < lfl_plan.SERVER_LR_MAX  # the formula, not the cap
    assert params.server_lr == pytest.approx(want, rel=1e-12)


def test_the_rule_for_skellam_shares_reads_the_runs_share_variance():
    """dp_mechanism=skellam: t Skellam shares of the run's share variance each, in integer units
    scaled by the pipeline's γ, so σ_S = √(t·share_variance)/γ_pipeline."""
    cfg = FederatedMFConfig(dp_mechanism="skellam", users=300, items=40, iterations=3)
    params = lfl_plan.plan(cfg, 0).params
    n, bound, rank = params.n, 5.0, 10
    t = math.ceil(round(0.7 * n, 9))
    share_variance = params.releases.round1.mechanism.variance
    sigma = math.sqrt(t * share_variance) / params.ddp.gamma
    want = lfl_plan.SERVER_LR_KAPPA * t * math.sqrt(bound / rank) / (sigma * math.sqrt(3))
    assert want < lfl_plan.SERVER_LR_MAX
    assert params.server_lr == pytest.approx(want, rel=1e-12)
