"""rayfed report: plots and HTML from a run directory; --compare; per-round values."""

from __future__ import annotations

import json

import pytest

import rayfed
from rayfed.cli import main
from rayfed.errors import ConfigError
from rayfed.report import bytes_by_round, compare, load, privacy_series, report

SMALL = dict(users=60, dim=4, cohorts=2, backend="local")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    secure = rayfed.run("secure-sum", rounds=2, out_dir=str(out), **SMALL)
    kmeans = [
        rayfed.run("hfl-kmeans", backend="local", out_dir=str(out), users=600, k=3, seed=s)
        for s in (0, 1)
    ]
    return secure, kmeans


def test_protocols_record_per_round_values(runs):
    secure, _ = runs
    per_round = secure.metrics["per_round"]
    assert [r["round"] for r in per_round] == [0, 1]
    assert all(r["survivors"] + r["dropouts"] == 60 for r in per_round)


def test_report_writes_readable_plots_and_a_page(runs):
    _, (kmeans, _) = runs
    written = report(kmeans.run_dir)
    names = {p.name for p in written}
    assert names == {"privacy.png", "timings.png", "bytes.png", "report.html"}
    assert all(p.stat().st_size > 10_000 for p in written if p.suffix == ".png")
    page = (written[-1]).read_text()
    assert kmeans.headline.split(";")[0] in page
    assert "ε-DP towards every client" in page  # the ledger's statement
    assert page.count("<img") == 3


def test_privacy_series_follows_the_ledger(runs):
    _, (kmeans, _) = runs
    run = load(kmeans.run_dir)
    rounds, eps = privacy_series(run)
    assert rounds == list(range(1, kmeans.metrics["t_max"] + 1))
    assert eps[-1] == pytest.approx(kmeans.privacy.epsilon)
    assert eps == sorted(eps)
    sent = bytes_by_round(run)
    assert set(sent) == {"coordinator", "parties"}
    assert sum(sum(v.values()) for v in sent.values()) == kmeans.transcript_totals["bytes"]


def test_report_of_cohorts_plots_dropouts(runs):
    secure, _ = runs
    written = report(secure.run_dir)
    assert "rounds.png" in {p.name for p in written}
    assert set(bytes_by_round(load(secure.run_dir))) == {"coordinator", "cohorts"}


def test_compare_puts_runs_side_by_side(runs, tmp_path):
    secure, kmeans = runs
    written = compare([k.run_dir for k in kmeans] + [secure.run_dir], tmp_path / "cmp")
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert {p.name for p in written} >= {"privacy.png", "bytes.png", "compare.html"}
    for result in [*kmeans, secure]:
        assert result.run_id[-6:] in page
    assert "wcss" in page and "per_round" not in page  # scalar metrics only


def test_cli_report_and_bad_directories(runs, tmp_path, capsys):
    _, (kmeans, other) = runs
    assert main(["report", kmeans.run_dir, "--out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "report.html").exists()
    assert main(["report", "--compare", kmeans.run_dir, other.run_dir, "--out", str(tmp_path)]) == 0
    with pytest.raises(ConfigError) as err:
        load(tmp_path / "nowhere")
    assert err.value.field == "run_dir"
    running = tmp_path / "running"
    running.mkdir()
    (running / "manifest.json").write_text(json.dumps({"run_id": "x", "status": "running"}))
    with pytest.raises(ConfigError):
        load(running)
    with pytest.raises(ConfigError):
        compare([kmeans.run_dir], tmp_path / "c")
    assert main(["report"]) == 2


def test_a_failed_run_is_reported_with_its_error(tmp_path):
    with pytest.raises(rayfed.PartyFailed):
        rayfed.run(
            "hfl-kmeans", backend="local", out_dir=str(tmp_path), users=600, k=3,
            fail=["party=p1@round=2"],
        )  # fmt: skip
    (run_dir,) = tmp_path.iterdir()
    page = report(run_dir)[-1].read_text()
    assert "failed:" in page and "PartyFailed" in page
