"""``rayfed stress`` keeps its results: each point on disk as it finishes, resumable, unique
directories under concurrency, a progress bar, named errors for bad input, and every protocol's
stress path in every setting it accepts (small, fast parameters, in-process)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rayfed import stress as stress_mod
from rayfed.cli import main
from rayfed.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SMALL_SUM = ["--set", "users=20", "--set", "dim=2"]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rayfed.cli", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _record(path: Path) -> dict:
    return json.loads((path / "stress.json").read_text())


# --- named errors, before anything is written -----------------------------------------------------
@pytest.mark.parametrize(
    ("rates", "says"),
    [
        ("abc", "'abc' in 'abc' is not a number"),
        ("0,,0.1", "an empty rate in '0,,0.1'"),
        ("0,1.5", "must lie in [0, 1], got 1.5"),
        ("nan", "must lie in [0, 1], got nan"),
        ("-0.1", "must lie in [0, 1], got -0.1"),
    ],
)
def test_bad_rates_are_named_errors_and_write_nothing(tmp_path, capsys, rates, says):
    args = ["stress", "secure-sum", "--backend", "local", *SMALL_SUM, "--rates", rates]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rayfed: configuration error: --rates: ") and says in err
    assert not (tmp_path / "out").exists()


def test_a_rate_the_protocol_refuses_names_the_rates(tmp_path, capsys):
    """square-wave's dropout is below 1 (secure-sum's may be 1: every user lost, an abort)."""
    args = ["stress", "square-wave", "--backend", "local", "--rates", "0,1"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("rayfed: configuration error: --rates: rate 1: ")
        and "(allowed: >= 0 and < 1)" in err
    )
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_a_named_error(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("keep me\n")
    args = ["stress", "secure-sum", "--backend", "local", *SMALL_SUM, "--rates", "0"]
    assert main([*args, "--out", str(target)]) == 2
    assert f"--out: {str(target)!r} is a file, not a directory" in capsys.readouterr().err
    assert target.read_text() == "keep me\n" and sorted(tmp_path.iterdir()) == [target]
    assert main([*args, "--out", str(target / "below")]) == 2  # a directory under a file
    assert f"--out: {str(target)!r} is a file, not a directory" in capsys.readouterr().err


def test_out_that_is_read_only_is_a_named_error(tmp_path, capsys):
    """/sys refuses new directories even to root (whom chmod does not stop)."""
    args = ["stress", "secure-sum", "--backend", "local", *SMALL_SUM, "--rates", "0"]
    assert main([*args, "--out", "/sys/rayfed-stress"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: --out: cannot create the stress directory under" in err
    assert not Path("/sys/rayfed-stress").exists()


def test_federated_mf_vfl_dropout_sweep_is_refused_before_it_runs(tmp_path, capsys):
    args = ["stress", "federated-mf", "--backend", "local", "--set", "setting=vfl"]
    started = time.perf_counter()
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--sweep OPTION=V1,V2,..." in err and "only setting=lfl has (got setting=vfl)" in err
    assert err.startswith("rayfed: configuration error: setting: ")
    assert list(tmp_path.iterdir()) == [] and time.perf_counter() - started < 5


def test_a_bad_sweep_value_is_refused_before_any_point_runs(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(stress_mod, "_repeat", lambda *a: ran.append(a))
    with pytest.raises(ConfigError, match="population.markov_off"):
        stress_mod.stress(
            "secure-sum",
            {"backend": "local", "users": 20, "dim": 2},
            ["population.availability=markov"],
            out_dir=tmp_path,
            sweep=("population.markov_off", ["0.1", "7"]),
            reps=1,
        )
    assert ran == [] and list(tmp_path.iterdir()) == []


# --- every protocol's stress path, every setting it accepts -----------------------------------------
SETTINGS = [
    *(("square-wave", {"method": m, "users": 2000}, None) for m in ("sw-ems", "cfo", "hh", "pm")),
    *(("square-wave", {"method": m, "users": 2000}, None) for m in ("sw-em", "hh-admm")),
    *(("square-wave", {"method": m, "users": 2000}, None) for m in ("haar-hrr", "sr")),
    *(
        ("secure-sum", {"mode": m, "users": 20, "dim": 2}, None)
        for m in ("secure", "simulation", "dealer", "plain")
    ),
    *(
        ("federated-mf", {"method": m, "users": 60, "items": 12, "iterations": 1}, None)
        for m in ("ldp", "stage1", "central")
    ),
    *(
        (
            "federated-mf",
            # rdp: PLD's calibration takes 20 s here
            {"setting": s, "users": 60, "items": 12, "iterations": 1, "accountant": "rdp"},
            "epsilon",
        )
        for s in ("vfl", "hfl")
    ),
]


@pytest.mark.parametrize(
    ("protocol", "options", "sweep"),
    SETTINGS,
    ids=[f"{p}-{o.get('method') or o.get('mode') or o.get('setting')}" for p, o, _ in SETTINGS],
)
def test_every_stress_path_runs_in_every_setting(tmp_path, protocol, options, sweep):
    """(federated-mf gd-dr: tests/test_federated_mf_gddr.py; the secure-sum, square-wave and LFL
    sweeps: their protocols' tests.)"""
    kwargs = {"sweep": (sweep, ["0.5", "1"]), "reps": 1} if sweep else {"rates": [0.0, 0.2]}
    path = stress_mod.stress(
        protocol, {**options, "backend": "local"}, [], out_dir=tmp_path, **kwargs
    )
    record = _record(path)
    rows = record["rows"]
    assert record["status"] == "complete" and record["points_finished"] == record["points"]
    assert pq.read_table(path / "stress.parquet").num_rows == len(rows) == record["points"]
    assert (path / "stress.png").stat().st_size > 10_000
    if sweep:
        assert [r["value"] for r in rows] == ["0.5", "1"]
        # the ε each point spent: its own target at most (the calibration rounds down)
        assert [r["epsilon"] for r in rows] == pytest.approx([0.5, 1.0], rel=1e-3)
        assert all(r["epsilon"] <= float(r["value"]) * (1 + 1e-9) for r in rows)
        assert all(r["test_mse"] > 0 for r in rows)
    elif protocol == "secure-sum":
        assert [r["dropout"] for r in rows[:2]] == [0.0, 0.2]
        for row in rows:
            if row["expected"] in ("complete", "aborted"):
                assert row["outcome"] == row["expected"], row
    else:
        assert [r["dropout"] for r in rows] == [0.0, 0.2]
        assert all(r["outcome"] == "complete" for r in rows)
    from rayfed.cli import _stress_line

    assert all(_stress_line(r) for r in rows)  # the terminal's table of every row


# --- durable, resumable, concurrent ---------------------------------------------------------------
def test_each_point_is_on_disk_as_it_finishes_and_a_rerun_resumes(tmp_path, monkeypatch, capsys):
    """Interrupted at the third run: the two finished points are in points.jsonl, the Parquet and
    the JSON (status interrupted); the same command again runs only the points left, says so, and
    ends with every point once."""
    calls: list[str] = []
    real = stress_mod._attempt

    def attempt(scenario, value, *rest):
        calls.append(f"{scenario}={value}")
        if len(calls) == 3 and interrupt:
            raise KeyboardInterrupt
        return real(scenario, value, *rest)

    monkeypatch.setattr(stress_mod, "_attempt", attempt)
    args = ["secure-sum", {"backend": "local", "users": 20, "dim": 2}, []]
    interrupt = True
    with pytest.raises(KeyboardInterrupt) as info:
        stress_mod.stress(*args, rates=[0.0, 0.1, 0.2], out_dir=tmp_path)
    (path,) = tmp_path.iterdir()
    assert info.value.stress_dir == (path, 2, 9)
    record = _record(path)
    assert (record["status"], record["points_finished"], record["points"]) == ("interrupted", 2, 9)
    assert [r["dropout"] for r in record["rows"]] == [0.0, 0.1]
    lines = (path / "points.jsonl").read_text().splitlines()
    assert [json.loads(line)["point"] for line in lines] == ["rate=0.0", "rate=0.1"]
    assert pq.read_table(path / "stress.parquet").column("dropout").to_pylist() == [0.0, 0.1]
    assert main(["report", str(path)]) == 0  # the page says it is unfinished
    page = (path / "report.html").read_text()
    assert "<b>interrupted</b>: 2 of 9 points finished" in page and page.count("<tr>") == 1 + 2 + 2

    interrupt, calls[:] = False, []
    assert stress_mod.stress(*args, rates=[0.0, 0.1, 0.2], out_dir=tmp_path) == path
    assert "resuming" in capsys.readouterr().err and calls[0] == "rate=0.2" and len(calls) == 7
    record = _record(path)
    assert record["status"] == "complete" and record["points_finished"] == 9
    assert [r["dropout"] for r in record["rows"][:3]] == [0.0, 0.1, 0.2]
    assert len((path / "points.jsonl").read_text().splitlines()) == 9
    # another sweep (other rates) is not this one's resumption; --fresh starts anew either way
    other = stress_mod.stress(*args, rates=[0.3], out_dir=tmp_path, resume=False)
    assert other != path and _record(other)["status"] == "complete"


def test_two_runs_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101-000000")
    args = ["secure-sum", {"backend": "local", "users": 20, "dim": 2}, []]
    first = stress_mod.stress(*args, rates=[0.0], out_dir=tmp_path)
    second = stress_mod.stress(*args, rates=[0.0], out_dir=tmp_path)
    assert first != second and first.name.startswith("stress-secure-sum-20260101-000000-")
    assert _record(first)["status"] == _record(second)["status"] == "complete"


def test_a_stress_directory_another_process_holds_is_not_resumed(tmp_path):
    """A run still writing its directory holds its lock: the same command started beside it
    makes its own directory instead of resuming that one."""
    args = ["secure-sum", {"backend": "local", "users": 20, "dim": 2}, []]
    spec = {
        "protocol": "secure-sum",
        "options": args[1],
        "sets": [],
        "rates": [0.0],
        "sweep": None,
        "reps": 1,
    }
    held = stress_mod.StressDir.open(tmp_path, spec, resume=True)  # "running", lock held
    other = stress_mod.stress(*args, rates=[0.0], out_dir=tmp_path)
    assert other != held.path and _record(held.path)["status"] == "running"
    held.finish([], "interrupted", None, 7)  # lock released: now it is resumable
    assert stress_mod.stress(*args, rates=[0.0], out_dir=tmp_path) == held.path


def test_three_concurrent_stress_runs_all_keep_their_results(tmp_path):
    """The issue's case: three `rayfed stress secure-sum` processes at once into one --out."""
    cmd = _cli(
        "stress",
        "secure-sum",
        "--backend",
        "local",
        *SMALL_SUM,
        "--sweep",
        "dropout=0",
        "--reps",
        "1",
    )
    procs = [
        subprocess.Popen(
            [*cmd, "--out", str(tmp_path)],
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    dirs = sorted(tmp_path.iterdir())
    assert len(dirs) == 3
    for path in dirs:
        record = _record(path)
        assert record["status"] == "complete" and record["points_finished"] == 1
        assert pq.read_table(path / "stress.parquet").num_rows == 1
        assert record["rows"][0]["wrong_sums"] == 0 and record["rows"][0]["reps"] == 1
    assert sorted(out.splitlines()[-1].split()[-1] for out, _ in outs) == [str(d) for d in dirs]


def test_ctrl_c_keeps_the_finished_points_and_the_same_command_resumes(tmp_path):
    """SIGINT once the first point is on disk: exit 130, one line naming what was kept, no
    traceback; the finished points stay; the same command again finishes the rest."""
    cmd = [
        *_cli("stress", "secure-sum", "--backend", "local", "--set", "users=60", "--set", "dim=4"),
        *("--rates", "0,0.1,0.2", "--out", str(tmp_path)),
    ]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    until = time.monotonic() + 120
    while not list(tmp_path.glob("*/points.jsonl")) and time.monotonic() < until:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    (path,) = tmp_path.iterdir()
    record = _record(path)
    kept = record["points_finished"]
    assert record["status"] == "interrupted" and 1 <= kept < record["points"] == 9
    assert "Traceback" not in err
    assert f"rayfed: interrupted by SIGINT after {kept} of 9 points" in err
    assert pq.read_table(path / "stress.parquet").num_rows == kept
    again = subprocess.run(
        [*cmd, "--quiet"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180
    )
    assert again.returncode == 0, again.stderr
    assert f"resuming {path}: {kept} of 9 points already finished, skipped" in again.stderr
    record = _record(path)
    assert record["status"] == "complete" and len(record["rows"]) == 9
    points = [json.loads(x)["point"] for x in (path / "points.jsonl").read_text().splitlines()]
    assert len(points) == len(set(points)) == 9  # no point ran twice


def test_progress_bar_counts_points_and_reps(tmp_path, capsys):
    args = ["stress", "secure-sum", "--backend", "local", *SMALL_SUM, "--out", str(tmp_path)]
    assert main([*args, "--sweep", "dropout=0,0.1", "--reps", "2"]) == 0
    err = capsys.readouterr().err
    assert "stress secure-sum" in err and "4/4" in err and "dropout=0.1" in err
    assert main([*args, "--sweep", "dropout=0,0.1", "--reps", "2", "--quiet", "--fresh"]) == 0
    assert "stress secure-sum" not in capsys.readouterr().err


def test_a_secure_sum_sweep_row_says_what_its_percentage_counts(tmp_path, capsys):
    """secure-sum's dropout strikes after the masked input, so the dropped users are still in the
    sum: the row's percentage is of users missing from the sum, not the dropout asked."""
    args = ["stress", "secure-sum", "--backend", "local", *SMALL_SUM, "--reps", "1", "--quiet"]
    assert main([*args, "--sweep", "dropout=0.2", "--out", str(tmp_path)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("dropout=0.2")]
    assert re.search(r" not in the sum +0\.0 %  aborts 0/1 ", line), line


# --- what a row states: the finder's bound where it applies, the runs' randomness --------------
def test_the_finders_bound_is_stated_only_at_points_within_their_tolerated_dropout(
    tmp_path, capsys
):
    """The finder bounds P[abort] only while the dropout stays within tolerated_dropout (0.3 by
    default): at dropout=0.5 there is no bound (it read 'finder's bound 0.0e+00' beside 2/2
    aborts), and where tolerated_dropout itself is swept each point's own value decides."""
    args = ["stress", "secure-sum", "--backend", "local", "--set", "users=40", "--set", "dim=2"]
    args += ["--reps", "2", "--quiet", "--out", str(tmp_path)]
    assert main([*args, "--sweep", "dropout=0.1,0.5"]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("dropout=0.5")]
    assert "finder's bound: none at dropout 0.5" in line and "e+00" not in line
    (path,) = tmp_path.iterdir()
    low, high = _record(path)["rows"]
    assert (low["abort_bound_log2"], high["abort_bound_log2"]) == (float("-inf"), None)
    assert low["abort_bound"] == "P[abort] = 0 at dropout <= 0.3 (no round within it can abort)"
    assert high["aborts"] == 2 and high["abort_bound"] == (
        "none at dropout 0.5 (asked): the finder's bound holds at dropout <= 0.3 only"
    )
    swept = stress_mod.stress(
        "secure-sum", {"backend": "local", "users": 200, "dim": 2, "dropout": 0.2}, [],
        out_dir=tmp_path / "tolerated", sweep=("tolerated_dropout", ["0.1", "0.3"]), reps=1,
    )  # fmt: skip
    below, within = _record(swept)["rows"]
    assert below["abort_bound_log2"] is None and below["tolerated_dropout"] == 0.1
    assert "none at dropout 0.2 (asked)" in below["abort_bound"]
    assert -40 < within["abort_bound_log2"] < -29  # eta = 30 at n = 200
    assert within["abort_bound"] == (
        f"P[abort] <= {stress_mod.log2_text(within['abort_bound_log2'])} at dropout <= 0.3"
    )


def test_an_underflowed_bound_is_written_as_a_power_of_two():
    from rayfed.stress import abort_bound

    assert 2.0**-1100.4 == 0.0  # what the row used to hold
    assert (
        abort_bound(-1100.4, 0.3, 0.1)["abort_bound"] == "P[abort] <= 2^-1100.4 at dropout <= 0.3"
    )
    assert abort_bound(-30.0, 0.3, 0.1)["abort_bound"] == "P[abort] <= 2^-30 at dropout <= 0.3"


def test_an_lfl_rate_row_has_no_bound_above_omega():
    """LFL's rate rows: the bound holds at dropout <= omega only (the run's own options)."""
    from types import SimpleNamespace

    metrics = {
        "test_mse": 1.0, "skipped_iterations": [], "secagg_log2_abort_bound": -31.0,
        "tolerated_dropout": 0.3, "iterations": [{"skipped": False, "u1": 9, "u2": 9}],
    }  # fmt: skip

    def row(dropout):
        result = SimpleNamespace(
            metrics=metrics,
            privacy=SimpleNamespace(epsilon=1.0),
            config={"protocol": {"dropout": dropout, "population": {}}, "run": {"fail": None}},
        )
        return stress_mod.measure("federated-mf", result)

    assert row(0.2)["abort_bound_log2"] == -31.0
    assert row(0.5)["abort_bound_log2"] is None
    assert row(0.5)["abort_bound"].startswith("none at dropout 0.5")


def test_the_stress_page_states_the_randomness_the_runs_had(tmp_path):
    """secure-sum's mode=secure makes its runs secure: the record and the page say so (the page
    read 'seeded ... reproducible', built from the options), for a sweep and for the rates."""
    from rayfed.privacy.source import STATEMENTS
    from rayfed.report import report

    small = ["users=20", "dim=2", "mode=secure"]
    for kwargs in ({"sweep": ("dropout", ["0", "0.6"]), "reps": 1}, {"rates": [0.0, 0.6]}):
        path = stress_mod.stress(
            "secure-sum", {"backend": "local"}, small, out_dir=tmp_path, resume=False, **kwargs
        )
        page = report(path)[-1].read_text()
        assert "secure randomness: every noise draw" in page and "seeded randomness" not in page
        record = _record(path)
        assert {r["randomness"] for r in record["rows"]} == {"secure"}  # aborted ones too
        assert record["randomness"] == "secure"
        assert record["randomness_statement"] == STATEMENTS["secure"]
    seeded = stress_mod.stress(
        "secure-sum", {"backend": "local"}, ["users=20", "dim=2"], out_dir=tmp_path,
        rates=[0.0], resume=False,
    )  # fmt: skip
    assert _record(seeded)["randomness"] == "seeded"


def test_a_secure_sum_sweep_row_names_its_share_not_in_the_sum(tmp_path):
    """The sweep row's share is of users missing from the sum (not the dropout asked, which
    strikes after the masked input): 'not_in_sum' in stress.json, Parquet and report.html."""
    from rayfed.report import report

    path = stress_mod.stress(
        "secure-sum", {"backend": "local"}, ["users=20", "dim=2"], out_dir=tmp_path,
        sweep=("dropout", ["0.2"]), reps=1,
    )  # fmt: skip
    (row,) = _record(path)["rows"]
    assert "dropout" not in row and row["not_in_sum"] == 0.0  # all 20 inputs are in the sum
    assert 0 < row["observed_dropout"] < 1  # users lost at unmask, still summed
    table = pq.read_table(path / "stress.parquet")
    assert "not_in_sum" in table.column_names and "dropout" not in table.column_names
    page = report(path)[-1].read_text()
    assert "<th>not_<wbr>in_<wbr>sum</th>" in page and "<th>dropout</th>" not in page
