"""Inputs are validated where they enter (issue 28): a population trace's schema, repeats and
coverage, an outage outside the run, a label among the features, options the run adjusts, and
headlines that count the reports that arrived. Each refusal is a ConfigError naming the option,
raised before any actor or run directory exists."""

from __future__ import annotations

import html
import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import rayfed
from rayfed.dropout import Trace

SMALL = {"backend": "local", "users": 60, "dim": 2, "cohorts": 2}


def _trace(tmp_path, text: str):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def _run_trace(path, tmp_path, rounds=2, **population):
    return rayfed.run(
        "secure-sum",
        out_dir=str(tmp_path / "runs"),
        rounds=rounds,
        population={"availability": "trace", "trace": str(path), **population},
        **SMALL,
    )


@pytest.mark.parametrize(
    "rows,column,shown",
    [
        ("0,0,no\n", "available", "a text column; numbers expected: row 2"),  # was online
        ("0,0,0.5\n", "available", "holds 0.5"),
        ("0,0,2\n", "available", "holds 2"),
        ("0,0,NaN\n", "available", "NaN"),
        ("0,0,\n", "available", "NaN or an empty cell"),
        ("0.5,0,1\n", "user", "holds 0.5"),
        ("u7,0,1\n", "user", "'u7'"),
        ("0,-1,1\n", "round", "holds -1"),
    ],
)
def test_a_trace_holds_whole_user_and_round_ids_and_0_1_availability(tmp_path, rows, column, shown):
    path = _trace(tmp_path, "user,round,available\n1,0,1\n" + rows)
    with pytest.raises(rayfed.ConfigError) as err:
        _run_trace(path, tmp_path)
    assert err.value.field == "population.trace"
    assert f"trace's {column}" in str(err.value) and shown in str(err.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("latency,shown", [("-1.5", "holds -1.5"), ("inf", "holds inf")])
def test_a_trace_latency_is_non_negative_and_finite(tmp_path, latency, shown):
    path = _trace(tmp_path, f"user,round,available,latency_s\n0,0,1,0.5\n1,0,1,{latency}\n")
    with pytest.raises(rayfed.ConfigError) as err:
        _run_trace(path, tmp_path, latency="trace")
    assert err.value.field == "population.trace" and "row 2" in str(err.value)
    assert shown in str(err.value) and not (tmp_path / "runs").exists()


def test_boolean_and_empty_latency_cells_are_read_as_meant(tmp_path):
    path = _trace(tmp_path, "user,round,available,latency_s\n0,0,true,\n1,0,false,2.5\n")
    trace = Trace.read(path)
    assert trace.available.tolist() == [True, False]
    np.testing.assert_array_equal(trace.latency_s, [np.nan, 2.5])


def test_conflicting_repeats_are_refused_naming_the_first_pair_identical_ones_count_once(
    tmp_path,
):
    path = _trace(tmp_path, "user,round,available\n3,0,1\n5,1,0\n3,0,1\n5,1,1\n4,0,1\n4,0,0\n")
    with pytest.raises(rayfed.ConfigError) as err:
        Trace.read(path)
    assert err.value.field == "population.trace"
    assert "user 5 at round 1 is listed twice" in str(err.value)
    assert "row 2 says available=0, row 4 says available=1" in str(err.value)
    assert "(2 conflicting row(s))" in str(err.value)
    same = _trace(tmp_path, "user,round,available\n3,0,0\n5,1,0\n3,0,0\n")
    trace = Trace.read(same)
    assert trace.user.tolist() == [3, 5] and trace.round.tolist() == [0, 1]
    assert trace.online(0, 0, np.array([3, 5])).tolist() == [False, True]


def test_a_one_based_trace_is_refused_saying_rounds_are_zero_based(tmp_path):
    """Rounds 1..2 for a run of rounds 0..1 used to shift silently by one round."""
    path = _trace(tmp_path, "user,round,available\n0,1,0\n1,1,0\n0,2,0\n")
    with pytest.raises(rayfed.ConfigError) as err:
        _run_trace(path, tmp_path)
    assert err.value.field == "population.trace"
    assert "this run has 2 rounds, rounds 0..1 (0-based)" in str(err.value)
    assert "subtract 1 from its round column" in str(err.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "rows,rounds,problem,fix",
    [
        (  # a sparse trace: 1-based, or 0-based with a row past the run; the message gave one
            "3,1,0\n4,2,0\n",
            2,
            "the trace's rounds are 1..2, none at 0, and this run has 2 rounds, rounds 0..1 "
            "(0-based): counted from 1, its rounds 1..2 are this run's 0..1 and, read as they "
            "are, each row would apply one round late; counted from 0, its 1 row at round 2 is "
            "outside the run",
            "if the trace is 1-based, subtract 1 from its round column; if 0-based, its round 2 "
            "is outside this run's rounds 0..1: drop those rows or run more rounds",
        ),
        (  # one round: it used to speak of 'every other row' and of 'rounds 0..0'
            "3,1,0\n4,1,0\n",
            1,
            "the trace lists only round 1 (2 rows), and this run has 1 round, round 0 "
            "(0-based): counted from 1, its round 1 is this run's round 0; counted from 0, it is "
            "outside the run and nothing of the trace applies",
            "if the trace is 1-based, subtract 1 from its round column; if 0-based, its round 1 "
            "is outside this run's round 0: run more rounds, or give a trace of this run's rounds",
        ),
    ],
)
def test_a_trace_that_reads_as_one_based_is_refused_giving_both_readings_and_fixes(
    tmp_path, rows, rounds, problem, fix
):
    path = _trace(tmp_path, "user,round,available\n" + rows)
    with pytest.raises(rayfed.ConfigError) as err:
        Trace.read(path).coverage(rounds, np.arange(60))
    assert (err.value.field, err.value.problem, err.value.allowed) == (
        "population.trace",
        problem,
        fix,
    )


@pytest.mark.parametrize(
    "rounds_listed",
    [
        range(1, 4),  # none at 0, but round 4's one row is stray beside 20 per round
        range(0, 5),  # rows at round 0: 0-based, however many its round 4 holds
    ],
)
def test_a_trace_with_a_few_rows_past_the_run_is_not_taken_for_one_based(tmp_path, rounds_listed):
    rows = "".join(f"{u},{r},0\n" for r in rounds_listed for u in range(20)) + "3,4,0\n"
    trace = Trace.read(_trace(tmp_path, "user,round,available\n" + rows))
    cover = trace.coverage(4, np.arange(60))
    used = 20 * sum(r < 4 for r in rounds_listed)
    assert (cover["rows_used"], cover["rows_ignored"]) == (used, cover["rows"] - used)


def test_stray_rows_past_the_run_are_stated_with_the_one_based_fix(tmp_path):
    """Round 3's one row is ignored; with none at round 0 the note says how to renumber."""
    rows = "".join(f"{u},{r},0\n" for r in (1, 2) for u in range(15)) + "3,3,0\n"
    with pytest.warns(RuntimeWarning) as caught:
        result = _run_trace(_trace(tmp_path, "user,round,available\n" + rows), tmp_path, 3)
    text = " ".join(str(w.message) for w in caught)
    assert "1 of its 31 rows name users or rounds outside the run and are ignored" in text
    assert (
        "(1 at round 3 and none at round 0: if the trace counts rounds from 1, subtract 1 from "
        "its round column)" in text
    )
    assert [r["survivors"] for r in result.metrics["rounds"]] == [60, 45, 45]


def test_a_trace_of_answer_times_only_says_so_not_that_unlisted_users_are_online(tmp_path):
    """availability=iid, latency=trace: the note used to say 'an unlisted user is online that
    round', which the trace does not decide."""
    rows = "user,round,available,latency_s\n0,0,0,20\n1,0,1,\n2,1,1,0.5\n"
    with pytest.warns(RuntimeWarning) as caught:
        result = rayfed.run(
            "secure-sum",
            out_dir=str(tmp_path / "runs"),
            rounds=2,
            population={
                "latency": "trace",
                "latency_sigma": 0,
                "trace": str(_trace(tmp_path, rows)),
            },
            **SMALL,
        )
    text = " ".join(str(w.message) for w in caught)
    assert "is online that round" not in text
    assert (
        "covers 3 of the run's 120 (user, round) pairs (3 of 60 users, 2 of 2 rounds, 0-based), "
        "2 of them with a latency_s; the trace gives answer times only "
        "(population.availability=iid, its available column unused): an unlisted user's answers "
        "take log-normal times (latency_median_s, latency_sigma), as do those of a listed one "
        "without latency_s"
    ) in text
    manifest = json.loads((tmp_path / "runs" / result.run_id / "manifest.json").read_text())
    cover = manifest["inputs"]["population.trace"]
    assert (cover["used_for"], cover["pairs_listed"], cover["pairs_timed"]) == (
        "answer times",
        3,
        2,
    )
    assert cover["unlisted"] == "answering in log-normal times (latency_median_s, latency_sigma)"
    # user 0, listed offline in round 0, is online: its 20 s answer misses the 10 s deadline
    assert [r["survivors"] for r in result.metrics["rounds"]] == [59, 60]


def test_a_latency_column_of_empty_cells_records_none(tmp_path):
    """pyarrow reads it as type null; it was refused as 'holds None, not a number'."""
    path = _trace(tmp_path, "user,round,available,latency_s\n0,0,1,\n1,0,0,\n")
    trace = Trace.read(path)
    np.testing.assert_array_equal(trace.latency_s, [np.nan, np.nan])
    assert trace.available.tolist() == [True, False]


def test_parquet_decimals_are_numbers_and_text_is_refused_as_text(tmp_path):
    import decimal

    import pyarrow.parquet as pq

    path = tmp_path / "trace.parquet"
    ones = pa.array([decimal.Decimal("1"), decimal.Decimal("0")], pa.decimal128(3, 0))
    pq.write_table(pa.table({"user": [0, 1], "round": [0, 0], "available": ones}), path)
    assert Trace.read(path).available.tolist() == [True, False]  # was: holds Decimal('1')
    pq.write_table(pa.table({"user": [0, 1], "round": [0, 0], "available": ["1", "0"]}), path)
    with pytest.raises(rayfed.ConfigError) as err:
        Trace.read(path)
    assert err.value.problem == (  # was: holds '1', not a number
        "the trace's available column is a text column; numbers expected: row 1 (of the data "
        "rows) holds '1'"
    )


def test_the_option_a_trace_error_names_is_a_parameter_not_dataclasses_field(tmp_path):
    """Trace.read/coverage took ``field``, shadowing dataclasses.field in their module."""
    import dataclasses

    from rayfed import dropout

    assert dropout.field is dataclasses.field
    path = _trace(tmp_path, "user,round,available\n0,0,2\n")
    with pytest.raises(rayfed.ConfigError) as err:
        Trace.read(path, setting="cohort.trace")
    assert err.value.field == "cohort.trace"
    trace = Trace.read(_trace(tmp_path, "user,round,available\n900,0,0\n"))
    with pytest.raises(rayfed.ConfigError) as err:
        trace.coverage(2, np.arange(60), setting="cohort.trace")
    assert err.value.field == "cohort.trace"


@pytest.mark.parametrize(
    "rows,why",
    [
        ("100,0,0\n200,1,0\n", "users 100..200"),  # users 0..59 in the run
        ("0,5,0\n1,7,0\n", "rounds 5..7"),  # rounds 0..1 in the run
    ],
)
def test_a_trace_of_which_nothing_applies_is_refused(tmp_path, rows, why):
    path = _trace(tmp_path, "user,round,available\n" + rows)
    with pytest.raises(rayfed.ConfigError) as err:
        _run_trace(path, tmp_path)
    assert err.value.field == "population.trace"
    assert "nothing of the trace applies" in str(err.value) and why in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_a_trace_that_applies_in_part_is_stated_and_recorded(tmp_path):
    """Users 0-9 offline in round 0; user 500 and round 9 are not in the run. Unlisted users are
    online: round 0 keeps 50 of 60, round 1 all 60."""
    rows = "".join(f"{u},0,0\n" for u in range(10)) + "500,0,0\n3,9,0\n"
    path = _trace(tmp_path, "user,round,available\n" + rows)
    with pytest.warns(RuntimeWarning) as caught:
        result = _run_trace(path, tmp_path)
    text = " ".join(str(w.message) for w in caught)
    assert "covers 10 of the run's 120 (user, round) pairs" in text
    assert "10 of 60 users, 1 of 2 rounds" in text and "2 of its 12 rows" in text
    assert [r["survivors"] for r in result.metrics["rounds"]] == [50, 60]
    manifest = json.loads((tmp_path / "runs" / result.run_id / "manifest.json").read_text())
    cover = manifest["inputs"]["population.trace"]
    assert (cover["rows"], cover["rows_used"], cover["rows_ignored"]) == (12, 10, 2)
    assert (cover["users"], cover["users_listed"]) == (60, 10)
    assert (cover["rounds"], cover["rounds_listed"]) == (2, 1)
    assert (cover["pairs"], cover["pairs_listed"]) == (120, 10)
    assert cover["unlisted"] == "online"
    # the page states it as the terminal did
    from rayfed.report import report

    page = html.unescape(report(tmp_path / "runs" / result.run_id)[-1].read_text())
    assert f"inputs: {cover['note']}" in " ".join(page.split()) and cover["note"] in text


def test_a_trace_covering_the_whole_run_gives_no_warning(tmp_path):
    rows = "".join(f"{u},{r},{int(u >= 5)}\n" for r in range(2) for u in range(60))
    path = _trace(tmp_path, "user,round,available\n" + rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = _run_trace(path, tmp_path)
    assert [r["survivors"] for r in result.metrics["rounds"]] == [55, 55]


@pytest.mark.parametrize(
    "protocol,options,rounds",
    [
        ("secure-sum", dict(SMALL, rounds=2), 2),
        ("square-wave", {"backend": "local", "users": 200, "cohorts": 2}, 1),
    ],
)
def test_an_outage_after_the_last_round_is_refused(tmp_path, protocol, options, rounds):
    """It used to never happen, silently."""
    with pytest.raises(rayfed.ConfigError) as err:
        rayfed.run(
            protocol,
            out_dir=str(tmp_path / "runs"),
            population={"outage": [1, 2], "outage_start": rounds},
            **options,
        )
    assert err.value.field == "population.outage_start"
    assert f"this run has {rounds} round(s), 0..{rounds - 1} (0-based)" in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_trace_values_from_parquet_are_checked_too(tmp_path):
    path = tmp_path / "trace.parquet"
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"user": [0, 1], "round": [0, 0], "available": [1.0, float("nan")]}), path
    )
    with pytest.raises(rayfed.ConfigError, match="trace's available"):
        Trace.read(path)
    pacsv.write_csv(pa.table({"user": [0], "round": [0], "available": [True]}), tmp_path / "t.csv")
    assert Trace.read(tmp_path / "t.csv").available.tolist() == [True]


