"""rayfed report: plots and HTML from a run directory; --compare; per-round values; the page as
honest as the terminal (its caveats, whole configuration, failed and interrupted runs), checked
in headless Chromium."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

import rayfed
from rayfed import report as report_module
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
    assert html.escape(kmeans.headline) in page
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


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory) -> Path:
    """The directory of a run that failed: party p1 dies in round 2."""
    out = tmp_path_factory.mktemp("failed")
    with pytest.raises(rayfed.PartyFailed):
        rayfed.run(
            "hfl-kmeans", backend="local", out_dir=str(out), users=600, k=3,
            fail=["party=p1@round=2"],
        )  # fmt: skip
    (run_dir,) = out.iterdir()
    return run_dir


def test_a_failed_run_is_reported_with_its_error(failed_run):
    run_dir = failed_run
    written = report(run_dir)
    page = written[-1].read_text()
    error = json.loads((run_dir / "manifest.json").read_text())["error"]
    assert error.startswith("PartyFailed: party 'p1' failed in round 2")
    # the status, how far it got and the error; no plot of what a failed run does not record
    assert (
        "<b>failed</b> in round 2, phase parties:assign-upload, after 2 finished round(s): "
        f"{html.escape(error)}. No result was kept." in page
    )
    assert [p.name for p in written] == ["privacy.png", "timings.png", "report.html"]
    assert not (run_dir / "bytes.png").exists()
    assert "None" not in _text(page)
    # what it charged before it failed: the clean run's charges of rounds 0-1 (its round 1 only)
    clean = rayfed.run("hfl-kmeans", backend="local", out_dir=None, users=600, k=3).privacy
    charged = json.loads((run_dir / "manifest.json").read_text())["privacy"]
    entries = clean.to_dict()["entries"]  # pure and equal per round: ε adds up
    before = [e for e in entries if e["round"] < 2]
    assert [(e["round"], e["label"]) for e in charged["entries"]] == [
        (e["round"], e["label"]) for e in before
    ]
    assert charged["epsilon"] == pytest.approx(clean.epsilon * len(before) / len(entries))
    line = f"privacy (charged by the time it failed): epsilon={charged['epsilon']:g}, delta=0 "
    assert line in " ".join(_text(page).split())


# --- the page as honest as the terminal ----------------------------------------------------------
def _text(page: str) -> str:
    """The page's text, tags dropped and entities decoded (what a reader sees)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def _summary_lines(result) -> list[str]:
    """Every caveat line of the terminal summary: the headline, the details, the privacy line,
    each privacy note and the noise line."""
    return [
        result.headline,
        *result.details,
        result.privacy.summary(),
        *result.privacy.notes,
        result.privacy.randomness_statement,
    ]


def test_the_page_carries_every_caveat_of_the_terminal(runs):
    secure, (kmeans, _) = runs
    for result in (secure, kmeans):
        text = _text(report(result.run_dir)[-1].read_text())
        assert result.privacy.randomness == "seeded"
        assert "holds only while that seed is secret" in result.privacy.randomness_statement
        for line in _summary_lines(result):
            assert line and line in text, line


@pytest.fixture
def captured(monkeypatch):
    """The figures the report draws, by file name, before they are saved and closed."""
    figures = {}

    def keep(fig, path):
        figures[Path(path).name] = fig
        fig.savefig(path, dpi=30)
        return path

    monkeypatch.setattr(report_module, "_save", keep)
    yield figures
    import matplotlib.pyplot as plt

    for fig in figures.values():
        plt.close(fig)


def test_log_axes_are_labelled_as_log(runs, tmp_path, captured):
    secure, _ = runs
    report(secure.run_dir, tmp_path)
    (ax,) = captured["bytes.png"].axes
    assert ax.get_yscale() == "log"
    assert ax.get_ylabel() == "bytes sent (log scale)"


def test_the_mf_learning_curve_shows_both_baselines(tmp_path, captured):
    from rayfed.protocols.federated_mf.lfl.report import METHOD_NAMES

    mf = rayfed.run(
        "federated-mf", backend="local", out_dir=str(tmp_path), users=100, items=10,
        iterations=2, pretrain_steps=5, finetune_steps=5, secagg_mode="dealer",
    )  # fmt: skip
    report(mf.run_dir, tmp_path / "out")
    (ax,) = [a for a in captured["rounds.png"].axes if a.get_title() == "test_mse"]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    stage1, central = mf.metrics["stage1_test_mse"], mf.metrics["central_test_mse"]
    assert lines[f"{METHOD_NAMES['stage1']}: {stage1:.4g}"] == [stage1, stage1]
    assert lines[f"{METHOD_NAMES['central']}: {central:.4g}"] == [central, central]
    assert lines["this run"] == [r["test_mse"] for r in mf.metrics["per_round"]]
    # the protocol names its baselines in the manifest; the report draws what it declares
    assert mf.metrics["baselines"] == {
        "stage1_test_mse": {"of": "test_mse", "label": METHOD_NAMES["stage1"]},
        "central_test_mse": {"of": "test_mse", "label": METHOD_NAMES["central"]},
    }


