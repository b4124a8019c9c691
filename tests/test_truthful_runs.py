"""A run reports what happened (issue 28): every round's survivors and lost members, the fate of
every member that died, every round's sum, an injected death not echoed as Ray's crash report,
and messages that name what they mean."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import rayfed
from rayfed.cli import main
from rayfed.errors import BelowThreshold

SMALL = ["--set", "users=200", "--set", "dim=2", "--set", "cohorts=4", "--quiet"]


def _run_dir(out: str) -> Path:
    line = next(x for x in out.splitlines() if x.strip().startswith("output:"))
    return Path(line.split("output:")[1].strip())


def test_secure_sum_over_two_rounds_reports_each_round_and_the_lost_cohort(tmp_path, capsys):
    """The done-when case, small: c1 (50 of 200 users) dies in round 0 and is back in round 1.
    The summary, the manifest and the tables say so; the headline does not pass the last round
    off as the run's."""
    code = main(
        ["run", "secure-sum", "--backend", "local", "--out", str(tmp_path)]
        + SMALL
        + ["--set", "rounds=2", "--fail", "cohort=c1@round=0"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "round 0: survivors 150, dropouts 50, lost c1" in out
    assert "round 1: survivors 200, dropouts 0" in out
    assert "cohort c1, 50 users died in round 0 at advertise: resumed (back in round 1" in out
    assert "survivors 150/200, 200/200 (rounds 0-1): EXACT in every round" in out
    assert "sum of 200/200" not in out
    run_dir = _run_dir(out)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (loss,) = manifest["metrics"]["losses"]
    assert (loss["round"], loss["phase"], loss["member"], loss["users"]) == (
        0,
        "advertise",
        "c1",
        50,
    )
    assert (loss["fate"], loss["back_round"]) == ("resumed", 1)
    assert [r["lost"] for r in manifest["metrics"]["per_round"]] == [["c1"], []]
    assert [r["survivors"] for r in manifest["metrics"]["per_round"]] == [150, 200]
    lost = pq.read_table(run_dir / "lost.parquet").to_pylist()
    assert [(x["member"], x["fate"]) for x in lost] == [("c1", "resumed")]
    from rayfed import report

    report.report(run_dir)  # the page says it too
    page = (run_dir / "report.html").read_text()
    assert "round 0: survivors 150, dropouts 50, lost c1" in page
    assert "cohort c1, 50 users died in round 0 at advertise: resumed" in page


def test_secure_sum_keeps_every_rounds_sum():
    """The sums table holds each round's secure sum, each equal to its own clipped reference
    (round 0 lacks c1's users, so its sum differs from round 1's); the sum table stays the last
    round's."""
    result = rayfed.run(
        "secure-sum",
        backend="local",
        out_dir=None,
        users=200,
        dim=3,
        cohorts=4,
        rounds=2,
        fail=["cohort=c1@round=0"],
    )
    sums = result.tables["sums"].to_pandas()
    assert sorted(sums["round"].unique()) == [0, 1]
    for r in (0, 1):
        part = sums[sums["round"] == r]
        assert np.array_equal(part["secure_sum"], part["clipped_sum"])
    first = sums[sums["round"] == 0]["secure_sum"].to_numpy()
    last = sums[sums["round"] == 1]["secure_sum"].to_numpy()
    assert not np.array_equal(first, last)
    assert np.array_equal(last, result.tables["sum"].column("secure_sum").to_numpy())


def test_a_cohort_that_never_answers_again_is_not_reported():
    """One round: c1 dies at unmask and is restarted, but nothing is asked of it again."""
    result = rayfed.run(
        "secure-sum",
        backend="local",
        out_dir=None,
        users=200,
        dim=2,
        cohorts=4,
        fail=["cohort=c1@phase=unmask"],
    )
    (loss,) = result.metrics["losses"]
    assert (loss["member"], loss["phase"], loss["fate"]) == ("c1", "unmask", "not reported")
    assert "not asked again before the run ended" in result.summary()


def test_a_cohort_dead_for_good_is_listed_once():
    """federated-mf, lost_users=dropouts: c1 dies in iteration 0 and stays dead; the later calls
    that fail on it do not add deaths."""
    result = rayfed.run(
        "federated-mf",
        backend="local",
        out_dir=None,
        users=300,
        items=40,
        iterations=2,
        cohorts=4,
        secagg_mode="dealer",
        pretrain_steps=2,
        finetune_steps=1,
        lost_users="dropouts",
        fail=["cohort=c1@phase=masked_input"],
    )
    (loss,) = result.metrics["losses"]
    assert (loss["member"], loss["round"], loss["fate"]) == ("c1", 0, "dropped for good")
    assert "dropped for good" in result.summary()


def test_an_abort_names_the_minimum_survivors_not_the_shamir_threshold():
    with pytest.raises(BelowThreshold) as err:
        rayfed.run(
            "secure-sum",
            backend="local",
            out_dir=None,
            users=200,
            dim=2,
            cohorts=2,
            fail=["cohort=c1@round=0"],
        )
    text = str(err.value)
    assert "100 participants alive, below the minimum survivors (140)" in text
    assert "threshold is" not in text


def test_an_injected_death_is_not_echoed_as_rays_crash_report(ray_cluster, capfd):
    """Ray's driver prints a worker's unexpected exit ("A worker died ... OOM killer ...") on
    stdout; a death rayfed injected is reported by the run, so that text is muted for it."""
    result = rayfed.run(
        "secure-sum", out_dir=None, users=60, dim=2, cohorts=4, fail=["cohort=c1@round=0"]
    )
    assert result.metrics["losses"][0]["member"] == "c1"
    time.sleep(3)  # Ray's error listener prints asynchronously
    captured = capfd.readouterr()
    assert "A worker died" not in captured.out + captured.err


MF = dict(
    users=300,
    items=40,
    iterations=2,
    cohorts=4,
    secagg_mode="dealer",
    pretrain_steps=3,
    finetune_steps=2,
    out_dir=None,
)


@pytest.fixture(scope="module")
def mf_clean():
    return rayfed.run("federated-mf", backend="local", **MF)


@pytest.mark.parametrize(
    "backend,phase", [("local", "finetune"), ("local", "evaluate"), ("ray", "finetune")]
)
def test_a_cohort_lost_after_training_is_resumed_with_stage_3(backend, phase, mf_clean, request):
    """lost_users=resume (the default): a cohort killed in Stage 3 or in the evaluation is
    restored from its checkpoint and the phase re-run, so the test MSE is the clean run's (it used
    to leave Stage 3 out, or leave the users out under a note saying lost_users=dropouts); the
    headline says what happened."""
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    result = rayfed.run("federated-mf", backend=backend, fail=[f"cohort=c1@phase={phase}"], **MF)
    assert result.metrics["test_mse"] == mf_clean.metrics["test_mse"]
    assert f"cohort c1 died at {phase}: restored from its checkpoint" in result.headline
    assert not any("lost_users=dropouts" in note for note in result.privacy.notes)
    (loss,) = result.metrics["losses"]
    assert (loss["fate"], loss["back_phase"]) == ("resumed", phase)


def test_a_cohort_lost_at_evaluation_as_dropouts_is_stated_missing(mf_clean):
    result = rayfed.run(
        "federated-mf",
        backend="local",
        lost_users="dropouts",
        fail=["cohort=c1@phase=evaluate"],
        **MF,
    )
    assert result.metrics["test_mse"] != mf_clean.metrics["test_mse"]
    assert "cohort c1 died at evaluate: its users are not in the test MSE" in result.headline
    assert any("lost for good (lost_users=dropouts)" in n for n in result.privacy.notes)


def test_a_misspelt_fail_phase_is_a_configuration_error(tmp_path, capsys):
    """It used to be a warning after the whole run (exit 0), which then passed for one with a
    fault; now it is refused before anything starts, with the protocol's phases."""
    code = main(
        ["run", "secure-sum", "--backend", "local", "--out", str(tmp_path)]
        + SMALL
        + ["--fail", "cohort=c1@phase=masked_inptu"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "fail: secure-sum has no phase 'masked_inptu'" in err and "masked_input" in err
    assert list(tmp_path.iterdir()) == []


# --- messages -------------------------------------------------------------------------------------
def test_a_missing_trace_file_is_named_as_the_trace():
    with pytest.raises(rayfed.ConfigError) as err:
        rayfed.run(
            "secure-sum",
            backend="local",
            out_dir=None,
            users=60,
            population={"availability": "trace", "trace": "/no/such/trace.csv"},
        )
    assert err.value.field == "population.trace" and "does not exist" in str(err.value)


def test_a_directory_as_data_is_named_a_directory(tmp_path):
    with pytest.raises(rayfed.ConfigError) as err:
        rayfed.run("federated-mf", backend="local", out_dir=None, data={"path": str(tmp_path)})
    assert err.value.field == "data.path" and "is a directory, not a file" in str(err.value)
    assert "suffix" not in str(err.value)


def test_the_python_api_takes_numpy_numbers_and_paths(tmp_path):
    result = rayfed.run(
        "secure-sum",
        backend="local",
        out_dir=tmp_path,
        users=np.int64(60),
        dim=np.int32(2),
        clip=np.float32(0.5),
        seed=np.int64(3),
        allow_weak_params=np.bool_(False),
    )
    assert result.config["protocol"]["users"] == 60 and result.config["run"]["seed"] == 3
    assert result.config["protocol"]["clip"] == 0.5
    assert Path(result.run_dir).parent == tmp_path
    manifest = json.loads((Path(result.run_dir) / "manifest.json").read_text())
    assert manifest["config"]["run"]["out_dir"] == str(tmp_path)


def test_weak_parameters_are_stated_in_the_summary():
    """allow_weak_params with t = 1: the security bound (above 2^0) used to be in the manifest
    only."""
    result = rayfed.run(
        "secure-sum",
        backend="local",
        out_dir=None,
        users=60,
        dim=2,
        threshold=1,
        allow_weak_params=True,
    )
    bound = result.metrics["log2_security_failure"]
    assert bound > 0
    assert f"WEAK PARAMETERS (allow_weak_params): log2 P[security failure] = {bound:+.2f}" in (
        result.summary()
    )
    assert "guarantees nothing" in result.summary()


def test_test_fractions_help_and_check_agree(capsys):
    from rayfed.cli import protocol_help

    assert "held-out fraction of each user's ratings [float (> 0 and < 1)" in " ".join(
        protocol_help("federated-mf").split()
    )
    assert main(["run", "federated-mf", "--backend", "local", "--set", "test_fraction=1"]) == 2
    assert "test_fraction: 1.0 is out of range (allowed: > 0 and < 1)" in capsys.readouterr().err


def test_usage_lines_document_fail_seed_backend_and_rates(capsys):
    from rayfed.cli import build_parser, protocol_help

    assert "[--fail SPEC ...]" in protocol_help("secure-sum").splitlines()[0]
    stress_help = " ".join(
        build_parser()._subparsers._group_actions[0].choices["stress"].format_help().split()
    )
    assert (
        "--rates RATES comma-separated dropout rates (default 0,0.1,0.2,0.3,0.4,0.5); ignored with --sweep"
        in stress_help
    )
    assert "--seed SEED root seed (default 0)" in stress_help
    assert "--backend {ray,local} ray (default) or local" in stress_help


def test_square_wave_moments_record_each_rounds_reports_and_losses():
    """Two rounds (mean, then variance): each round's reports and the cohort lost in round 1."""
    result = rayfed.run(
        "square-wave",
        backend="local",
        out_dir=None,
        users=4000,
        cohorts=4,
        method="sr",
        moments="both",
        lost_users="dropouts",
        fail=["cohort=c1@phase=perturb-variance"],
    )
    rows = result.metrics["per_round"]
    assert [r["lost"] for r in rows] == [[], ["c1"]]
    assert rows[1]["reports"] < rows[0]["reports"]
    assert [r["reports"] for r in rows] == [
        result.metrics["reports"][0],
        result.metrics["reports"][1],
    ]
    assert "round 1: reports" in result.summary() and "lost c1" in result.summary()


def test_a_cohort_that_dies_again_after_its_restart_has_both_deaths_listed():
    result = rayfed.run(
        "square-wave",
        backend="local",
        out_dir=None,
        users=4000,
        cohorts=4,
        fail=["cohort=c1@phase=perturb", "cohort=c1@phase=perturb"],
    )
    assert [x["fate"] for x in result.metrics["losses"]] == ["died again", "dropped for good"]
    assert "restarted, and died again before it answered" in result.summary()


def test_an_out_that_is_a_file_is_a_named_error_and_nothing_is_written(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("keep me\n")
    for out in (target, target / "below"):  # the file itself, and a directory under it
        code = main(["run", "secure-sum", "--backend", "local", "--out", str(out), *SMALL])
        err = capsys.readouterr().err
        assert code == 2
        assert f"configuration error: out_dir: {str(target)!r} is a file, not a directory" in err
    assert target.read_text() == "keep me\n" and sorted(tmp_path.iterdir()) == [target]


def test_a_signal_while_the_run_directory_is_made_leaves_it_interrupted(tmp_path, monkeypatch):
    """Ctrl-C landing in the first manifest write: the directory exists, and it says
    ``interrupted`` (never ``running`` forever, nor an empty directory)."""
    from rayfed.rundir import RunDir

    write = RunDir.write_manifest
    calls = []

    def interrupted_first(self, manifest):
        calls.append(manifest["status"])
        if len(calls) == 1:
            raise KeyboardInterrupt
        write(self, manifest)

    monkeypatch.setattr(RunDir, "write_manifest", interrupted_first)
    with pytest.raises(KeyboardInterrupt):
        rayfed.run("secure-sum", backend="local", out_dir=str(tmp_path), users=200, cohorts=4)
    (run_dir,) = tmp_path.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert calls == ["running", "interrupted"]
    assert manifest["status"] == "interrupted"
    assert manifest["interrupted"]["phase"] == "start"
    assert (manifest["interrupted"]["round"], manifest["interrupted"]["rounds_finished"]) == (
        None,
        0,
    )
    from rayfed.report import report

    page = report(run_dir)[-1].read_text()
    assert "<b>interrupted</b> by SIGINT while starting the federation. No result" in page


def test_an_aborted_run_names_the_members_whose_death_aborted_it(tmp_path, capsys):
    """Two cohorts: c1's death leaves half the users, below the minimum survivors. The error is
    followed by the lost cohort, and the failed manifest lists it."""
    args = ["run", "secure-sum", "--backend", "local", "--out", str(tmp_path), "--quiet"]
    args += ["--set", "users=200", "--set", "dim=2", "--set", "cohorts=2"]
    assert main([*args, "--fail", "cohort=c1@round=0"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("rayfed: BelowThreshold: round 0, phase 'advertise': 100 participants")
    assert err[1].startswith("  lost:    cohort c1, 100 users died in round 0 at advertise: ")
    (run_dir,) = tmp_path.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert [(x["member"], x["users"], x["round"]) for x in manifest["losses"]] == [("c1", 100, 0)]
