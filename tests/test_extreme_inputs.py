"""Extreme ε, δ and option values at the edges of their declared ranges (issue 28): each is refused
with a ConfigError naming the option before any actor starts and before any run directory exists,
or it runs; and no evaluation fails after the private release. (The conformance suite runs every
option of every protocol at its edges; these are the cases that used to crash, pinned.)"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import rayfed
from rayfed.errors import ConfigError


def refused(field, out_dir, protocol, **options):
    """The ConfigError of ``protocol`` run with ``options``: it names ``field`` and nothing is
    written (not even a failed run directory)."""
    with pytest.raises(ConfigError) as info:
        rayfed.run(protocol, backend="local", out_dir=str(out_dir), **options)
    assert info.value.field == field, info.value
    assert list(out_dir.iterdir()) == []
    return info.value


def runs(protocol, **options):
    return rayfed.run(protocol, backend="local", out_dir=None, **options)


@pytest.fixture
def out_dir(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    return d


# --- ε and δ beyond what the mechanisms' numerics hold -------------------------------------------
@pytest.mark.parametrize("epsilon", [1e6, 1e9])
def test_ldp_bitvector_huge_epsilon_is_refused_not_an_overflow(out_dir, epsilon):
    err = refused("epsilon", out_dir, "ldp-bitvector", bits=16, records=40, epsilon=epsilon)
    assert "float64" in err.problem and "<= 18" in err.allowed


@pytest.mark.parametrize(
    "protocol,options",
    [
        ("pattern-count", {"users": 300, "calibration": "exact", "sample_rate": 0.5}),
        ("vfl-kmeans", {"users": 300, "method": "ldp-agg-2pest"}),
    ],
)
def test_randomized_response_at_a_tiny_epsilon_runs(protocol, options):
    """ε = 1e-9 used to plan, then fail in the ledger with BudgetExceeded: the event's ε,
    recovered from the keep probability, rounded above the budget (1e-16 in 1e-9); vfl-kmeans'
    simplex projection of the unbiased counts then failed on their non-finite cells."""
    result = runs(protocol, epsilon=1e-9, **options)
    assert 0 < result.privacy.epsilon <= 1e-9 * (1 + 1e-6)


def test_ldp_bitvector_epsilon_is_declared_where_it_runs(out_dir):
    """ε = 1e-9 used to plan, then fail in the ledger (BudgetExceeded) or, past it, in the
    clustering after the release: it is refused by the declared range, whose ends run."""
    err = refused("epsilon", out_dir, "ldp-bitvector", bits=16, records=40, epsilon=1e-9)
    assert ">= 1e-06" in err.allowed and "after the release" in err.problem
    for epsilon in (1e-6, 18.0):
        assert runs("ldp-bitvector", bits=16, records=40, epsilon=epsilon).privacy.epsilon > 0


SGLD = dict(setting="vfl", method="dp-sgld", parties=1, users=40, items=10, delta=1e-5)


@pytest.mark.parametrize(
    "accountant,epsilon,iterations,local_steps",
    [("tightest", 1e-4, 100, 10), ("rdp", 1e-3, 1, 1), ("rdp", 0.5, 1, 1)],
)
def test_dp_sgld_epsilon_its_accountant_cannot_certify_is_refused(
    out_dir, accountant, epsilon, iterations, local_steps
):
    """DP-SGLD's noise is calibrated by the paper's advanced composition, which can promise an ε
    the ledger's accountant does not certify: under tightest that ended in BudgetExceeded at the
    first step; under rdp the run spent the ledger's larger ε (0.0035 for 0.001, 0.523 for 0.5)
    and said the calibration does not deliver ε. It is refused at plan time, naming epsilon, and
    the ε it suggests runs within its budget."""
    steps = dict(iterations=iterations, local_steps=local_steps, accountant=accountant)
    err = refused("epsilon", out_dir, "federated-mf", epsilon=epsilon, **steps, **SGLD)
    match = re.search(rf"certified by the {accountant} accountant only at ε=([0-9.e+-]+)", str(err))
    assert match and float(match.group(1)) > epsilon, err
    suggested = float(re.search(r"raise epsilon \(ε=([0-9.e+-]+) is certified", err.allowed)[1])
    assert suggested > epsilon
    result = runs("federated-mf", epsilon=suggested, **steps, **SGLD)
    assert 0 < result.privacy.epsilon <= suggested and "requested" not in result.headline


def test_dp_sgld_under_rdp_suggests_the_accountant_that_certifies_it(out_dir):
    options = dict(epsilon=0.5, iterations=1, local_steps=1, **SGLD)
    err = refused("epsilon", out_dir, "federated-mf", accountant="rdp", **options)
    assert "choose accountant=tightest" in err.allowed
    result = runs("federated-mf", accountant="tightest", **options)
    assert 0 < result.privacy.epsilon <= 0.5


@pytest.mark.parametrize("accountant", ["tightest", "rdp"])
def test_dp_sgld_at_an_ordinary_epsilon_runs_within_it(accountant):
    options = dict(iterations=5, local_steps=2, accountant=accountant, **SGLD)
    result = runs("federated-mf", epsilon=1.0, **options)
    assert 0 < result.privacy.epsilon <= 1.0 and "requested" not in result.headline


def test_ldp_bitvector_half_width_that_makes_every_code_alike_is_refused(out_dir):
    err = refused("half_width", out_dir, "ldp-bitvector", bits=64, records=40, half_width=1e6)
    assert "carry nothing" in err.problem


@pytest.mark.parametrize(
    "protocol,options",
    [
        ("vfl-primitives", {"users": 300, "task": "l2-moment"}),
        ("vfl-primitives", {"users": 300, "task": "lowrank"}),
        ("secure-sum", {"users": 30, "dim": 2, "dp_mechanism": "skellam", "bits": 16}),
    ],
)
def test_gaussian_budgets_below_the_noise_floor_are_refused(out_dir, protocol, options):
    """ε = 1e9 used to end in dp-accounting's NoBracketIntervalFoundError."""
    err = refused("epsilon", out_dir, protocol, epsilon=1e9, **options)
    assert "0.001·Δ" in err.problem and "epsilon below" in err.allowed