def test_a_metric_is_a_baseline_only_where_its_protocol_declares_it(runs):
    """report.baselines() labelled any scalar metric ``central_<x>`` beside a per-round value
    ``x`` "central non-private SGD", whatever the protocol; it reads the run's declaration now."""
    from rayfed.report import Run, baselines

    secure, _ = runs
    run = load(secure.run_dir)
    assert "survivors" in run.per_round[0]  # a per-round value of secure-sum
    metrics = {**run.manifest["metrics"], "central_survivors": 5, "stage1_survivors": 4}
    undeclared = Run(run.path, {**run.manifest, "metrics": metrics}, run.transcript)
    assert baselines(undeclared, "survivors") == []
    declared = {"central_survivors": {"of": "survivors", "label": "everyone online"}}
    metrics["baselines"] = declared
    declared_run = Run(run.path, {**run.manifest, "metrics": metrics}, run.transcript)
    assert baselines(declared_run, "survivors") == [("everyone online", 5.0)]
    assert baselines(declared_run, "test_mse") == []


def test_the_configuration_is_whole_and_lists_only_what_applies(runs, tmp_path):
    secure, _ = runs
    copy = tmp_path / "run"
    shutil.copytree(secure.run_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    faults = [f"cohort=c{i}@round={i}" for i in range(40)]  # a value far over 300 characters
    manifest["config"]["run"]["fail"] = faults
    (copy / "manifest.json").write_text(json.dumps(manifest))
    page = report(copy)[-1].read_text()
    assert html.escape(json.dumps(faults)) in page
    # secure-sum without DP: its DP options do not apply and are not listed; an option that
    # applies but was left to its default says so
    assert secure.config["protocol"]["dp_mechanism"] == "none"
    for name in ("epsilon", "delta", "dp_dropout"):
        assert f"<th>{name}</th>" not in page
    assert "<th>degree</th><td class='unset'>not set (default)</td>" in page
    assert "None" not in _text(page)


def test_an_interrupted_run_is_reported_with_where_it_stopped(tmp_path, monkeypatch):
    from rayfed.federation import Federation

    record = Federation.record

    def interrupt_in_round_1(self, **values):
        if self.round_no == 1:
            raise KeyboardInterrupt
        record(self, **values)

    monkeypatch.setattr(Federation, "record", interrupt_in_round_1)
    with pytest.raises(KeyboardInterrupt):
        rayfed.run("secure-sum", rounds=3, out_dir=str(tmp_path), **SMALL)
    (run_dir,) = tmp_path.iterdir()
    written = report(run_dir)
    page = written[-1].read_text()
    where = json.loads((run_dir / "manifest.json").read_text())["interrupted"]
    assert where["round"] == 1 and where["rounds_finished"] == 1
    assert (
        f"<b>interrupted</b> by SIGINT in round 1, phase {where['phase']}, after 1 finished "
        "round(s). No result was kept." in page
    )
    assert [p.name for p in written] == ["timings.png", "report.html"]
    assert "None" not in _text(page)


def test_a_bound_too_small_to_see_is_written_not_drawn_at_zero(tmp_path, monkeypatch):
    """A visible bound is drawn at its own point, one too small to see (or below a float's
    range: 2^-1100 is 0.0) is written as 2^x with what it bounds, and a point where no bound
    applies (its dropout above the tolerated) is named, never drawn."""
    import matplotlib.pyplot as plt

    from rayfed.stress import abort_bound, plot_sweep

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    row = dict(
        option="dropout", abort_rate=0.0, abort_ci_low=0.0, abort_ci_high=0.5,
        simulated_round_seconds=0.0, wall_round_seconds=0.1, alive_unmask=10,
        tolerated_dropout=0.3,
    )  # fmt: skip
    bounds = [(-30.5, 0.1), (-2.3, 0.2), (-1100.4, 0.3), (-30.5, 0.5)]  # (log2, dropout asked)
    rows = [{**row, "value": str(d), **abort_bound(x, 0.3, d, " (asked)")} for x, d in bounds]
    assert rows[3]["abort_bound"] == (
        "none at dropout 0.5 (asked): the finder's bound holds at dropout <= 0.3 only"
    )
    plot_sweep(rows, tmp_path / "s.png", "t")
    aborts = kept[0].axes[0]
    drawn = [list(line.get_ydata()) for line in aborts.get_lines() if "bound" in line.get_label()]
    assert drawn == [[2**-2.3]]  # only the visible bound, at its own point
    (text,) = [t.get_text() for t in aborts.texts]
    assert text.splitlines() == [
        "finder's bound: P[abort] <= 2^-30.5 at dropout <= 0.3",
        "(too small to draw)",
        "finder's bound: P[abort] <= 2^-1100.4 at dropout <= 0.3",
        "(too small to draw)",
        "no bound at dropout=0.5:",
        "its dropout is above tolerated_dropout",
    ]
    monkeypatch.undo()
    plt.close(kept[0])


# --- in a browser -------------------------------------------------------------------------------
#: CI sets it: there the browser check must run, never skip
REQUIRE = "RAYFED_REQUIRE_BROWSER"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _chromium() -> str:
    """Chromium and Playwright to drive it; a skip without them, unless CI requires them."""
    import importlib.util

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found and importlib.util.find_spec("playwright"):
        return found
    missing = "chromium" if not found else "playwright (pip install '.[test]')"
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{missing} is missing but {REQUIRE}=1 (apt-get install chromium)")
    pytest.skip(f"{missing} is not installed")


def test_the_three_kinds_of_page_in_a_browser(runs, failed_run, tmp_path):
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    from rayfed.stress import stress

    secure, _ = runs
    swept = stress(
        "secure-sum", {"backend": "local"}, ["users=40", "dim=4"], out_dir=str(tmp_path),
        sweep=("dropout", ["0.1"]), reps=1, progress=False,
    )  # fmt: skip
    caveat = "holds only while that seed is secret from every party"
    pages = {
        "finished": (report(secure.run_dir)[-1], 3),  # no DP: no privacy plot
        "failed": (report(failed_run)[-1], 2),
        "stress": (report(swept)[-1], 1),
    }
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        browser = pw.chromium.launch_persistent_context(
            profile, executable_path=chromium, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1280, "height": 900},
        )  # fmt: skip
        problems = []  # every check on every page, so one run shows all that fail
        try:
            tab = browser.new_page()
            for kind, (path, images) in pages.items():
                tab.goto(path.resolve().as_uri())
                text = tab.inner_text("body")
                loaded = tab.evaluate(
                    "Array.from(document.images, i => i.complete ? i.naturalWidth : 0)"
                )
                width = tab.evaluate("document.documentElement.scrollWidth")
                if caveat not in text:
                    problems.append(f"{kind}: no seed caveat")
                if "None" in text:
                    problems.append(f"{kind}: 'None' on the page")
                if len(loaded) != images or not all(w > 0 for w in loaded):
                    problems.append(f"{kind}: images {loaded}, expected {images} loaded")
                if width > 1280:
                    problems.append(f"{kind}: {width} px wide in a 1280 px window")
        finally:
            browser.close()
    assert not problems, "\n".join(problems)


