"""LFL-SGDMF (spec federated-mf.md §2.7-2.9): noise algebra, the aggregate noise law, thresholds,
the honest ε of both modes, and the orderings against the baselines; VFL/HFL orderings, and the
non-private federated reference and learning-rate schedule of spec check C3."""

import math

import numpy as np
import pyarrow as pa
import pytest
from scipy import optimize, special

import rayfed
from rayfed.actors.base import StepContext
from rayfed.errors import ConfigError
from rayfed.mf.lfl import effective_variance, noise_shares, worst_case_variance
from rayfed.privacy import Ball, Measurement, Neighbours, NoiseSource, share_noise
from rayfed.privacy.measurement import DistributedGaussianShare, ReplacementShare
from rayfed.protocols import get_protocol
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.lfl.steps import lfl_round1_inputs, lfl_round2_step

SMALL = dict(users=300, items=40, iterations=3, backend="local", out_dir=None, secagg_mode="dealer")


def lfl_releases(sigma: float, zeta1: float, quorum: int, zeta2: float, width: int):
    """Round 1's and Round 2's measurements at Δ₂ = 1 (a row in the unit ball), as the plan
    builds them."""
    share = DistributedGaussianShare(sigma, zeta1, quorum, zeta2)
    user = Neighbours("replace_special", "user")
    round1 = Measurement("round 1", share, Ball(1.0, 2, width), user)
    return round1, Measurement("round 2", ReplacementShare(share), Ball(1.0, 2, width), user)