@pytest.mark.parametrize(
    "protocol,options",
    [
        ("federated-mf", {"users": 40, "items": 10, "iterations": 1}),
        (
            "secure-sum",
            {"users": 30, "dim": 2, "dp_mechanism": "skellam", "bits": 16, "epsilon": 1.0},
        ),
        ("vfl-primitives", {"users": 300, "task": "lowrank"}),
    ],
)
def test_delta_near_one_is_refused_by_its_declared_range(out_dir, protocol, options):
    """δ = 1 − 1e-9 used to plan for minutes (the calibration's PLD search as σ → 0)."""
    err = refused("delta", out_dir, protocol, delta=1 - 1e-9, **options)
    assert "<= 0.1" in err.allowed and "fails outright" in err.problem


def test_federated_mf_huge_epsilon_is_refused_not_an_overflow(out_dir):
    """objpert at ε = 1e6 was an OverflowError, LFL at 1e9 a NoBracketIntervalFoundError."""
    options = dict(setting="vfl", method="objpert", parties=1, privacy_unit="user", users=40)
    err = refused("epsilon", out_dir, "federated-mf", items=10, epsilon=1e6, **options)
    assert "<= 10000" in err.allowed and "float64" in err.problem
    refused("epsilon", out_dir, "federated-mf", users=40, items=10, iterations=1, epsilon=1e9)


def test_hfl_kmeans_mpc_noise_refuses_an_epsilon_its_truncation_cannot_hold(out_dir):
    """The block ε, not the run's, decides: at N = 400 the default runs t_max = 2 (issue 30's
    rule for the corrected noise), so its largest ε is ~35.6; with iterations=7 (the thesis's
    rule there) each block gets 2/7 of what t_max = 2 gives it and ε = 100 still holds (up to ~124.6)."""
    options = dict(users=400, topology="ring", ring_noise="mpc", clients=3, masking="pairwise")
    for epsilon in (40.0, 300.0, 1e6):
        err = refused("epsilon", out_dir, "hfl-kmeans", epsilon=epsilon, **options)
        assert "truncated sampler" in err.problem
    assert runs("hfl-kmeans", epsilon=30.0, **options).privacy.epsilon <= 30.0 * (1 + 1e-9)
    seven = runs("hfl-kmeans", epsilon=100.0, iterations=7, **options)
    assert seven.metrics["t_max"] == 7 and seven.privacy.epsilon <= 100.0 * (1 + 1e-9)
    err = refused("epsilon", out_dir, "hfl-kmeans", epsilon=130.0, iterations=7, **options)
    assert "truncated sampler" in err.problem


def test_vfl_kmeans_large_epsilon_calibrates_or_is_refused(out_dir):
    """ε = 1e6 was an OverflowError, ε = 100 on 300 users a ValueError in the FM calibration."""
    for epsilon in (100.0, 500.0):
        result = runs("vfl-kmeans", users=300, sketches=32, epsilon=epsilon)
        assert 0 < result.privacy.epsilon <= epsilon * (1 + 1e-9)
    err = refused("epsilon", out_dir, "vfl-kmeans", users=300, sketches=32, epsilon=1e6)
    assert "709" in err.problem


