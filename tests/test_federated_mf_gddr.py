"""Private-GD-DR, the LDP baseline of LFL (spec federated-mf.md §2.10, note 24): the one-bit
mechanism, amplification by shuffling and its inversion, the server's estimator, and runs.

References are computed here: Theorem 3.1 of Feldman, McMillan and Talwar (2021) written out
again, the projected gradients built densely, the mechanism's probabilities from its definition."""

import math

import numpy as np
import pytest

import rayfed
from rayfed.errors import ConfigError, RayfedError, UnaccountedNoise
from rayfed.mf import gddr
from rayfed.privacy import (
    Budget,
    EpsilonDeltaDpEvent,
    NoiseSource,
    PrivacyLedger,
    ShuffledDpEvent,
    event_from_dict,
    one_bit_scale,
    sampled_one_bit,
    shuffled_ldp_epsilon,
)

SMALL = dict(
    method="gd-dr", users=400, items=30, iterations=3, pretrain_steps=5, finetune_steps=2,
    backend="local", out_dir=None,
)  # fmt: skip


def fmt_epsilon(eps0: float, n: int, delta: float) -> float:
    """Theorem 3.1 in the authors' code's form (apple/ml-shuffling-amplification), written
    independently of rayfed.privacy.shuffling, and never above ε0."""
    a = 8 * (math.exp(eps0) * math.log(4 / delta)) ** 0.5 / n**0.5
    c = 8 * math.exp(eps0) / n
    b, d = 1 - math.exp(-eps0), 1 + math.exp(-eps0 - math.log(1 + a + c))
    return min(eps0, math.log(1 + b / d * (a + c)))


def paper_epsilon(eps0: float, n: int, delta: float) -> float:
    """Theorem 3.1 as the paper prints it (the spec's form)."""
    a = math.exp(eps0)
    inner = (a - 1) / (a + 1) * (8 * math.sqrt(a * math.log(4 / delta) / n) + 8 * a / n)
    return math.log(1 + inner)


# --- the one-bit mechanism -------------------------------------------------------------------------
def test_one_bit_reports_are_unbiased_for_the_clipped_vector():
    """E[y at a] = size·x: the mean report over N users estimates every entry of the vector;
    tolerance 4.5 sd, Var(y·1{a=e}) = B²/size - x_e² per user. An entry beyond c is estimated
    at ±c (the mechanism clips)."""
    c, eps, users = 2.0, 1.0, 200_000
    x = np.array([1.5, -0.4, 0.0, 2.0, -2.0, 5.0])  # the last one is clipped to c
    noise = NoiseSource.seeded(3, "cohort")
    (index, y), event = sampled_one_bit(
        noise, lambda a: x[a], size=x.size, bound=c, epsilon=eps, ids=np.arange(users)
    )
    assert event == EpsilonDeltaDpEvent(eps, 0.0)
    scale = one_bit_scale(eps, c, x.size)
    assert np.all(np.abs(y) == scale)
    assert scale == pytest.approx(x.size * c * (math.e + 1) / (math.e - 1))
    estimate = np.bincount(index, weights=y, minlength=x.size) / users
    truth = np.clip(x, -c, c)
    sd = np.sqrt((scale**2 / x.size - truth**2) / users)
    assert np.all(np.abs(estimate - truth) < 4.5 * sd), (estimate, truth, sd)
    assert sd.max() < 0.3  # the check can fail: the entries differ by more than this


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0])
def test_one_bit_sign_probabilities_differ_by_e_to_the_epsilon_at_the_extremes(eps):
    """With the sign's uniform on a fine grid, the share of + signs is the probability itself:
    e^ε/(e^ε + 1) at x = c and 1/(e^ε + 1) at x = -c, so both outputs' ratio is e^ε."""
    c, grid = 1.5, 200_000
    noise = NoiseSource.seeded(0, "cohort")
    u = np.column_stack([np.zeros(grid), (np.arange(grid) + 0.5) / grid])
    noise.user_uniform = lambda purpose, round, ids, n, again=False: u  # coins on a grid
    share = {}
    for x in (c, -c):
        (_, y), _ = sampled_one_bit(
            noise, lambda a, x=x: np.full(a.size, x), size=4, bound=c, epsilon=eps, ids=u[:, 0]
        )
        share[x] = np.mean(y > 0)
    e = math.exp(eps)
    assert share[c] == pytest.approx(e / (e + 1), abs=1 / grid)
    assert share[c] / share[-c] == pytest.approx(e, rel=1e-3)
    assert (1 - share[-c]) / (1 - share[c]) == pytest.approx(e, rel=1e-3)