def test_the_page_repeats_the_warning_of_faults_that_never_fired(tmp_path):
    with pytest.warns(RuntimeWarning, match="never fired") as caught:
        result = rayfed.run(
            "secure-sum", out_dir=str(tmp_path), fail=["cohort=c1@round=5"], **SMALL
        )
    assert result.metrics["faults_unfired"] == ["cohorts:c1@5"]
    warning = str(caught[0].message).replace("['cohorts:c1@5']", "cohorts:c1@5")
    assert warning in _text(report(result.run_dir)[-1].read_text())


def _flat(values: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
    return out


def test_every_option_an_example_sets_is_listed_as_it_was_set():
    """The configuration table never hides an option the user set: for every protocol example,
    the manifest's configuration rebuilds the same config and each option the example sets is
    listed with its value (an option it could not read would have been refused)."""
    from rayfed.config import RunOptions, from_mapping, to_dict
    from rayfed.protocols import REGISTRY, get_protocol
    from rayfed.report import _config_object, option_rows

    for name in REGISTRY:
        proto = get_protocol(name)
        for example in proto.examples:
            values = {k: v for k, v in example.items() if k not in RunOptions.__dataclass_fields__}
            cfg = from_mapping(proto.Config, values)
            rebuilt = _config_object(proto.Config, to_dict(cfg))
            assert rebuilt == cfg
            rows, _ = option_rows(rebuilt)
            listed = {row[0]: row[1] for row in rows}
            flat = to_dict(cfg)
            for path in _flat(values):  # an option, or a key inside a mapping-valued one
                parts = path.split(".")
                option = next(
                    ".".join(parts[:n]) for n in range(len(parts), 0, -1)
                    if ".".join(parts[:n]) in listed
                )  # fmt: skip
                value = flat
                for part in option.split("."):
                    value = value[part]
                assert listed[option] == value, (name, example, option)


def test_the_page_states_options_used_at_another_value_and_a_failed_runs_losses(tmp_path):
    """The summary's ``adjusted:`` line (50 cohorts asked, 20 users) and the members a failed
    run lost before it aborted are on the page as in the terminal."""
    out = tmp_path / "runs"
    result = rayfed.run("secure-sum", backend="local", out_dir=str(out), users=20, cohorts=50)
    page = " ".join(_text(report(out / result.run_id)[-1].read_text()).split())
    assert "adjusted: cohorts=50 asked, 20 used: " in page
    with pytest.raises(rayfed.BelowThreshold):
        rayfed.run(
            "secure-sum", backend="local", out_dir=str(tmp_path / "failed"), users=200, cohorts=2,
            fail=["cohort=c1@round=0"],
        )  # fmt: skip
    (failed,) = (tmp_path / "failed").iterdir()
    page = " ".join(_text(report(failed)[-1].read_text()).split())
    assert "lost: cohort c1, 100 users died in round 0 at advertise: " in page