@pytest.mark.parametrize("gamma", [1e-9, 1e-3, 1e6])
def test_vfl_kmeans_gamma_outside_its_range_is_refused_before_any_allocation(out_dir, gamma):
    """γ = 1e-9 tried to allocate 309 GiB; γ = 1e6 ended in a ValueError."""
    err = refused("gamma", out_dir, "vfl-kmeans", users=300, sketches=32, gamma=gamma)
    assert "[0.1, 100]" not in err.problem and ">= 0.1 and <= 100" in err.allowed


def test_vfl_kmeans_gamma_runs_down_to_the_specs_smallest():
    """The spec gives the correction factor for γ = 0.1 (0.9538); the floor was 0.25."""
    result = runs("vfl-kmeans", users=300, sketches=32, gamma=0.1)
    assert result.config["protocol"]["gamma"] == 0.1
    assert 0 < result.privacy.epsilon <= 1.0 * (1 + 1e-9)


# --- evaluation never fails after the release ------------------------------------------------------
@pytest.mark.parametrize("task", ["kmeans", "kmedian"])
def test_vfl_primitives_more_clusters_than_users_is_refused_before_the_release(out_dir, task):
    """k > users divided by zero in the evaluation after the DP release (budget spent)."""
    err = refused("k", out_dir, "vfl-primitives", task=task, users=5, k=6)
    assert "5 users" in err.problem


def test_vfl_primitives_rank_not_below_d_is_refused_before_the_release(out_dir):
    """lowrank with k >= d divided by zero in the evaluation after the release."""
    err = refused("k", out_dir, "vfl-primitives", task="lowrank", users=300, dims=6, k=6)
    assert "6 attributes" in err.problem
    assert runs("vfl-primitives", task="lowrank", users=300, dims=6, k=5).metrics["ratio"] > 0


@pytest.mark.parametrize("options", [{"k": 1}, {"sample_rate": 1e-9}])
def test_vfl_primitives_kmeans_without_a_positive_weight_still_chooses_centers(options):
    """Noise that leaves no grid cell a positive weight ended in a ValueError after the release;
    the grid is then clustered unweighted (post-processing)."""
    result = runs("vfl-primitives", users=300, **options)
    assert result.tables["centers"].num_rows == options.get("k", 4)
    assert result.metrics["cost_ratio"] >= 1.0 - 1e-9
    # the fallback is said, not silent
    assert result.metrics["unweighted_grid"] is True
    assert "clustered unweighted" in result.headline
    assert runs("vfl-primitives", users=300).metrics["unweighted_grid"] is False


@pytest.mark.parametrize("task", ["l2-moment", "lp-moment"])
def test_vfl_primitives_moment_of_all_zero_data_reports_instead_of_failing(tmp_path, task):
    """All-zero data: the true moment is 0, and the relative error after the release divided by
    zero (ZeroDivisionError, budget spent). It is reported as inf instead."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = tmp_path / "zeros.csv"
    pacsv.write_csv(pa.table({"x0": [0] * 40, "x1": [0] * 40}), path)
    data = {"path": str(path), "columns": {"p0": ["x0"], "p1": ["x1"]}}
    options = {"value_bounds": [0, 4]} if task == "lp-moment" else {}
    result = runs("vfl-primitives", task=task, data=data, **options)
    assert result.metrics["true"] == 0.0
    assert result.metrics["relative_error"] in (float("inf"), float("-inf"), 0.0)


def test_a_sketch_too_large_for_memory_is_refused_naming_sketch_constant(out_dir):
    """sketch_constant = 1e6 was refused naming `users`, which had not grown at all."""
    err = refused(
        "sketch_constant", out_dir, "vfl-primitives", task="lowrank", users=300, sketch_constant=1e6
    )
    assert "GiB" in err.problem


def test_pattern_count_exact_calibration_at_a_huge_epsilon_names_epsilon(out_dir):
    """(The issue saw an internal `keep_probability` named and a run directory left.)"""
    err = refused("epsilon", out_dir, "pattern-count", users=300, calibration="exact", epsilon=1e9)
    assert "no noise" in err.problem


def test_the_ledger_slack_is_capped_by_the_budget():
    """The 1e-12 absolute slack for float rounding was uncapped: a budget of 1e-13 accepted a
    Laplace event of ε = 9e-13 (9× the budget)."""
    from rayfed.errors import BudgetExceeded
    from rayfed.privacy.ledger import Budget, PrivacyLedger
    from rayfed.privacy.mechanisms import laplace_event

    ledger = PrivacyLedger(Budget(1e-13))
    with pytest.raises(BudgetExceeded):
        ledger.charge(laplace_event(1.0, 9e-13), label="9x")
    with pytest.raises(BudgetExceeded):
        ledger.charge(laplace_event(1.0, 1.01e-13), label="1.01x")
    assert ledger.charge(laplace_event(1.0, 1e-13), label="exact").epsilon_after == 1e-13
    # at ordinary budgets the absolute slack still covers rounding of 1e-12
    ledger = PrivacyLedger(Budget(1e-9))
    assert ledger.charge(laplace_event(1.0, 1e-9 + 5e-13), label="rounded").epsilon_after > 1e-9


def test_federated_mf_epsilon_cap_states_the_reason_that_holds(out_dir):
    """The cap's reason said DP-SGLD planned for minutes beyond 10⁴, which it does not (it plans
    in seconds at 10⁹); ObjPertb's default λ overflows float64 from 10⁵ (OverflowError)."""
    options = dict(setting="vfl", method="objpert", parties=1, users=40, items=10)
    err = refused("epsilon", out_dir, "federated-mf", epsilon=1e5, **options)
    assert "overflows float64 from ε = 10⁵" in str(err) and "minutes" not in str(err)
    assert runs("federated-mf", epsilon=1e4, **options).privacy.epsilon <= 1e4