# --- amplification by shuffling -------------------------------------------------------------------
@pytest.mark.parametrize(
    "epsilon,users,steps", [(1.0, 943, 10), (2.0, 943, 10), (4.0, 943, 10), (0.5, 5000, 3)]
)
def test_calibration_round_trip(epsilon, users, steps):
    """T·ε_shuffle(ε0) at δ/T gives back the target ε, inside the theorem's range."""
    delta = 1e-5
    eps0 = shuffled_ldp_epsilon(epsilon, delta, users=users, steps=steps)
    assert 0 < eps0 <= math.log(users / (16 * math.log(4 * steps / delta)))
    total = steps * fmt_epsilon(eps0, users, delta / steps)
    assert total <= epsilon * (1 + 1e-12) and total == pytest.approx(epsilon, rel=1e-9)
    # the charged form is the more conservative of the two statements
    assert steps * paper_epsilon(eps0, users, delta / steps) < total


def test_calibration_refuses_outside_the_theorems_range():
    # 943 users, T = 10, δ = 1e-5: ε0 <= log(943/(16 log 4e6)) = 1.36 certifies at most TOP
    top = 10 * fmt_epsilon(math.log(943 / (16 * math.log(4e6))), 943, 1e-6)
    assert shuffled_ldp_epsilon(top * 0.999, 1e-5, users=943, steps=10) < 1.36
    with pytest.raises(ConfigError, match="beyond what amplification") as err:
        shuffled_ldp_epsilon(top * 1.001, 1e-5, users=943, steps=10)
    assert err.value.field == "epsilon"
    with pytest.raises(ConfigError, match="too few") as err:
        shuffled_ldp_epsilon(1.0, 1e-5, users=240, steps=10)  # 16·log(4e6) = 243 > 240
    assert err.value.field == "users"


def test_the_pure_ledger_charges_the_amplified_epsilon_and_refuses_out_of_range():
    ledger = PrivacyLedger(Budget(10.0, 1e-5), accountant="pure", relation="replace_one")
    event = ShuffledDpEvent(EpsilonDeltaDpEvent(0.7, 0.0), 943, 1e-6)
    for t in range(3):
        ledger.charge(event, label=f"iteration {t}", round=t)
    eps, delta = ledger.spent()
    assert eps == pytest.approx(3 * fmt_epsilon(0.7, 943, 1e-6), rel=1e-12)
    assert delta == pytest.approx(3e-6)
    for bad in (
        ShuffledDpEvent(EpsilonDeltaDpEvent(1.4, 0.0), 943, 1e-6),  # ε0 beyond 1.36
        ShuffledDpEvent(EpsilonDeltaDpEvent(0.5, 1e-9), 943, 1e-6),  # not a pure randomizer
    ):
        with pytest.raises(RayfedError, match="shuffling covers"):
            ledger.charge(bad, label="bad")
    rdp = PrivacyLedger(Budget(10.0, 1e-5), accountant="rdp", relation="replace_one")
    with pytest.raises(RayfedError):
        rdp.charge(event, label="rdp cannot")
    add_remove = PrivacyLedger(Budget(10.0, 1e-5), accountant="pure", relation="add_or_remove_one")
    with pytest.raises(RayfedError, match="replace-one"):  # the theorem replaces one user's data
        add_remove.charge(event, label="add/remove cannot")


# --- the server's estimator -----------------------------------------------------------------------
def test_the_server_step_is_an_unbiased_estimate_of_the_projected_mean_gradient():
    """Φᵀ Ĝ from N users' reports against Φᵀ(mean of G_i), G_i = Φ∇_i built densely here;
    per entry Var <= B²/(k·p·N) (one report, y² = B² on a 1/(k·p) share of the indices)."""
    n, m, p, k, bound, eps = 80_000, 12, 3, 5, 5.0, 4.0
    gen = np.random.default_rng(1)
    per_user = 4
    rows = np.repeat(np.arange(n), per_user)
    items = np.argsort(gen.random((n, m)), axis=1)[:, :per_user].reshape(-1)  # distinct per user
    ratings = gen.uniform(0, bound, rows.size)
    u = gen.uniform(0, 1, (n, p))
    v = gen.uniform(0, 1, (m, p))
    phi = gddr.projection(7, k, m)
    assert set(np.unique(phi * math.sqrt(k))) == {-1.0, 1.0}
    # dense reference: ∇_i (m x p) averaged over the user's ratings, G_i = Φ ∇_i
    grad = np.zeros((n, m, p))
    resid = ratings - np.sum(u[rows] * v[items], axis=1)
    np.add.at(grad, (rows, items), -2.0 * resid[:, None] * u[rows] / per_user)
    g_mean = np.einsum("am,nmp->ap", phi, grad) / n
    entries = np.abs(np.einsum("am,nmp->nap", phi, grad)).max()
    assert entries <= gddr.entry_bound(bound, k)  # the bound holds
    c = entries  # the tightest clip that clips nothing: less noise, still unbiased
    noise = NoiseSource.seeded(11, "cohort")
    users = np.arange(n)
    (index, y), _ = sampled_one_bit(
        noise,
        lambda a: gddr.projected_entries(u, v, phi, rows, items, ratings, a, users),
        size=k * p,
        bound=c,
        epsilon=eps,
        ids=users,
    )
    scale = one_bit_scale(eps, c, k * p)
    estimate = gddr.estimated_gradient(phi, p, index, y, scale)
    reference = phi.T @ g_mean
    sd = scale / math.sqrt(k * p * n)
    assert np.all(np.abs(estimate - reference) < 4.5 * sd)
    assert np.abs(reference).max() > 10 * sd  # a biased estimator (e.g. scale off by k·p) fails
    # reports arriving in another order give the same estimate, bit for bit
    order = gen.permutation(n)
    assert np.array_equal(gddr.estimated_gradient(phi, p, index[order], y[order], scale), estimate)