@pytest.mark.parametrize("p0", [["a", "y"], ["y"]])
def test_vfl_regression_refuses_its_label_among_the_features(tmp_path, p0):
    """It used to learn y from y and report 'loss / OPT 6.5e26'."""
    path = tmp_path / "rows.csv"
    gen = np.random.default_rng(3)
    a = gen.normal(0, 0.2, (40, 2))
    pacsv.write_csv(pa.table({"a": a[:, 0], "b": a[:, 1], "y": np.clip(a.sum(1), -1, 1)}), path)
    with pytest.raises(rayfed.ConfigError) as err:
        rayfed.run(
            "vfl-primitives",
            backend="local",
            out_dir=str(tmp_path / "runs"),
            task="regression",
            label="y",
            sketch_size=8,
            data={"path": str(path), "columns": {"p0": p0, "p1": ["b"]}},
        )
    assert err.value.field == "label"
    assert "the label column 'y' is also a feature (data.columns.p0)" in str(err.value)
    assert "drop 'y' from data.columns.p0" in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_cohorts_above_the_users_are_stated_and_recorded_as_used(tmp_path, capsys):
    """federated-mf users=20 cohorts=50 ran 20 cohorts while the manifest said only 50."""
    from rayfed.cli import main

    code = main(
        ["run", "federated-mf", "--backend", "local", "--out", str(tmp_path), "--quiet"]
        + ["--set", "users=20", "--set", "items=30", "--set", "iterations=2"]
        + ["--set", "cohorts=50"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("cohorts=50 asked, 20 used: 20 users, at least one per cohort") == 1
    (manifest,) = tmp_path.glob("*/manifest.json")
    record = json.loads(manifest.read_text())
    assert record["adjusted"] == [
        {"option": "cohorts", "asked": 50, "used": 20, "why": "20 users, at least one per cohort"}
    ]
    assert record["config"]["protocol"]["cohorts"] == 50  # what was asked stays the config
    assert sorted(record["members"]["cohorts"]) == sorted(f"c{i}" for i in range(20))


@pytest.mark.parametrize(
    "protocol,options,used",
    [
        ("secure-sum", {"users": 12, "dim": 2, "cohorts": 15}, 12),
        (
            "secure-sum",
            {"users": 12, "dim": 2, "cohorts": 15, "dp_mechanism": "gaussian", "epsilon": 1.0},
            12,
        ),
        ("square-wave", {"users": 4, "cohorts": 9}, 4),
    ],
)
def test_every_clamped_cohort_count_is_recorded(protocol, options, used):
    from rayfed.api import _reconcile, resolve

    proto, run_opts, cfg = resolve(protocol, backend="local", out_dir=None, **options)
    cfg, run_opts = _reconcile(proto, cfg, run_opts)
    plan = proto.plan(cfg, 0)
    assert [(a["option"], a["asked"], a["used"]) for a in plan.adjusted] == [
        ("cohorts", options["cohorts"], used)
    ]
    assert len(plan.cohorts) == used


def test_records_above_the_bundled_digits_are_recorded_as_used():
    from rayfed.api import resolve

    proto, run_opts, cfg = resolve("ldp-bitvector", backend="local", records=5000)
    plan = proto.plan(cfg, 0)
    assert plan.adjusted == [
        {
            "option": "records",
            "asked": 5000,
            "used": 1797,
            "why": "the bundled digits hold 1,797 records",
        }
    ]
    _, _, cfg = resolve("ldp-bitvector", backend="local", records=300)
    assert proto.plan(cfg, 0).adjusted == []


def test_square_wave_headline_counts_the_reports_that_arrived():
    """dropout=0.999 used to read 'distribution of 2,000 users' when 2 reports arrived."""
    result = rayfed.run(
        "square-wave", backend="local", out_dir=None, users=2000, dropout=0.999, cohorts=2
    )
    reports = result.metrics["reports"][0]
    assert 0 < reports < 20
    assert f"distribution of the {reports} reports that arrived of 2,000 users asked" in (
        result.headline
    )
    assert "of 2,000 users at" not in result.headline
    full = rayfed.run("square-wave", backend="local", out_dir=None, users=2000, cohorts=2)
    assert "256-bucket distribution of 2,000 users at ε=1" in full.headline


def test_square_wave_moment_headline_counts_the_reports_that_arrived():
    result = rayfed.run(
        "square-wave",
        backend="local",
        out_dir=None,
        users=2000,
        dropout=0.5,
        cohorts=2,
        method="sr",
        moments="both",
    )
    arrived = sum(result.metrics["reports"])
    assert 800 < arrived < 1200
    assert result.headline.endswith(
        f"from the {arrived:,} reports that arrived of 2,000 users asked"
    )


def test_federated_mf_headline_says_how_many_users_reported_under_dropout():
    options = dict(backend="local", out_dir=None, users=200, items=30, iterations=3, cohorts=2)
    result = rayfed.run("federated-mf", dropout=0.3, omega=0.5, **options)
    u1 = [row["u1"] for row in result.metrics["iterations"]]
    assert max(u1) < 200
    span = f"{min(u1)}" if min(u1) == max(u1) else f"{min(u1)} to {max(u1)}"
    assert f"(200 users, 30 items); {span} of the 200 users reported per iteration" in (
        result.headline
    )
    assert "reported per iteration" not in rayfed.run("federated-mf", **options).headline


def test_latency_trace_without_latencies_is_refused(tmp_path):
    """latency=trace on a trace without latency_s used to replay nothing, silently."""
    path = _trace(tmp_path, "user,round,available\n0,0,1\n1,0,0\n")
    with pytest.raises(rayfed.ConfigError) as err:
        _run_trace(path, tmp_path, latency="trace")
    assert err.value.field == "population.trace" and "records none" in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_the_cli_states_a_partial_trace_in_one_line(tmp_path, capsys):
    from rayfed.cli import main

    path = _trace(tmp_path, "user,round,available\n0,0,0\n1,0,0\n900,0,0\n")
    code = main(
        ["run", "secure-sum", "--backend", "local", "--out", str(tmp_path / "runs"), "--quiet"]
        + ["--set", "users=60", "--set", "dim=2", "--set", "rounds=2"]
        + ["--set", "population.availability=trace", "--set", f"population.trace={path}"]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert captured.err.startswith(
        "rayfed: warning: population.trace covers 2 of the run's 120 (user, round) pairs"
    )
    assert "RuntimeWarning" not in captured.err and "survivors 58/60, 60/60" in captured.out