def test_vfl_primitives_delta_declares_the_open_bound_its_validation_holds(out_dir):
    """delta was declared >= 0 while δ = 0 is refused: the declared range now says > 0."""
    err = refused("delta", out_dir, "vfl-primitives", task="l2-moment", users=300, delta=0.0)
    assert err.allowed.startswith("> 0")


@pytest.mark.parametrize("name", ["hfl-kmeans", "vfl-kmeans"])
def test_the_synthetic_std_and_the_spread_run_option_are_both_settable(out_dir, name):
    """The data's std was named spread, shadowed by the run option spread (a bool): spread=0.2
    was refused as 'expected true or false', so the std could not be set at all."""
    from rayfed.api import resolve
    from rayfed.config import RunOptions

    _, run_opts, cfg = resolve(name, {"cluster_sd": 0.2, "spread": False})
    assert (cfg.cluster_sd, run_opts.spread) == (0.2, False)
    err = refused("spread", out_dir, name, users=300, spread=0.2)
    assert "cluster_sd=0.2" in err.allowed
    run_names = {f.name for f in dataclasses.fields(RunOptions)}
    assert not run_names & {f.name for f in dataclasses.fields(type(cfg))}


def test_fm_normalise_counts_its_uniform_fallback():
    from rayfed.clustering import fm

    with fm.counting_fallbacks() as seen:
        assert fm.normalise(np.array([1.0, 3.0]), 8.0).tolist() == [2.0, 6.0]
        assert fm.normalise(np.array([-1.0, -2.0]), 8.0).tolist() == [4.0, 4.0]
        assert fm.normalise(np.full((2, 2), np.nan), 8.0, "simplex").tolist() == [[2.0] * 2] * 2
    assert seen == [(2,), (2, 2)]


def test_vfl_kmeans_says_when_its_grid_weights_fell_back_to_uniform(monkeypatch):
    """A grid with no positive weight left after the noise is made uniform (post-processing):
    the run counts it in a metric and says it in the headline (it was silent)."""
    from rayfed.clustering import fm

    options = {"users": 300, "sketches": 32, "method": "dpfmps-basic", "projection": "clip"}
    assert runs("vfl-kmeans", **options).metrics["uniform_fallbacks"] == 0
    monkeypatch.setattr(
        fm, "raw_intersections", lambda n_hat, sketches, *a, **k: -np.ones((3,) * len(sketches))
    )
    result = runs("vfl-kmeans", **options)
    assert result.metrics["uniform_fallbacks"] == 1
    assert "1 grid table(s) had no positive weight" in result.headline


@pytest.mark.parametrize("setting", ["lfl", "vfl"])
def test_a_test_fraction_that_holds_out_nothing_is_refused(out_dir, setting):
    """test_fraction just above 0 left the test set empty and the headline read 'test MSE
    0.0000' (the mean of nothing)."""
    options = dict(setting=setting, users=150, items=20, iterations=2)
    err = refused("test_fraction", out_dir, "federated-mf", test_fraction=1e-9, **options)
    assert "holds out none of the" in err.problem and "no test MSE" in err.problem
