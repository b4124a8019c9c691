"""`rayfed run secure-sum`: the Ray path, a cohort killed mid-round, labels and bad input."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed.cli import main
from rayfed.errors import BelowThreshold, ConfigError, DataError

SMALL = dict(users=60, dim=8, seed=5, out_dir=None)


@pytest.mark.ray
@pytest.mark.parametrize("threat_model", ["semi-honest", "malicious"])  # malicious: the PKI
def test_ray_path_equals_in_process_path(ray_cluster, threat_model):  # replies go by reference
    kw = dict(SMALL, population={"rates": {"masked_input": 0.05}}, dropout=0.1, cohorts=3)
    kw["threat_model"] = threat_model
    on_ray = rayfed.run("secure-sum", **kw)
    local = rayfed.run("secure-sum", backend="local", **kw)
    assert on_ray.metrics["exact"] and local.metrics["exact"]
    assert on_ray.tables["sum"].equals(local.tables["sum"])
    assert on_ray.metrics["rounds"] == local.metrics["rounds"]


@pytest.mark.ray
def test_killing_a_cohort_mid_round_still_gives_the_exact_sum_of_the_survivors(ray_cluster):
    result = rayfed.run(
        "secure-sum",
        cohorts=3,
        fail=["cohort=c1@phase=masked_input"],
        tolerated_dropout=0.45,
        **SMALL,
    )
    (row,) = result.metrics["rounds"]
    assert row["failed_cohorts"] == "c1" and row["exact"]
    assert row["alive_masked_input"] == 40  # the 20 users of c1 sent shares, then their actor died
    assert result.metrics["exact"]


@pytest.mark.ray
def test_killing_too_many_users_aborts(ray_cluster):
    with pytest.raises(BelowThreshold, match="masked_input"):
        rayfed.run("secure-sum", cohorts=2, fail=["cohort=c0@phase=masked_input"], **SMALL)


def test_rounds_modes_and_labels(out_dir):
    result = rayfed.run(
        "secure-sum", backend="local", mode="plain", rounds=2, **{**SMALL, "out_dir": str(out_dir)}
    )
    assert "INSECURE" in result.headline and "INSECURE" in result.privacy.statement
    assert len(result.metrics["rounds"]) == 2 and result.metrics["exact"]
    manifest = json.loads((out_dir / result.run_id / "manifest.json").read_text())
    assert "INSECURE" in manifest["privacy"]["statement"] and manifest["privacy"]["epsilon"] == 0
    dealer = rayfed.run("secure-sum", backend="local", mode="dealer", **SMALL)
    assert "NOT secure against the server" in dealer.headline
    simulation = rayfed.run("secure-sum", backend="local", **SMALL)
    assert "NOT secure" in simulation.headline and not simulation.metrics["secure"]
    assert np.allclose(dealer.tables["sum"]["secure_sum"], dealer.tables["sum"]["plaintext_sum"])
    # synthetic inputs lie in [-clip, clip]: the raw and clipped references are the same
    assert dealer.tables["sum"]["clipped_sum"].equals(dealer.tables["sum"]["plaintext_sum"])
    assert dealer.metrics["clipped"] is None and dealer.metrics["clipping_gap"] == 0


def test_vectors_from_a_file(tmp_path):
    gen = np.random.default_rng(0)
    path = tmp_path / "v.csv"
    pacsv.write_csv(
        pa.table({"uid": np.arange(50) * 3, "a": gen.random(50), "b": -gen.random(50)}), path
    )
    result = rayfed.run(
        "secure-sum", backend="local", out_dir=None, data={"path": str(path), "key": "uid"}
    )
    assert result.metrics["exact"] and result.metrics["dim"] == 2 and result.metrics["users"] == 50
    # a cohort killed mid-round, or offline together, with a file's own key (not user_id): the
    # reference finds the cohort's users (it used to look for a column the cohorts do not have)
    for lost in (
        {"fail": ["cohort=c1@phase=masked_input"]},
        {"population": {"outage_cohort": "c1"}},
    ):
        result = rayfed.run(
            "secure-sum",
            backend="local",
            out_dir=None,
            data={"path": str(path), "key": "uid"},
            cohorts=4,
            tolerated_dropout=0.4,
            **lost,
        )
        # 50 users in 4 contiguous blocks: cuts at round(12.5) = 12, 25, round(37.5) = 38
        assert result.metrics["exact"] and result.metrics["rounds"][0]["survivors"] == 50 - 13


@pytest.mark.parametrize("option", ["users", "dim"])
def test_users_and_dim_come_from_a_data_file(tmp_path, option):
    path = tmp_path / "v.csv"
    pacsv.write_csv(pa.table({"uid": np.arange(10), "a": np.zeros(10)}), path)
    with pytest.raises(ConfigError, match="synthetic data only") as err:
        rayfed.run(
            "secure-sum",
            backend="local",
            out_dir=None,
            data={"path": str(path), "key": "uid"},
            **{option: 5},
        )
    assert err.value.field == option


def test_a_sum_of_exactly_two_to_the_53_is_exact(tmp_path):
    """Regression (issue 15): n·R = 2^53 (here 8 users x 2^50 with clip 2^50 at frac_bits 0; the
    issue's 4 x 2^51 is the same n·R) — the old float log2 sized the modulus one bit short, the
    sum wrapped to -2^53 and was reported exact."""
    path = tmp_path / "big.csv"
    pacsv.write_csv(pa.table({"uid": np.arange(8), "v": np.full(8, 2.0**50)}), path)
    result = rayfed.run(
        "secure-sum",
        backend="local",
        out_dir=None,
        clip=2.0**50,
        frac_bits=0,
        data={"path": str(path), "key": "uid"},
    )
    assert result.metrics["modulus_bits"] == 55
    assert result.tables["sum"]["secure_sum"].to_pylist() == [2.0**53]
    assert result.metrics["exact"]


def test_a_text_value_column_is_refused_at_plan_time(tmp_path):
    path = tmp_path / "text.csv"
    pacsv.write_csv(pa.table({"uid": [1, 2, 3], "v": ["a", "b", "c"]}), path)
    with pytest.raises(ConfigError, match="not numeric") as err:
        rayfed.run(
            "secure-sum", backend="local", out_dir=None, data={"path": str(path), "key": "uid"}
        )
    assert err.value.field == "data.columns.values.v"


def test_cli_run_prints_exactness_and_phase_times(capsys, out_dir):
    assert (
        main(
            [
                "run",
                "secure-sum",
                "--backend",
                "local",
                "--quiet",
                "--out",
                str(out_dir),
                "--set",
                "users=40",
                "--set",
                "dim=4",
                "--set",
                "dropout=0.1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "EXACT" in out and "SecAgg" in out and "time" in out


@pytest.mark.parametrize(
    "sets,field",
    [
        (["users=1"], "users"),
        (["modulus_bits=8"], "modulus_bits"),
        (["degree=7"], "degree"),
        (["fail=[cohort=c9@phase=masked_input]"], "fail"),
        (["population.rates={after_lunch: 0.1}"], "population.rates.after_lunch"),
        (["population.lost={before_advertise: [1]}"], "population.lost.before_advertise"),
        (["dropout=0.1", "population.rates={unmask: 0.2}"], "population.rates.unmask"),
        (["tolerated_dropout=0.99"], "tolerated_dropout"),
        (["mode=quantum"], "mode"),
    ],
)
def test_bad_input_names_the_field(sets, field):
    with pytest.raises(ConfigError, match=field):
        rayfed.run("secure-sum", backend="local", out_dir=None, sets=sets)


@pytest.mark.parametrize(
    "option,moved",
    [
        ("dropout_phase=after_share_keys", "population.rates"),
        ("dropout_rates={after_share_keys: 0.1}", "population.rates"),
        ("dropout_users={after_masked_input: [1]}", "population.lost"),
        ("kill=c1@masked_input", "--fail cohort=K@phase=P"),
    ],
)
def test_a_removed_dropout_option_names_its_replacement(option, moved):
    with pytest.raises(ConfigError) as err:
        rayfed.run("secure-sum", backend="local", out_dir=None, sets=[option])
    assert err.value.field == option.partition("=")[0]
    assert f"moved to {moved}" in str(err.value)


def test_population_rates_and_lost_users_in_secaggs_phases():
    """population.rates and population.lost speak SecAgg's phases; the exactness check (the
    reference derives the survivors from the same schedule on its own) holds, the users listed
    at unmask are not in the sum, and dropout=0.1 is population.rates.unmask=0.1, user for user."""
    lost = {"advertise": [0, 1], "masked_input": [2], "unmask": [3, 4]}
    rates = {"share_keys": 0.05, "masked_input": 0.05}
    result = rayfed.run(
        "secure-sum", backend="local", population={"rates": rates, "lost": lost}, **SMALL
    )
    (row,) = result.metrics["rounds"]
    assert result.metrics["exact"] and row["alive_advertise"] <= 58
    plain = rayfed.run("secure-sum", backend="local", dropout=0.1, **SMALL)
    same = rayfed.run("secure-sum", backend="local", population={"rates": {"unmask": 0.1}}, **SMALL)
    assert plain.metrics["rounds"] == same.metrics["rounds"]
    assert plain.tables["sum"].equals(same.tables["sum"])


def test_stress_sweep_writes_table_json_and_plot(tmp_path, capsys):
    assert (
        main(
            [
                "stress",
                "secure-sum",
                "--backend",
                "local",
                "--set",
                "users=60",
                "--set",
                "dim=4",
                "--rates",
                "0,0.5",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    (path,) = tmp_path.iterdir()
    rows = json.loads((path / "stress.json").read_text())["rows"]
    outcome = {(r["scenario"], r["dropout"]): r["outcome"] for r in rows}
    assert outcome[("rate", 0.0)] == "complete" and outcome[("rate", 0.5)] == "aborted"
    for row in rows:
        if row["expected"] in ("complete", "aborted"):
            assert row["outcome"] == row["expected"], row
    assert (path / "stress.parquet").stat().st_size and (
        path / "stress.png"
    ).stat().st_size > 10_000
    assert "t-1 of one user's neighbours" in capsys.readouterr().out


def test_stress_sweeps_a_population_model(tmp_path, capsys):
    """--small form: Markov availability at P(on->off) = 0.02 (stationary offline share
    0.02/0.52 = 4 %, within the tolerated 30 %) and 0.5 (50 % offline, far beyond it): every run
    of the first completes, every run of the second aborts, and no sum is ever wrong."""
    args = ["stress", "secure-sum", "--backend", "local", "--out", str(tmp_path)]
    for option in ("users=60", "dim=4", "population.availability=markov"):
        args += ["--set", option]
    assert main([*args, "--sweep", "population.markov_off=0.02,0.5", "--reps", "3"]) == 0
    (path,) = tmp_path.iterdir()
    low, high = json.loads((path / "stress.json").read_text())["rows"]
    assert (low["value"], low["aborts"], high["aborts"]) == ("0.02", 0, 3)
    assert low["wrong_sums"] == high["wrong_sums"] == 0
    assert 0 < low["not_in_sum"] < 0.3 and low["alive_unmask"] <= low["alive_advertise"] <= 60
    assert high["abort_ci_low"] == pytest.approx(0.4385, abs=1e-4)  # Wilson, 3 of 3
    # the finder's bound (eta = 30) where the observed dropout is within the tolerated 30 %,
    # none where it is far beyond
    assert low["abort_bound_log2"] < -29 and 0 < low["observed_dropout"] < 0.3
    assert high["abort_bound_log2"] is None and high["observed_dropout"] > 0.3
    assert (path / "stress.png").stat().st_size > 10_000
    assert "markov_off=0.5" in capsys.readouterr().out


def test_wilson_interval_matches_the_textbook_values():
    from rayfed.stress import wilson

    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)


def test_weak_overrides_and_oversized_complete_graphs_are_errors():
    with pytest.raises(ConfigError, match="threshold.*miss the bounds"):
        rayfed.run("secure-sum", backend="local", out_dir=None, users=200, threshold=2)
    weak = rayfed.run(
        "secure-sum", backend="local", out_dir=None, users=200, threshold=2, allow_weak_params=True
    )
    assert weak.metrics["exact"] and weak.metrics["log2_security_failure"] > -40
    with pytest.raises(ConfigError, match="graph.*GiB"):
        rayfed.run(
            "secure-sum", backend="local", out_dir=None, users=20_000, graph="complete", cohorts=1
        )


def test_a_replayed_trace_decides_who_is_online(tmp_path):
    """Users 0-9 are offline at round 0 and user 10 answers too late: exactly they are missing
    from round 0's exact sum, and nobody from round 1's."""
    path = tmp_path / "trace.parquet"
    users = np.arange(11)
    pq.write_table(
        pa.table(
            {
                "user": users,
                "round": np.zeros(11, dtype=np.int64),
                "available": users >= 10,
                "latency_s": np.where(users >= 10, 60.0, 1.0),
            }
        ),
        path,
    )
    result = rayfed.run(
        "secure-sum",
        backend="local",
        out_dir=None,
        users=100,
        dim=3,
        rounds=2,
        population={
            "trace": str(path),
            "availability": "trace",
            "latency": "trace",
            "latency_sigma": 0.0,  # every unrecorded answer takes the median, 1 s
        },
    )
    rounds = result.metrics["rounds"]
    assert [r["survivors"] for r in rounds] == [89, 100]
    assert all(r["exact"] for r in rounds)
    # round 0 waits out the 10 s deadline at advertise (users 0-10 never answer); round 1 is 1 s
    # a phase
    assert result.metrics["simulated_seconds"][0]["advertise"] == 10.0
    assert result.metrics["simulated_round_seconds"][1] == 4.0


@pytest.mark.parametrize(
    "options,field",
    [
        ({"availability": "trace"}, "population.trace"),
        ({"trace": "t.csv"}, "population.trace"),
        ({"markov_on": 0.3}, "population.markov_on"),
        ({"latency_deadline_s": 5.0}, "population.latency_deadline_s"),
        ({"outage_start": 2}, "population.outage_start"),
        ({"outage_cohort": "c9"}, "population.outage_cohort"),
        ({"outage": [1], "outage_cohort": "c0"}, "population.outage_cohort"),
        ({"outage_column": "region"}, "population.outage_value"),
        ({"outage_value": "north"}, "population.outage_column"),
        (
            {"outage_column": "region", "outage_value": "n", "outage": [1]},
            "population.outage_cohort",
        ),
        ({"outage_column": "region", "outage_value": "n"}, "population.outage_column"),  # no file
        ({"availability": "markov", "markov_off": 2.0}, "population.markov_off"),
    ],
)
def test_population_options_are_checked(options, field):
    """Each model option's bad input names its field (the last case: synthetic users have no
    data column to take an outage from)."""
    with pytest.raises(ConfigError) as err:
        rayfed.run("secure-sum", backend="local", out_dir=None, users=20, dim=2, population=options)
    assert err.value.field == field


@pytest.mark.parametrize("mode", ["dealer", "plain"])
def test_the_malicious_threat_model_needs_the_users_keys(mode):
    """No keys, nothing to sign with: refused by the option and by make_spec itself."""
    with pytest.raises(ConfigError) as err:
        rayfed.run("secure-sum", backend="local", out_dir=None, mode=mode, threat_model="malicious")
    assert err.value.field == "threat_model"
    from rayfed.secagg import FixedPoint, find_params, make_spec

    with pytest.raises(ConfigError, match="the users' own keys"):
        make_spec(
            round=0,
            mode=mode,
            registry=np.arange(20),
            params=find_params(20, dropout=0.3, threat_model="malicious"),
            encoding=FixedPoint.choose(20, 1.0, 8),
            dim=2,
        )


# --- a data file's values outside [-clip, clip] (issue 25: never clipped in silence) -------------
def _half_far_out(tmp_path, n=300, far=50.0):
    """The audit's case: ``n`` users, half of them at ±``far`` with clip = 1, the rest in [-1, 1]."""
    gen = np.random.default_rng(25)
    v = gen.uniform(-1, 1, n)
    out = gen.choice(n, n // 2, replace=False)
    v[out] = np.where(gen.random(n // 2) < 0.4, far, -far)  # a raw sum far from the clipped one
    path = tmp_path / "far.csv"
    pacsv.write_csv(pa.table({"uid": np.arange(n), "v": v}), path)
    return path, v


def test_out_of_domain_values_are_refused_by_default_with_no_run_directory(tmp_path):
    path, _ = _half_far_out(tmp_path)
    out = tmp_path / "runs"
    out.mkdir()
    with pytest.raises(DataError) as err:
        rayfed.run(
            "secure-sum", backend="local", out_dir=str(out), data={"path": str(path), "key": "uid"}
        )
    assert err.value.field == "data.v"
    assert "150 of 300 values of column 'v'" in str(err.value)
    assert "out_of_domain=clip" in err.value.allowed and "clip >= 50" in err.value.allowed
    assert list(out.iterdir()) == []  # refused in plan: no run directory


def test_clipped_values_are_counted_and_the_raw_sum_kept_beside(tmp_path):
    path, v = _half_far_out(tmp_path)
    out = tmp_path / "runs"
    result = rayfed.run(
        "secure-sum",
        backend="local",
        out_dir=str(out),
        out_of_domain="clip",
        data={"path": str(path), "key": "uid"},
    )
    # references computed here, from the file's values: on the 2^-16 grid each value moves by at
    # most 2^-17
    raw, clipped = v.sum(), np.clip(v, -1, 1).sum()
    assert abs(raw - clipped) > 100  # the audit's gap (-282.66 against -7.67 there)
    table = result.tables["sum"]
    assert table["plaintext_sum"][0].as_py() == pytest.approx(raw, abs=300 * 2**-17)
    assert table["clipped_sum"][0].as_py() == pytest.approx(clipped, abs=300 * 2**-17)
    assert table["secure_sum"].equals(table["clipped_sum"])  # exact, against the clipped values
    assert result.metrics["exact"]
    statement = "150 of 300 data.v values clipped to [-1, 1]"
    assert statement in result.headline
    assert "EXACT for the clipped values" in result.headline  # never exact against the raw sum
    assert f"raw plaintext sum {table['plaintext_sum'][0].as_py():.6g}" in result.headline
    assert result.metrics["clipped"]["count"] == 150 and result.metrics["clipped"]["total"] == 300
    assert result.metrics["clipping_gap"] == pytest.approx(abs(raw - clipped), abs=1e-3)
    manifest = json.loads((out / result.run_id / "manifest.json").read_text())
    assert manifest["metrics"]["clipped"]["statement"] == statement
    assert statement in manifest["headline"]


def test_the_exactness_check_still_catches_a_lost_input_on_clipped_data(tmp_path, monkeypatch):
    """A mutant cohort step that loses one surviving user's (clipped, nonzero) input: the sum
    no longer matches the clipped reference, so the run is NOT EXACT."""
    from rayfed.protocols.secure_sum import driver

    path, v = _half_far_out(tmp_path)
    original = driver.table_inputs

    def loses_user_0(ctx, round, ids, columns):
        x = original(ctx, round, ids, columns)
        x[ids == 0] = 0.0
        return x

    monkeypatch.setattr(driver, "table_inputs", loses_user_0)
    result = rayfed.run(
        "secure-sum",
        backend="local",
        out_dir=None,
        out_of_domain="clip",
        data={"path": str(path), "key": "uid"},
    )
    assert v[0] != 0 and not result.metrics["exact"]
    assert "NOT EXACT for the clipped values" in result.headline


def test_several_columns_name_the_column_outside_and_count_per_column(tmp_path):
    path = tmp_path / "two.csv"
    b = np.array([0.5, 3.0, -2.0, 0.0, 1.0])  # 2 outside [-1, 1]; 1.0 is inside
    pacsv.write_csv(pa.table({"uid": np.arange(5), "a": np.zeros(5), "b": b}), path)
    data = {"path": str(path), "key": "uid"}
    with pytest.raises(DataError) as err:
        rayfed.run("secure-sum", backend="local", out_dir=None, data=data)
    assert err.value.field == "data.b" and "2 of 5 values of column 'b'" in str(err.value)
    result = rayfed.run(
        "secure-sum", backend="local", out_dir=None, data=data, out_of_domain="clip"
    )
    assert "2 of 10 data values clipped to [-1, 1] (b: 2)" in result.headline
    assert result.metrics["clipped"]["columns"] == {"a": 0, "b": 2}
    table = result.tables["sum"]
    assert table["plaintext_sum"].to_pylist() == [0.0, 2.5]
    assert table["clipped_sum"].to_pylist() == table["secure_sum"].to_pylist() == [0.0, 1.5]
    assert "differs by up to 1 in a coordinate" in result.headline


def test_data_inside_the_domain_runs_unchanged_under_either_policy(tmp_path):
    path = tmp_path / "in.csv"
    pacsv.write_csv(pa.table({"uid": np.arange(6), "v": [-1, 1, 0, 0, 1, 1]}), path)  # integers
    data = {"path": str(path), "key": "uid"}
    for policy in ("refuse", "clip"):
        result = rayfed.run(
            "secure-sum", backend="local", out_dir=None, data=data, out_of_domain=policy
        )
        assert result.metrics["exact"] and result.metrics["clipped"]["count"] == 0
        assert result.tables["sum"]["plaintext_sum"].to_pylist() == [2.0]
        assert "clipped" not in result.headline
    with pytest.raises(ConfigError) as err:  # synthetic inputs are drawn in [-clip, clip]
        rayfed.run("secure-sum", backend="local", out_dir=None, users=10, out_of_domain="clip")
    assert err.value.field == "out_of_domain"


def _one_column(tmp_path, values, name="v.csv"):
    """A data file of one value column ``v`` (read back as written) and its run options."""
    path = tmp_path / name
    pacsv.write_csv(pa.table({"uid": np.arange(len(values)), "v": values}), path)
    assert pacsv.read_csv(path)["v"].equals(pa.chunked_array([values]))
    return dict(backend="local", out_dir=None, data={"path": str(path), "key": "uid"})


def test_huge_clipped_values_report_their_raw_sum(tmp_path):
    """Two values of 1e304 clipped to [-1, 1]: the run used to crash after the protocol ran
    (the raw sum's grid integer, 2e304·2^16, beyond float64, was converted before scaling); the
    raw plaintext sum is the exact one, rounded once: 2e304 + 0.5 + 0.25 - 0.75 (on the grid)."""
    from fractions import Fraction

    v = np.array([1e304, 1e304, 0.5, 0.25, -0.75, 0.0])
    result = rayfed.run("secure-sum", out_of_domain="clip", **_one_column(tmp_path, v))
    table = result.tables["sum"]
    raw = float(sum(Fraction(x) for x in v))  # exact, rounded once
    assert table["plaintext_sum"].to_pylist() == [raw] and raw == 2e304
    assert table["clipped_sum"].to_pylist() == table["secure_sum"].to_pylist() == [2.0]
    assert result.metrics["exact"] and result.metrics["clipping_gap"] == pytest.approx(2e304)
    assert "raw plaintext sum 2e+304" in result.headline
    assert "beyond float64" not in result.headline


def test_a_raw_sum_beyond_float64_is_stated_not_crashed(tmp_path):
    """Two values of 1.5e308: their raw sum, 3e308, is beyond float64's range (1.8e308): the
    table holds inf and the headline says so; the secure (clipped) sum is exact."""
    v = np.array([1.5e308, 1.5e308, -0.5, 0.25, 0.0, 0.0])
    result = rayfed.run("secure-sum", out_of_domain="clip", **_one_column(tmp_path, v))
    table = result.tables["sum"]
    assert table["plaintext_sum"].to_pylist() == [np.inf]
    assert table["clipped_sum"].to_pylist() == table["secure_sum"].to_pylist() == [1.75]
    assert result.metrics["exact"] and result.metrics["raw_sum_beyond_float64"] == 1
    assert "the raw plaintext sum lies beyond float64's range in 1 coordinate" in result.headline


def test_integer_values_beyond_2_53_are_summed_exactly(tmp_path):
    """An integer column with values beyond 2^53: the raw plaintext sum adds the integers
    exactly (cast to float64 first, 2^62 + 1 and -2^62 cancelled to 0 and the 1 was lost)."""
    v = np.array([2**62 + 1, -(2**62), 3, -2, 0], dtype=np.int64)
    result = rayfed.run("secure-sum", out_of_domain="clip", **_one_column(tmp_path, v))
    table = result.tables["sum"]
    assert table["plaintext_sum"].to_pylist() == [2.0]  # 2^62 + 1 - 2^62 + 3 - 2
    assert table["clipped_sum"].to_pylist() == table["secure_sum"].to_pylist() == [0.0]
    assert result.metrics["exact"] and "raw plaintext sum 2)" in result.headline


def test_stress_adversarial_losses_keep_the_users_own_population_lost():
    """The adversarial rows lose users at unmask on top of the options' own ``population.lost``
    (merged, not replaced): a user's own losses at other phases and at unmask stay."""
    from rayfed.stress import _lost

    options = {
        "dropout": 0.1,
        "population": {"lost": {"share_keys": [7], "unmask": [9, 2]}, "availability": "markov"},
    }
    got = _lost(options, np.array([2, 3]))
    assert got["dropout"] == 0.0
    assert got["population"]["availability"] == "markov"
    assert got["population"]["lost"] == {"share_keys": [7], "unmask": [2, 3, 9]}
    assert options["population"]["lost"] == {"share_keys": [7], "unmask": [9, 2]}  # untouched