# --- runs ------------------------------------------------------------------------------------------
def test_a_run_charges_t_shuffled_releases_and_reports_the_target_epsilon():
    result = rayfed.run("federated-mf", epsilon=1.0, cohorts=2, **SMALL)
    report, metrics = result.privacy, result.metrics
    n, t_iter = 400, 3
    quorum = math.ceil(0.7 * n)  # ω = 0.3
    eps0 = metrics["ldp_epsilon_per_iteration"]
    step_delta = report.budget_delta / t_iter
    assert report.accountant == "pure" and report.neighboring_relation == "replace_one"
    assert [e["class_name"] for e in report.entries] == ["ShuffledDpEvent"] * t_iter
    for e in report.entries:
        assert event_from_dict(e["event"]) == EpsilonDeltaDpEvent(eps0, 0.0)
        assert (e["num_users"], e["delta"]) == (quorum, pytest.approx(step_delta))
    assert report.epsilon == pytest.approx(1.0, rel=1e-9)
    assert report.epsilon == pytest.approx(t_iter * fmt_epsilon(eps0, quorum, step_delta))
    assert report.delta == pytest.approx(report.budget_delta)
    assert metrics["ldp_epsilon"] == pytest.approx(t_iter * eps0) and eps0 > 1 / t_iter
    assert "trusted shuffler" in report.statement and "does not build" in " ".join(report.notes)
    assert (
        metrics["skipped_iterations"] == []
        and result.tables["iterations"]["u1"].to_pylist() == [n] * t_iter
    )
    assert math.isfinite(metrics["test_mse"]) and math.isfinite(metrics["train_mse"])
    # cohort-count invariance: the same reports and V (the MSE sums cohorts' errors in another
    # order: equal to the last bits, where a different V would move it by far more)
    one = rayfed.run("federated-mf", epsilon=1.0, cohorts=1, **SMALL)
    assert result.tables["iterations"].equals(one.tables["iterations"])
    assert one.metrics["learning_curve"] == pytest.approx(metrics["learning_curve"], rel=1e-12)
    assert one.metrics["train_mse"] == pytest.approx(metrics["train_mse"], rel=1e-12)


def test_the_noise_size_follows_epsilon():
    """ε = 0.1 vs 1.5, near the most the shuffle bound certifies for 400 users (ω = 0: all must
    report): the one-bit noise scales with (e^ε0 + 1)/(e^ε0 - 1), 30 vs 1.9, and the larger noise
    costs accuracy (c = 0.3, γ = 0.5; seeds 0-2: 1.51/2.08/1.94 vs 1.16/1.25/1.39). A check of the
    noise's size only: it would pass with data-blind reports too (the signal is tested by the
    estimator's unbiasedness test; benchmarks/federated_mf_gddr_null.py is the null control)."""
    options = dict(SMALL, lr=0.5, omega=0.0, gddr_clip=0.3)
    low = rayfed.run("federated-mf", epsilon=0.1, **options)
    high = rayfed.run("federated-mf", epsilon=1.5, **options)
    assert high.metrics["ldp_epsilon_per_iteration"] > 10 * low.metrics["ldp_epsilon_per_iteration"]
    assert high.metrics["entry_clip"] == 0.3
    assert low.metrics["test_mse"] > high.metrics["test_mse"] + 0.1