@pytest.mark.parametrize("omega", [0.3, 0.6])
def test_effective_variance_matches_the_spec(omega):
    """§2.9: faithful with no dropouts gives 1/(2-ω) (0.588, 0.714); the corrected mode never < 1."""
    n = 200
    z1, z2, beta = noise_shares("faithful", "lfl", n, omega, n)
    assert beta == 1 and effective_variance(z1, z2, n, n) == pytest.approx(1 / (2 - omega))
    # the thesis's F (β = 1, no conditioning): |U2|/|U1| + (|U1|-|U2|)/((1-ω)n) >= 1
    u1, u2 = 180, 150
    z1, z2, _ = noise_shares("faithful", "lfl", n, omega, u1)
    assert u2 * z2 + (u1 - u2) * z1 == pytest.approx(u2 / u1 + (u1 - u2) / ((1 - omega) * n))
    for u1 in range(math.ceil((1 - omega) * n), n + 1, 7):
        for u2 in (0, u1 // 2, u1):
            z1, z2, _ = noise_shares("corrected", "lfl", n, omega, u1)
            assert effective_variance(z1, z2, u1, u2) >= 1 - 1e-12
    assert worst_case_variance("faithful", "lfl", n, omega) == pytest.approx(0.5, abs=0.01)
    # the charged worst case (the mechanism's F) is the two-round formula at |U1| = |U2| = t
    t = math.ceil((1 - omega) * n)
    for mode, method in (("faithful", "lfl"), ("corrected", "lfl"), ("corrected", "ldp")):
        z1, z2, _ = noise_shares(mode, method, n, omega, t)
        assert worst_case_variance(mode, method, n, omega) == pytest.approx(
            effective_variance(z1, z2, t, t), rel=1e-12
        )


def test_aggregate_noise_variance_is_f_sigma_squared():
    """The realised noise of S1 + β N2 (with zero gradients) has variance F·σ² per coordinate,
    F = |U2|ζ2 + (|U1|-|U2|)ζ1 (faithful, β = 1); tolerance 4·sd of a sample variance over d coordinates."""
    n, omega, sigma, d, dropout = 60, 0.3, 3.0, 20_000, 0.3
    ids = np.arange(n)
    z1, z2, beta = noise_shares("faithful", "lfl", n, omega, n)
    round1, round2 = lfl_releases(sigma, z1, n, z2, d)
    ctx = StepContext(name="c0", role="cohort", seed=5, state={"ids": ids})
    # Round-1 shares of U1 = everyone, as the cohort's mechanism drew them
    share = share_noise(ctx.noise, ids, d, l2_sensitivity=1.0, noise_multiplier=sigma, share=z1)
    ctx.noise.begin_step()
    msg = lfl_round2_step(
        ctx, ids, round=0, width=d, release=round2, round1=round1, zeta2=z2, dropout=dropout
    )
    u2 = len(msg.payload["ids"])
    assert 0 < u2 < n  # some Round-2 dropouts happened
    total = share.sum(axis=0) + beta * msg.payload["values"].sum(axis=0)
    f = u2 * z2 + (n - u2) * z1
    assert abs(total.var() / (f * sigma**2) - 1) < 4 * math.sqrt(2 / d)


@pytest.mark.parametrize("randomness", ["seeded", "secure"])
def test_the_seed_holder_can_strip_round_one_noise_only_in_a_seeded_run(randomness):
    """Regression (issue 15): the coordinator holds the seed (manifest.json), regenerates every
    user's Round-1 share and subtracts it from S1. Seeded, what is left is the exact gradient
    sum; secure, the whole noise (sd sqrt(n·ζ1)·σ per coordinate) is still there."""
    n, m, p, sigma, zeta1 = 40, 6, 3, 5.0, 1 / 30
    ids = np.arange(n)
    gen = np.random.default_rng(4)
    items, ratings = gen.integers(0, m, n), gen.uniform(1, 5, n)
    table = pa.table({"user_id": ids, "item": items, "rating": ratings, "split": ["train"] * n})
    u, v = gen.normal(0, 0.5, (n, p)), gen.normal(0, 0.5, (m, p))
    ctx = StepContext(
        name="c0",
        role="cohort",
        seed=9,
        table=table,
        state={"ids": ids, "u": u},
        randomness=randomness,
    )
    round1, _ = lfl_releases(sigma, zeta1, 30, zeta1, m * p)
    inputs, _ = lfl_round1_inputs(ctx, 0, ids, v, round1)
    attack = share_noise(
        NoiseSource.seeded(9, "coordinator"),
        ids,
        m * p,
        l2_sensitivity=1.0,
        noise_multiplier=sigma,
        share=zeta1,
    )
    left = inputs.sum(axis=0) - attack.sum(axis=0)
    grads = np.zeros((m, p))  # each user's one rating: G_i[j] = -2 (x - <u_i, v_j>) u_i
    for i in range(n):
        grads[items[i]] += -2 * (ratings[i] - u[i] @ v[items[i]]) * u[i]
    residual = left - grads.ravel()
    if randomness == "seeded":
        assert np.allclose(residual, 0, atol=1e-9)
    else:  # 18 coordinates of N(0, n·ζ1·σ²): a sample sd below half the truth has p < 1e-4
        assert residual.std() > 0.5 * math.sqrt(n * zeta1) * sigma


def test_below_the_threshold_an_iteration_is_skipped_and_releases_nothing():
    result = rayfed.run("federated-mf", **SMALL, dropout=0.5, omega=0.3)
    rows = result.metrics["iterations"]
    assert result.metrics["skipped_iterations"] == [r["iteration"] for r in rows] and rows
    assert not any(
        r["name"] == "item_embeddings" and r["phase"] == "update_v"
        for r in result.transcript.to_pylist()
    )


def _gaussian_epsilon(sigma: float, delta: float) -> float:
    """ε at δ of one Gaussian release with noise multiplier σ, exactly (Balle & Wang 2018,
    Thm 8: δ(ε) = Φ(1/2σ − εσ) − e^ε Φ(−1/2σ − εσ))."""

    def excess(eps: float) -> float:
        a, b = 0.5 / sigma - eps * sigma, -0.5 / sigma - eps * sigma
        return float(special.ndtr(a) - math.exp(eps + special.log_ndtr(b))) - delta

    return optimize.brentq(excess, 0.0, 100.0, xtol=1e-12)


def test_faithful_mode_reports_a_larger_effective_epsilon_and_corrected_keeps_the_nominal_one():
    """Faithful (spec §2.9): the server's best estimate from both rounds has noise variance
    F·σ², F = (t − c)·ζ1ζ2/(ζ1 + ζ2) at the worst accepted outcome |U1| = |U2| = t, with ζ1 =
    1/((1−ω)n), ζ2 = 1/t, over the t − c honest users (c = ⌈γn⌉ = 15 colluding with the server
    know their shares): here (n = 300, ω = 0.3, t = 210) F = 0.464 (1/2 counting the colluders,
    a mutant that reports 1.31; not the no-dropout 1/(2−ω), 1.19). T Gaussian releases of
    multiplier z√F compose to one of z√(F/T): its exact ε is the true one (1.37 at nominal 1)."""
    faithful = rayfed.run("federated-mf", **SMALL, mode="faithful", epsilon=1.0)
    corrected = rayfed.run("federated-mf", **SMALL, epsilon=1.0)
    assert corrected.privacy.epsilon <= 1.0 + 1e-9
    n, omega, iterations = SMALL["users"], 0.3, SMALL["iterations"]
    t, c = 210, 15  # ⌈(1 − ω)n⌉, ⌈0.05·n⌉
    zeta1, zeta2 = 1 / ((1 - omega) * n), 1 / t
    f = (t - c) * zeta1 * zeta2 / (zeta1 + zeta2)
    z, delta = faithful.metrics["noise_multiplier"], faithful.privacy.delta
    true = _gaussian_epsilon(z * math.sqrt(f / iterations), delta)
    assert true == pytest.approx(1.37, abs=0.01)
    assert faithful.privacy.epsilon == pytest.approx(true, rel=1e-4)
    assert any("faithful mode" in note for note in faithful.privacy.notes)


def test_ldp_level_noise_is_worse_than_lfl_and_stage_one_only():
    """Spec §6 E8 on synthetic data (2,000 users, 200 items, 10 iterations, ε = 1, dealer SA; the
    defaults before the main job was sized to a minute). Measured over seeds 0-5: LFL 1.134,
    stage-1-only 1.177, LDP-level 1.612 (test MSE); the per-seed difference stage-1 - LFL is
    0.043 ± 0.077 (sd), so LFL ≈ stage-1 here (the spec's strict LFL < stage-1 is on ML-100K),
    while LDP-level noise is worse than both by > 0.3 on every seed. Bounds: 3 sd of the per-seed
    difference (0.23). The baselines an LFL run reports were computed in the same run: they equal
    the separate baseline runs exactly."""
    kw = dict(  # the margins were measured under the RDP calibration (accountant=rdp), at the
        # server step γ = 2 that was the default then (the public rule gives LDP-level noise a
        # step so small that V barely moves: the comparison is at one common γ)
        lr=2.0,
        backend="local",
        out_dir=None,
        secagg_mode="dealer",
        users=2000,
        items=200,
        density=0.05,  # as measured, before LFL's default density became 0.1 (issue 30)
        iterations=10,
        accountant="rdp",
    )
    run = rayfed.run("federated-mf", **kw).metrics
    lfl = run["test_mse"]
    ldp = rayfed.run("federated-mf", method="ldp", **kw).metrics["test_mse"]
    stage1 = rayfed.run("federated-mf", method="stage1", **kw).metrics["test_mse"]
    central = rayfed.run("federated-mf", method="central", **kw).metrics["test_mse"]
    assert ldp - max(lfl, stage1) > 0.23, (lfl, stage1, ldp)
    assert abs(lfl - stage1) < 0.23, (lfl, stage1)
    assert (run["stage1_test_mse"], run["central_test_mse"]) == (stage1, central)
    # the learning curve's last point is the run's own result (the same V, the same Stage 3)
    assert len(run["learning_curve"]) == 10 and run["learning_curve"][-1] == lfl


@pytest.mark.ray
def test_lfl_over_real_secure_aggregation_on_ray(ray_cluster):
    ray_run = rayfed.run("federated-mf", users=120, items=20, iterations=2, out_dir=None, cohorts=2)
    local = rayfed.run(
        "federated-mf", users=120, items=20, iterations=2, out_dir=None, cohorts=2, backend="local"
    )
    assert ray_run.metrics["test_mse"] == local.metrics["test_mse"]
    assert ray_run.privacy.epsilon == pytest.approx(local.privacy.epsilon)
    phases = {r["phase"] for r in ray_run.transcript.to_pylist()}
    assert {"advertise", "share_keys", "masked_input", "unmask", "round2", "update_v"} <= phases


def test_stress_sweep_reports_mse_epsilon_and_aborts(tmp_path, capsys):
    from rayfed.cli import main

    assert (
        main(
            [
                "stress",
                "federated-mf",
                "--backend",
                "local",
                "--set",
                "users=300",
                "--set",
                "items=40",
                "--set",
                "iterations=3",
                "--set",
                "secagg_mode=dealer",
                "--rates",
                "0,0.5",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (path,) = tmp_path.iterdir()
    import json

    rows = json.loads((path / "stress.json").read_text())["rows"]
    assert [r["skipped"] for r in rows] == [0, 3]  # at 50 % dropout every iteration falls below t
    assert rows[0]["alive_round1"] == 300 and rows[0]["abort_ci_high"] < 0.6  # Wilson, 0 of 3
    assert rows[1]["abort_rate"] == 1 and rows[0]["abort_bound_log2"] < -29  # eta = 30
    assert rows[1]["abort_bound_log2"] is None  # 50 % dropout: beyond omega, no bound
    assert rows[0]["epsilon"] == rows[1]["epsilon"]  # skipped iterations are charged (conservative)
    assert (path / "stress.png").stat().st_size > 10_000 and "test MSE" in capsys.readouterr().out


def test_stress_sweeps_an_option_with_the_epsilon_of_each_point(tmp_path, capsys):
    """--sweep for LFL: every point runs --reps seeds and reports the mean and spread of the test
    MSE and the ε that point spent (here the swept ε itself: every iteration is charged)."""
    from rayfed.cli import main

    args = ["stress", "federated-mf", "--backend", "local", "--out", str(tmp_path)]
    for option in ("users=300", "items=40", "iterations=2", "secagg_mode=dealer"):
        args += ["--set", option]
    assert main([*args, "--sweep", "epsilon=1,4", "--reps", "2"]) == 0
    (path,) = tmp_path.iterdir()
    import json

    low, high = json.loads((path / "stress.json").read_text())["rows"]
    assert (low["value"], low["reps"], high["value"]) == ("1", 2, "4")
    # dp-accounting's RDP -> (ε, δ) conversion lands just below the requested ε
    assert 0.99 <= low["epsilon"] <= 1 and 3.96 <= high["epsilon"] <= 4
    assert low["test_mse_sd"] > 0  # two seeds, two different runs
    assert low["skipped"] == high["skipped"] == 0 and low["aborts"] == 0
    assert low["alive_round1"] == 300  # no dropout: every user in every round
    assert "epsilon=4" in capsys.readouterr().out


def test_the_malicious_threat_model_changes_nothing_for_an_honest_server():
    """LFL with threat_model=malicious: every iteration's Round 1 adds the signing round and a
    larger k and t; with an honest server the only other change is Round 2's replacement, which
    takes the worst case's ζ2 = 2/(t − c) (the users cannot check the server's |U1|), so the
    noise the server and its c colluders cannot remove is F = (|U1| − c)·ζ1ζ2/(ζ1 + ζ2) with
    ζ1 = 2/((1−ω)n − c): 285/195 against the semi-honest run's 570/480 (ζ2 = 2/(|U1| − c))."""
    options = dict(users=300, items=40, iterations=2, backend="local", out_dir=None)
    plain = rayfed.run("federated-mf", **options)
    signed = rayfed.run("federated-mf", threat_model="malicious", **options)
    assert signed.tables.keys() == plain.tables.keys()
    for rows, f in (
        (signed.metrics["iterations"], 285 / 195),
        (plain.metrics["iterations"], 570 / 480),
    ):
        assert [r["u1"] for r in rows] == [300, 300]
        assert [r["f_eff"] for r in rows] == pytest.approx([f, f], rel=1e-9)
    phases = {r["phase"] for r in signed.transcript.to_pylist()}
    assert {"consistency", "collect_signatures"} <= phases
    assert "consistency" not in {r["phase"] for r in plain.transcript.to_pylist()}
    assert signed.metrics["secagg_threat_model"] == "malicious"
    assert signed.metrics["secagg_threshold"] * 2 > signed.metrics["secagg_degree"]
    assert plain.metrics["secagg_threshold"] * 2 <= plain.metrics["secagg_degree"]
    assert "threat model malicious" in signed.headline


#: the orderings' margins were measured under the RDP calibration (accountant=rdp), which also
#: keeps these T = 100 runs fast (the tight calibration only lowers the noise), at the constant
#: rate 0.05 (the default before the public rule): both methods at one given rate
VFL = dict(
    setting="vfl", iterations=100, backend="local", out_dir=None, accountant="rdp", vfl_lr=0.05
)


@pytest.mark.parametrize("unit,epsilon", [("rating", 1.0), ("user", 4.0)])
def test_vfl_beats_local_only(unit, epsilon):
    """Spec check E4 on the default synthetic data (2 parties, T=100, T'=10, η=0.01)."""
    vfl = rayfed.run("federated-mf", method="vfl", privacy_unit=unit, epsilon=epsilon, **VFL)
    local = rayfed.run("federated-mf", method="local", privacy_unit=unit, epsilon=epsilon, **VFL)
    assert vfl.metrics["test_mse"] < local.metrics["test_mse"]
    assert vfl.privacy.epsilon <= epsilon * (1 + 1e-6)
    if (
        unit == "rating"
    ):  # disjoint items: parties compose in parallel, each spends the whole budget
        assert vfl.privacy.composition == "parallel" and len(vfl.privacy.per_scope) == 2
    else:  # a user's ratings span both parties: z was calibrated for both parties' steps together
        assert vfl.privacy.composition == "sequential" and vfl.privacy.epsilon == pytest.approx(
            epsilon, rel=0.01
        )
        # regression (issue 15): the local-only baseline's parties hold the same users too, so
        # its releases compose sequentially as its statement says (it reported parallel, below ε)
        assert local.privacy.composition == "sequential"
        assert local.privacy.epsilon == pytest.approx(epsilon, rel=0.01)


def test_setting_and_method_must_match():
    with pytest.raises(rayfed.ConfigError, match="method"):
        rayfed.run("federated-mf", setting="vfl", method="ldp", backend="local", out_dir=None)


def test_hfl_after_fine_tuning_beats_local_non_private_sgd():
    """Spec check E7 (per-user, θ = 10, s = 2): HFL-SGDMF after fine-tuning below the local line."""
    kw = dict(
        setting="hfl",
        iterations=100,
        privacy_unit="user",
        trim=10,
        backend="local",
        out_dir=None,
        accountant="rdp",  # as VFL's above
    )
    hfl = rayfed.run("federated-mf", method="hfl", **kw)
    local = rayfed.run("federated-mf", method="local", **kw)
    assert hfl.metrics["test_mse"] < local.metrics["test_mse"]
    assert (
        hfl.privacy.composition == "parallel" and hfl.privacy.epsilon <= 1.0 + 1e-6
    )  # disjoint users
    assert local.privacy.epsilon == 0  # nothing released


def test_reproduction_job_small(tmp_path, capsys):
    """jobs/federated_mf_repro.py --small: MSE vs ε for the three settings, orderings, JSON and plot."""
    import json
    import runpy
    from pathlib import Path

    job = runpy.run_path(
        str(Path(__file__).resolve().parents[1] / "jobs" / "federated_mf_repro.py")
    )
    # the thesis's RDP calibration: a tenth of the time (the tight ledger composes PLDs every
    # round); the default's accounting is tests/test_federated_mf_tight.py's
    argv = ["--small", "--backend", "local", "--accountant", "rdp", "--out", str(tmp_path)]
    assert job["main"](argv) == 0
    record = json.loads((tmp_path / "federated_mf_repro.json").read_text())
    assert {r["setting"] for r in record["rows"]} == {"vfl", "hfl", "lfl"}
    assert all(record["orderings"].values()), record["orderings"]
    assert (tmp_path / "federated_mf_repro.png").stat().st_size > 20_000
    assert '"orderings_hold": true' in capsys.readouterr().out


def test_reproduction_job_runs_the_literature_studies_and_refuses_them_off_ml100k(
    tmp_path, monkeypatch
):
    """--literature e3,...: each study's main() runs with --out in the job's directory and the
    record lists the files; without ML-100K (--small) or with an unknown name it is refused."""
    import runpy
    import sys
    import types
    from pathlib import Path

    job = runpy.run_path(
        str(Path(__file__).resolve().parents[1] / "jobs" / "federated_mf_repro.py")
    )
    calls = []

    def study(argv):
        calls.append(argv)
        Path(argv[1]).write_text("{}")
        return 0

    monkeypatch.setitem(sys.modules, "federated_mf_baselines", types.SimpleNamespace(main=study))
    plot_literature = job["plot_literature"]  # the real one, used below on the recorded studies
    monkeypatch.setitem(plot_literature.__globals__, "plot_literature", lambda *a: None)
    records = job["literature"]("e3", tmp_path)
    assert calls == [["--out", str(tmp_path / "federated_mf_baselines.json")]]
    assert records == {"e3": str(tmp_path / "federated_mf_baselines.json")}
    for bad in (["--small", "--literature", "e3"], ["--literature", "e9"]):
        assert job["main"]([*bad, "--backend", "local", "--out", str(tmp_path)]) != 0
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    records = {
        "e3": results / "federated_mf_baselines.json",
        "e8": results / "federated_mf_gddr.json",
    }
    plot_literature(records, tmp_path / "literature.png")
    assert (tmp_path / "literature.png").stat().st_size > 30_000  # three panels drawn
    args = types.SimpleNamespace(literature="e3,e8", small=False, data=str(job["ML100K"]))
    if job["ML100K"].exists():  # the default data passes the check
        job["_check_literature"](args)


def test_vfl_split_by_a_column(tmp_path):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    gen = np.random.default_rng(0)
    n, m = 200, 30
    users, items = np.nonzero(gen.random((n, m)) < 0.3)
    genre = np.array(["drama", "comedy", "horror"])[items % 3]
    path = tmp_path / "r.csv"
    pacsv.write_csv(
        pa.table(
            {
                "user_id": users,
                "item_id": items,
                "rating": gen.integers(1, 6, users.size),
                "genre": genre,
            }
        ),
        path,
    )
    result = rayfed.run(
        "federated-mf",
        setting="vfl",
        method="vfl",
        iterations=5,
        backend="local",
        out_dir=None,
        data={"path": str(path)},
        split_column="genre",
    )
    assert result.metrics["parties"] == 3 and np.isfinite(result.metrics["test_mse"])
    with pytest.raises(rayfed.ConfigError, match="applies to a data file") as err:
        rayfed.run(
            "federated-mf",
            setting="vfl",
            method="vfl",
            backend="local",
            out_dir=None,
            split_column="genre",
        )
    assert err.value.field == "split_column"


def test_option_checks_and_defaults(tmp_path):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from rayfed.mf.lfl import threshold

    assert (
        threshold(1000, 0.7) == 300 and threshold(943, 0.3) == 661
    )  # exact, not ceil(300.00000000000006)
    path = tmp_path / "r.csv"
    pacsv.write_csv(
        pa.table({"user_id": [0, 1, 2, 0], "item_id": [0, 1, 1, 2], "rating": [1, 10, 3, 7]}), path
    )
    for setting in ("vfl", "hfl", "lfl"):  # ratings above R break every sensitivity bound
        with pytest.raises(rayfed.ConfigError, match="bound"):
            rayfed.run(
                "federated-mf",
                setting=setting,
                backend="local",
                out_dir=None,
                data={"path": str(path)},
            )
    with pytest.raises(rayfed.ConfigError, match="does not apply to setting=vfl") as err:
        rayfed.run("federated-mf", setting="vfl", omega=0.5, backend="local", out_dir=None)
    assert err.value.field == "omega"
    for wrong in ({"setting": "vfl"}, {"secagg_mode": "dealer"}):  # no Round 1 keys to sign with
        with pytest.raises(rayfed.ConfigError) as err:
            rayfed.run(
                "federated-mf", threat_model="malicious", backend="local", out_dir=None, **wrong
            )
        assert err.value.field == "threat_model"
    with pytest.raises(rayfed.ConfigError, match="too high for threat_model=malicious") as err:
        rayfed.run(
            "federated-mf", threat_model="malicious", omega=0.5, backend="local", out_dir=None
        )
    assert err.value.field == "omega" and "omega <=" in err.value.allowed
    with pytest.raises(rayfed.ConfigError, match="does not apply to setting=lfl") as err:
        rayfed.run("federated-mf", local_steps=5, backend="local", out_dir=None)
    assert err.value.field == "local_steps"
    with pytest.raises(rayfed.ConfigError, match="does not apply to setting=hfl") as err:
        rayfed.run(
            "federated-mf", setting="hfl", split_column="genre", backend="local", out_dir=None
        )
    assert err.value.field == "split_column"
    with pytest.raises(rayfed.ConfigError, match="trim"):
        rayfed.run("federated-mf", setting="vfl", trim=0, backend="local", out_dir=None)
    default_vfl = rayfed.run(
        "federated-mf", setting="vfl", iterations=2, backend="local", out_dir=None
    )
    assert (
        default_vfl.metrics["method"] == "vfl" and default_vfl.metrics["privacy_unit"] == "rating"
    )
    central = rayfed.run(
        "federated-mf", setting="hfl", method="central", backend="local", out_dir=None
    )
    assert 0 < central.metrics["test_mse"] < 2


@pytest.mark.ray
@pytest.mark.parametrize("setting", ["vfl", "hfl"])
def test_party_settings_on_ray_equal_in_process(ray_cluster, setting):
    kw = dict(setting=setting, iterations=2, users=300, items=40, out_dir=None)
    on_ray, local = (
        rayfed.run("federated-mf", **kw),
        rayfed.run("federated-mf", backend="local", **kw),
    )
    assert on_ray.metrics["test_mse"] == local.metrics["test_mse"]
    assert on_ray.privacy.epsilon == pytest.approx(local.privacy.epsilon)


def test_lfl_users_follow_the_population_models():
    """An outage of cohort c1 (the second half of 300 users, dealt in contiguous blocks) in
    iterations 1 and 2: exactly its 150 users are missing from those iterations' Round 1, and
    with ω = 0.6 (t = 120) the iterations still run."""
    options = {**SMALL, "iterations": 4, "cohorts": 2, "omega": 0.6}
    outage = {"outage_cohort": "c1", "outage_start": 1, "outage_rounds": 2}
    result = rayfed.run("federated-mf", population=outage, **options)
    assert [row["u1"] for row in result.metrics["iterations"]] == [300, 150, 150, 300]
    with pytest.raises(ConfigError) as err:
        rayfed.run("federated-mf", setting="vfl", backend="local", population=outage)
    assert err.value.field == "population"


# --- spec C3: the non-private federated reference and the learning rate (issue 18) ---------------
C3 = dict(iterations=100, backend="local", out_dir=None)
SMALL_PARTS = dict(users=200, items=30, backend="local", out_dir=None)


@pytest.mark.parametrize("setting", ["vfl", "hfl"])
def test_noise_none_draws_no_noise_and_claims_no_guarantee(setting, monkeypatch):
    """noise=none runs the federated rounds without drawing noise: a Gaussian draw fails the run,
    the ledger is empty and the result says it is not private; the DP run does draw."""
    import rayfed.privacy.mechanisms as mechanisms

    def refuse(*args, **kwargs):
        raise AssertionError("noise drawn")

    monkeypatch.setattr(mechanisms, "draw_gaussian", refuse)  # every Gaussian measurement's draw
    kw = dict(setting=setting, iterations=2, users=200, items=30, backend="local", out_dir=None)
    plain = rayfed.run("federated-mf", noise="none", **kw)
    assert plain.privacy.entries == [] and plain.privacy.private is False
    assert plain.metrics["delta"] is None
    assert plain.privacy.statement.startswith("not private")
    assert "not private" in plain.headline and plain.metrics["noise_multiplier"] is None
    with pytest.raises(rayfed.PartyFailed, match="noise drawn"):
        rayfed.run("federated-mf", **kw)


def test_noise_none_applies_to_the_noisy_partitioned_methods_only():
    for wrong, field in (
        ({"setting": "lfl"}, "noise"),
        ({"setting": "vfl", "method": "central"}, "noise"),
        ({"setting": "hfl", "method": "local"}, "noise"),
        ({"setting": "vfl", "privacy_unit": "user"}, "privacy_unit"),
        ({"setting": "vfl", "epsilon": 4.0}, "epsilon"),
    ):
        with pytest.raises(ConfigError) as err:
            rayfed.run("federated-mf", noise="none", backend="local", out_dir=None, **wrong)
        assert err.value.field == field, wrong
    local = rayfed.run(
        "federated-mf", setting="vfl", method="local", noise="none", iterations=2, **SMALL_PARTS
    )
    assert local.privacy.entries == []


def test_step_rates_follow_the_schedule_and_constant_stays_a_number():
    from rayfed.mf import learning_rate
    from rayfed.mf.training import step_rates

    assert step_rates(0.5, None, 30, 10, 100) == 0.5  # constant: bit-identical to before
    rates = step_rates(1.0, 0.1, 75, 10, 100)
    assert rates.tolist() == [learning_rate(s, 100, 1.0, 0.1) for s in range(75, 85)]
    assert rates[0] == pytest.approx(1.0 - 0.9 * 75 / 80) and rates[-1] == 0.1


def test_the_driver_hands_every_round_its_slice_of_the_decay(monkeypatch):
    """VFL with vfl_lr_end: the rates the local steps receive, joined over the T rounds, are the
    linear decay from vfl_lr to vfl_lr_end over the first 80 % of the T·T' steps (written out here
    independently), then held; fine-tuning runs at vfl_lr_end."""
    from rayfed.protocols.federated_mf.partitioned import steps

    seen = []
    real = steps.dp_sgd

    def record(*args, lr, **kwargs):
        seen.append((kwargs["steps"], np.broadcast_to(lr, (kwargs["steps"],)).copy()))
        return real(*args, lr=lr, **kwargs)

    monkeypatch.setattr(steps, "dp_sgd", record)
    t, t_local, kappa = 4, 5, 3
    rayfed.run(
        "federated-mf",
        setting="vfl",
        parties=1,
        iterations=t,
        local_steps=t_local,
        finetune_steps=kappa,
        vfl_lr=1.0,
        vfl_lr_end=0.1,
        users=100,
        items=20,
        backend="local",
        out_dir=None,
    )
    total, ramp = t * t_local, int(0.8 * t * t_local)
    want = [1.0 - 0.9 * s / ramp if s < ramp else 0.1 for s in range(total)]
    rounds = np.concatenate([lr for n, lr in seen if n == t_local])
    assert rounds == pytest.approx(want, rel=1e-12)
    assert [lr.tolist() for n, lr in seen if n == kappa] == [[0.1] * kappa]


def test_vfl_non_private_federated_approaches_central_sgd_and_dp_approaches_it():
    """Spec C3 on the default synthetic data (2 parties, (T, T') = (100, 10)): the federated
    rounds without noise reach a training MSE within 10 % of centralised SGD with the same steps
    (the same algorithm with s = 1); the constant rate 0.05 (the default before issue 30's rule)
    leaves the embeddings near their start (issue 18: VFL flat at 1.32 on ML-100K), a larger
    rate learns. The DP curve
    per rating (its own rate, as the thesis tunes per ε) comes nearer the non-private line as ε
    grows; even at ε = 10^4 the calibrated z stays near 0.1, so a gap remains.

    One seed; the margins, measured over seeds 0-2: federated/central training MSE 0.98-1.00
    (bound 1.1), stuck/learning 0.24 (bound 0.6); the gaps 0.94-1.10 > 0.56-0.64 > 0.39-0.44,
    each step at least 2.5 seed-to-seed sd; gap(10^4)/gap(1) 0.39-0.44 against 0.5, the tightest
    (a fixed seed, so the check is deterministic)."""

    def vfl(**kw):  # the margins were measured under the RDP calibration
        if "noise" not in kw:
            kw["accountant"] = "rdp"
        return rayfed.run("federated-mf", setting="vfl", **C3, **kw).metrics

    federated = vfl(noise="none", vfl_lr=2.0, vfl_lr_end=0.2)
    central = vfl(noise="none", parties=1, vfl_lr=2.0, vfl_lr_end=0.2)
    assert federated["train_mse"] < 1.1 * central["train_mse"]
    assert federated["train_mse"] < 0.6 * vfl(noise="none", vfl_lr=0.05)["train_mse"]  # stuck
    gap = [
        vfl(epsilon=e, vfl_lr=0.2, vfl_lr_end=0.02)["test_mse"] - federated["test_mse"]
        for e in (1.0, 64.0, 1e4)
    ]
    assert gap[0] > gap[1] > gap[2] > 0 and gap[2] < 0.5 * gap[0]


@pytest.mark.parametrize("setting", ["lfl", "vfl", "hfl"])
def test_ratings_outside_zero_r_are_refused_or_clipped_and_counted(setting, tmp_path):
    """Every sensitivity bound needs ratings in [0, R]: by default a rating outside is refused,
    naming the ratings and both fixes; with out_of_domain=clip it is clipped, counted in the
    headline and the metrics (2 of the 40 ratings here), and the run is the one on the clipped
    file."""
    import pyarrow.csv as pacsv

    gen = np.random.default_rng(1)
    users, items = np.repeat(np.arange(10), 4), np.tile(np.arange(4), 10)
    ratings = gen.uniform(1, 5, users.size).round(1)
    ratings[[3, 17]] = [7.5, -1.0]
    path, clean = tmp_path / "r.csv", tmp_path / "clean.csv"
    pacsv.write_csv(pa.table({"user_id": users, "item_id": items, "rating": ratings}), path)
    clipped_values = np.clip(ratings, 0, 5)
    pacsv.write_csv(pa.table({"user_id": users, "item_id": items, "rating": clipped_values}), clean)
    # δ = 1e-5: the default 1/|ratings| = 1/40 exceeds the sampling rate, where any z is (0, η)-DP
    kw = dict(setting=setting, iterations=1, delta=1e-5, backend="local", out_dir=None, seed=0)
    if setting != "lfl":
        kw.update(local_steps=1, parties=2)
    with pytest.raises(rayfed.DataError) as err:
        rayfed.run("federated-mf", data={"path": str(path)}, **kw)
    assert err.value.field == "rating" and "out_of_domain=clip" in str(err.value)
    assert "bound >=" in str(err.value)
    clipped = rayfed.run("federated-mf", data={"path": str(path)}, out_of_domain="clip", **kw)
    assert "2 of 40 rating values clipped to [0, 5]" in clipped.headline
    assert clipped.metrics["clipped"]["count"] == 2 and clipped.metrics["clipped"]["total"] == 40
    reference = rayfed.run("federated-mf", data={"path": str(clean)}, **kw)
    assert clipped.metrics["test_mse"] == reference.metrics["test_mse"]
    assert reference.metrics["clipped"]["count"] == 0 and "clipped" not in reference.headline


@pytest.mark.parametrize(
    "options",
    [
        dict(setting="lfl"),
        dict(setting="lfl", method="gd-dr", users=400),  # the shuffle bound needs the users
        dict(setting="vfl"),
        dict(setting="hfl"),
        dict(setting="vfl", method="dp-sgld", parties=1),
    ],
    ids=["lfl", "gd-dr", "vfl", "hfl", "dp-sgld"],
)
def test_every_statement_names_what_the_plan_takes_from_the_data_without_noise(options):
    """The plans read the data for the default δ = 1/|ratings|, the numbers of users n (LFL:
    secure aggregation's registry, its threshold t = ⌈(1−ω)n⌉ and the noise shares; GD-DR's
    quorum) and items m, and the training mean rating: each statement says it takes them as
    public, uncovered."""
    cfg = FederatedMFConfig(**{"users": 150, "items": 20, "iterations": 2, **options})
    statement = get_protocol("federated-mf").plan(cfg, 0).privacy.statement
    public = statement.split("taken as public, not covered:")[1]
    for named in ("δ = 1/|ratings|", "number of users n", "number of items m", "mean rating"):
        assert named in public, (named, statement)
    if cfg.setting == "lfl":
        assert "t = ⌈(1−ω)n⌉" in public


def test_a_user_whose_ratings_are_removed_still_adds_its_share():
    """LFL's relation is zero-out (dummy-row adjacency): the charged event compares two sums of
    the same number of noise shares, which holds only because a registered user with no rating
    still sends its share. Removing user 3's ratings (the neighbour the conformance check builds)
    changes its message by exactly its noise-free gradient row: the share is the same draw."""
    n, m, p = 8, 5, 2
    ids = np.arange(n)
    gen = np.random.default_rng(11)
    items, ratings = gen.integers(0, m, n), gen.uniform(1, 5, n)
    u, v = gen.normal(0, 0.5, (n, p)), gen.normal(0, 0.5, (m, p))

    def inputs(keep):
        table = pa.table(
            {
                "user_id": ids[keep],
                "item": items[keep],
                "rating": ratings[keep],
                "split": ["train"] * int(keep.sum()),
            }
        )
        ctx = StepContext(name="c0", role="cohort", seed=5, table=table, state={"ids": ids, "u": u})
        return lfl_round1_inputs(ctx, 0, ids, v, lfl_releases(2.0, 0.2, 6, 0.2, m * p)[0])[0]

    full, without = inputs(np.ones(n, bool)), inputs(ids != 3)
    assert np.count_nonzero(without[3]) == m * p  # the zero row plus its share: still noise
    row = np.zeros((m, p))
    row[items[3]] = -2 * (ratings[3] - u[3] @ v[items[3]]) * u[3]
    assert np.allclose(full[3] - without[3], row.ravel(), atol=1e-12)
    assert np.array_equal(np.delete(full, 3, 0), np.delete(without, 3, 0))


@pytest.mark.parametrize("kind", ["add_or_remove_one", "replace_one"])
def test_the_distributed_shares_refuse_a_relation_other_than_zero_out(kind):
    """Under add/remove the removed user's share leaves with it (the two sums' variances differ,
    which the event does not count); replace-one needs twice Δ: both are refused, by name."""
    share = DistributedGaussianShare(2.0, 0.1, 10, 0.1)
    with pytest.raises(ValueError, match="replace_special"):
        Measurement("round 1", share, Ball(1.0, 2, 4), Neighbours(kind, "user"))
    with pytest.raises(ValueError, match="replace_special"):
        Measurement("round 2", ReplacementShare(share), Ball(1.0, 2, 4), Neighbours(kind, "user"))


def test_the_lfl_statement_names_zero_out_neighbours():
    plan = get_protocol("federated-mf").plan(
        FederatedMFConfig(users=300, items=40, iterations=3), 0
    )
    assert plan.privacy.relation.kind == "replace_special"
    assert "replaced by the empty record (zero-out: the user stays and takes part)" in (
        plan.privacy.full_statement()
    )


def test_a_malicious_servers_small_zeta2_is_refused_by_the_users():
    """Round 2 under threat_model=malicious: a server sending ζ2 near 0 would have every message
    −ξ_i + ξ'_i reveal the user's Round-1 share. The users take no less than the worst case's ζ2
    (the event's); with a count the users can trust (semi-honest) the server's ζ2 is used."""
    n, width, sigma, zeta1, zeta2 = 40, 3, 5.0, 1 / 30, 1 / 25
    ids = np.arange(n)
    round1, round2 = lfl_releases(sigma, zeta1, 30, zeta2, width)
    share = round1.mechanism.shares(NoiseSource.seeded(9, "c0"), ids, width, 1.0, round=0)

    def sent(checked):
        model = "semi-honest" if checked else "malicious"  # the cohort's own, from the plan
        ctx = StepContext(
            name="c0", role="cohort", seed=9, meta={"threat_model": model}, state={"ids": ids}
        )
        msg = lfl_round2_step(
            ctx,
            ids,
            round=0,
            width=width,
            release=round2,
            round1=round1,
            zeta2=1e-12,
            dropout=0.0,
        )
        return msg.payload["values"] + share  # ξ'_i: the replacement share left

    trusting, checking = sent(True), sent(False)
    assert np.abs(trusting).max() < 1e-4  # sd 5e-6: the message was −ξ_i
    # 120 draws of N(0, ζ2σ²): a sample sd below half the truth has p < 1e-9
    assert checking.std() > 0.5 * math.sqrt(zeta2) * sigma