def test_dropouts_send_no_report_and_too_few_reports_release_nothing():
    some = rayfed.run("federated-mf", epsilon=1.0, dropout=0.1, **SMALL)
    counts = some.tables["iterations"]["u1"].to_pylist()
    assert all(280 <= c < 400 for c in counts) and not some.metrics["skipped_iterations"]
    many = rayfed.run("federated-mf", epsilon=1.0, dropout=0.5, **SMALL)
    assert many.metrics["skipped_iterations"] == [0, 1, 2]
    # nothing released: the server never updates V (the users still step on their own u_i)
    phases = many.metrics["phase_seconds"]
    assert (
        "keep_v" in phases
        and "update_v" not in phases
        and "update_v" in some.metrics["phase_seconds"]
    )
    assert len(many.privacy.entries) == 3  # skipped iterations are charged (conservative)


@pytest.mark.parametrize(
    "options,field",
    [
        ({"setting": "vfl"}, "method"),
        ({"secagg_mode": "secure"}, "secagg_mode"),
        ({"mode": "faithful"}, "mode"),
        ({"epsilon": 50.0}, "epsilon"),
        ({"gddr_dim": 0}, "gddr_dim"),
        ({"gddr_dim": 31}, "gddr_dim"),  # more than the 30 items
        ({"gddr_clip": -1.0}, "gddr_clip"),
        ({"method": "lfl", "gddr_dim": 8}, "gddr_dim"),
    ],
)
def test_bad_gddr_input_names_the_option(options, field):
    with pytest.raises(ConfigError) as err:
        rayfed.run("federated-mf", **{**SMALL, **options})
    assert err.value.field == field


def test_reports_carry_only_events_their_mechanism_drew(monkeypatch):
    """Registration off: the first report is refused (the conformance suite's check, for gd-dr);
    and a secure run draws coins the seed cannot regenerate."""
    seeded = rayfed.run("federated-mf", epsilon=1.0, **SMALL)
    secure = rayfed.run("federated-mf", epsilon=1.0, randomness="secure", **SMALL)
    assert secure.privacy.randomness == "secure"
    assert secure.metrics["learning_curve"] != seeded.metrics["learning_curve"]
    original = NoiseSource.register
    monkeypatch.setattr(
        NoiseSource,
        "register",
        lambda self, event, release=None, **kw: original(self, None, release, **kw),
    )
    with pytest.raises(UnaccountedNoise, match="did not draw"):
        rayfed.run("federated-mf", epsilon=1.0, **SMALL)


@pytest.mark.ray
def test_gddr_on_ray_equals_in_process(ray_cluster):
    options = {**SMALL, "backend": "ray", "cohorts": 2, "epsilon": 1.0}
    on_ray = rayfed.run("federated-mf", **options)
    local = rayfed.run("federated-mf", **{**options, "backend": "local"})
    assert on_ray.metrics["learning_curve"] == local.metrics["learning_curve"]
    assert on_ray.privacy.entries == local.privacy.entries
    assert on_ray.noise_fingerprints == local.noise_fingerprints


def test_a_stress_sweep_of_gd_dr_states_it_has_no_secure_aggregation(tmp_path, capsys):
    """GD-DR runs no secure aggregation: the sweep records no abort bound for it (None, not the
    unused finder's) and its lines say so."""
    import json

    from rayfed.cli import main

    args = ["stress", "federated-mf", "--backend", "local", "--rates", "0,0.1", "--out"]
    options = ["method=gd-dr", "users=400", "items=30", "iterations=2", "omega=0.3"]
    assert main([*args, str(tmp_path), *[a for o in options for a in ("--set", o)]]) == 0
    (path,) = tmp_path.iterdir()
    rows = json.loads((path / "stress.json").read_text())["rows"]
    assert [r["abort_bound_log2"] for r in rows] == [None, None]
    assert [r["abort_bound"] for r in rows] == ["none, no secure aggregation"] * 2
    assert rows[1]["alive_round1"] < rows[0]["alive_round1"] == 400  # dropouts send no report
    assert "no secure aggregation" in capsys.readouterr().out


def test_gddr_users_are_lost_in_its_one_phase_report_and_secagg_phases_are_refused():
    """F4: GD-DR has no secure aggregation; its users send one report, lost in its one phase
    ``report``. population.rates.report loses users (fewer than 400 reports); SecAgg's phases
    (advertise ... unmask), which GD-DR silently ignored (rates at masked_input: 400 reports
    every iteration), are a ConfigError naming population.rates and the phase report."""
    lossy = rayfed.run("federated-mf", epsilon=1.0, population={"rates": {"report": 0.1}}, **SMALL)
    counts = lossy.tables["iterations"]["u1"].to_pylist()
    assert all(280 <= c < 400 for c in counts)
    for phase in ("advertise", "share_keys", "masked_input", "unmask"):
        with pytest.raises(ConfigError) as err:
            rayfed.run("federated-mf", epsilon=1.0, population={"rates": {phase: 0.9}}, **SMALL)
        assert err.value.field == f"population.rates.{phase}"
        assert "report" in str(err.value)
