"""``rayfed report RUN_DIR``: PNG plots and a one-page HTML summary of a run directory;
``rayfed report --compare DIR DIR ...`` puts several runs on the same plots.

Everything comes from what a run already writes: ``manifest.json`` (config, metrics, privacy
ledger entries with the ε after each charge, phase timings, per-round values a protocol recorded
with ``Federation.record``) and ``transcript.parquet`` (every message's round, sender and bytes).

Plots: privacy spent over rounds against the budget; seconds per phase; bytes moved per round by
sender role; and each per-round value (e.g. survivors and dropouts of secure aggregation).
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayfed.errors import ConfigError

ROLE_COLOURS = {"coordinator": "tab:red", "parties": "tab:blue", "cohorts": "tab:green"}
LINESTYLES = ["-", "--", ":", "-."]  # one per compared run, so identical curves stay visible


@dataclass
class Run:
    """One run directory's manifest and transcript rows."""

    path: Path
    manifest: dict[str, Any]
    transcript: list[dict[str, Any]]

    @property
    def label(self) -> str:
        """Short enough for a legend: protocol and the run id's random suffix."""
        run_id = self.manifest.get("run_id", self.path.name)
        return f"{self.manifest.get('protocol', '?')} …{run_id[-6:]}"

    @property
    def per_round(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("metrics", {}).get("per_round", []))


def load(path: str | Path) -> Run:
    """Read a run directory; a missing or unfinished one is a ConfigError naming it."""
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.exists():
        raise ConfigError("run_dir", f"{str(path)!r} has no manifest.json", "a run directory")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("status") not in ("complete", "failed", "interrupted"):
        raise ConfigError(
            "run_dir",
            f"run {manifest.get('run_id')} is {manifest.get('status')!r}",
            "a finished (complete, failed or interrupted) run directory",
        )
    rows: list[dict[str, Any]] = []
    transcript = path / manifest.get("tables", {}).get("transcript", "transcript.parquet")
    if transcript.exists():
        import pyarrow.parquet as pq

        rows = pq.read_table(transcript).to_pylist()
    return Run(path, manifest, rows)


# --- data series --------------------------------------------------------------------------------
def privacy_series(run: Run) -> tuple[list[int], list[float]]:
    """(rounds, the run's ε after each round): each ledger entry's ``epsilon_after`` is the run's
    guarantee after that charge (the worst scope's under parallel composition), so the running
    maximum over the entries is what the run had spent by the end of each round."""
    by_round: dict[int, float] = {}
    for entry in run.manifest.get("privacy", {}).get("entries", []):
        r = int(entry["round"])
        by_round[r] = max(by_round.get(r, 0.0), float(entry["epsilon_after"]))
    rounds, spent, worst = sorted(by_round), [], 0.0
    for r in rounds:
        worst = max(worst, by_round[r])
        spent.append(worst)
    return rounds, spent


def labels_of(runs: list[Run]) -> list[str]:
    """Legend labels: the protocol options that differ between the runs (e.g. "epsilon=1,
    seed=0"), else the run labels."""
    if len(runs) == 1:
        return ["run"]
    configs = [
        {**r.manifest.get("config", {}).get("protocol", {}), "seed": r.manifest.get("seed")}
        for r in runs
    ]
    keys = sorted(k for k in set().union(*configs) if len({str(c.get(k)) for c in configs}) > 1)
    if not keys or len(keys) > 3 or len(runs) > 12:
        return [r.label for r in runs]
    return [", ".join(f"{k}={c.get(k)}" for k in keys) for c in configs]


def phase_seconds(run: Run) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in run.manifest.get("timings", []):
        if t["phase"] != "(round)":
            key = f"{t['role']}: {t['phase']}" if t["role"] else t["phase"]
            out[key] = out.get(key, 0.0) + float(t["seconds"])
    return out


def round_seconds(run: Run) -> tuple[list[int], list[float]]:
    rounds = [t for t in run.manifest.get("timings", []) if t["phase"] == "(round)"]
    return [int(t["round"]) for t in rounds], [float(t["seconds"]) for t in rounds]


def _role(sender: str, run: Run) -> str:
    if sender == "coordinator":
        return "coordinator"
    cohorts = run.manifest.get("members", {}).get("cohorts", [])
    return "cohorts" if sender in cohorts else "parties"


def bytes_by_round(run: Run) -> dict[str, dict[int, int]]:
    """role -> round -> bytes sent (from the transcript)."""
    out: dict[str, dict[int, int]] = {}
    for row in run.transcript:
        role = _role(row["sender"], run)
        out.setdefault(role, {})
        out[role][int(row["round"])] = out[role].get(int(row["round"]), 0) + int(row["bytes"])
    return out


def round_values(run: Run) -> dict[str, tuple[list[int], list[float]]]:
    """Every numeric per-round value a protocol recorded: name -> (rounds, values)."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in run.per_round:
        for key, value in row.items():
            if key == "round" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            rounds, values = out.setdefault(key, ([], []))
            rounds.append(int(row["round"]))
            values.append(float(value))
    return out


def baselines(run: Run, name: str) -> list[tuple[str, float]]:
    """(label, value) of each baseline the run declared for the per-round value ``name``: its
    metrics' ``baselines`` maps a scalar metric to the value it compares with and its label
    (LFL: ``stage1_test_mse`` and ``central_test_mse`` beside ``test_mse``, named by the
    protocol). A metric no protocol declared is no baseline: the report guesses none."""
    metrics = run.manifest.get("metrics", {})
    declared = metrics.get("baselines")
    out = []
    for metric, what in (declared if isinstance(declared, dict) else {}).items():
        value = metrics.get(metric)
        if what.get("of") != name or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out.append((str(what.get("label", metric)), float(value)))
    return out


# --- plots --------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_privacy(runs: list[Run], path: Path) -> Path | None:
    """ε spent over rounds against the budget; None (no plot) where no run charged the ledger."""
    if not any(privacy_series(run)[0] for run in runs):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    budgets = set()
    for i, (run, label) in enumerate(zip(runs, labels_of(runs), strict=True)):
        rounds, eps = privacy_series(run)
        if rounds:
            ax.step(
                rounds, eps, where="post", marker="o", ms=3, ls=LINESTYLES[i % len(LINESTYLES)],
                label=label,
            )  # fmt: skip
        budgets.add(run.manifest.get("privacy", {}).get("budget_epsilon") or 0.0)
    for budget in budgets - {0.0}:
        ax.axhline(budget, ls="--", lw=1, color="gray")
        ax.text(0.01, budget, f" budget ε = {budget:g}", fontsize=8, va="bottom",
                transform=ax.get_yaxis_transform())  # fmt: skip
    _round_axes(ax, "ε spent (cumulative)", "Privacy spent over rounds")
    return _save(fig, path)


def plot_timings(run: Run, path: Path) -> Path | None:
    """Seconds per phase and per round: a panel for each that was timed; None if neither was
    (a run that failed or was interrupted before its first phase)."""
    phases = sorted(phase_seconds(run).items(), key=lambda kv: kv[1])
    rounds, seconds = round_seconds(run)
    if not phases and not rounds:
        return None
    plt = _pyplot()
    panels = int(bool(phases)) + int(bool(rounds))
    fig, axes = plt.subplots(
        1, panels, figsize=(6 * panels, max(3.5, 0.3 * len(phases) + 1)), squeeze=False
    )
    axes = list(axes[0])
    if phases:
        left = axes.pop(0)
        names, values = zip(*phases, strict=True)
        colours = [ROLE_COLOURS.get(n.split(":")[0], "tab:gray") for n in names]
        left.barh(names, values, color=colours)
        left.tick_params(axis="y", labelsize=7)
        left.set_xlabel("seconds (total over rounds)")
        left.set_title("Time per phase")
    if rounds:
        right = axes.pop(0)
        right.bar(rounds, seconds, color="tab:purple")
        _integer_rounds(right)
        right.set_xlabel("round")
        right.set_ylabel("seconds")
        right.set_title("Time per round")
    return _save(fig, path)


def plot_bytes(runs: list[Run], path: Path) -> Path | None:
    """Bytes sent per round by sender role, on a log axis; None where no run has a transcript
    (a failed or interrupted run writes none)."""
    if not any(run.transcript for run in runs):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (run, label) in enumerate(zip(runs, labels_of(runs), strict=True)):
        prefix = f"{label}: " if len(runs) > 1 else ""
        for role, per_round in sorted(bytes_by_round(run).items()):
            rounds = sorted(per_round)
            ax.plot(
                rounds,
                [max(per_round[r], 1) for r in rounds],
                marker="o",
                ms=3,
                ls=LINESTYLES[i % len(LINESTYLES)],
                color=ROLE_COLOURS.get(role),
                label=f"{prefix}{role}",
            )
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(_human_bytes())
    ax.yaxis.set_minor_formatter(_human_bytes())
    _round_axes(ax, "bytes sent (log scale)", "Bytes moved per round, by sender role")
    return _save(fig, path)


def plot_round_values(runs: list[Run], path: Path) -> Path | None:
    names = sorted({k for run in runs for k in round_values(run)})
    if not names:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(names), 1, figsize=(7, 2.8 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for run, label in zip(runs, labels_of(runs), strict=True):
            series = round_values(run).get(name)
            own = label if len(runs) > 1 else "this run" if baselines(run, name) else None
            if series:
                ax.plot(*series, marker="o", ms=3, label=own)
            if len(runs) == 1:
                for i, (text, value) in enumerate(baselines(run, name)):
                    ax.axhline(value, ls=LINESTYLES[1 + i % 3], lw=1.2, color=f"C{i + 1}",
                               label=f"{text}: {value:.4g}")  # fmt: skip
        _integer_rounds(ax)
        ax.set_title(name)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return _save(fig, path)


def _round_axes(ax, ylabel: str, title: str) -> None:
    """Integer round ticks, labels, grid, and a legend if anything is labelled."""
    _integer_rounds(ax)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _integer_rounds(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lo, hi = ax.get_xlim()
    if hi - lo < 1:  # a single round
        ax.set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)


def _human_bytes():
    from matplotlib.ticker import FuncFormatter

    def fmt(value, _pos):
        for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if value >= size:
                return f"{value / size:g} {unit}"
        return f"{value:g} B"

    return FuncFormatter(fmt)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# --- HTML ---------------------------------------------------------------------------------------
def _table(rows: dict[str, Any]) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in rows.items()
    )
    return f"<table>{cells}</table>"


def _fmt(value: Any) -> str:
    """A cell's text, whole: numbers to 6 significant digits, lists and mappings as JSON, and
    "—" for a value that was not recorded."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:0.5em 0}th,td{border:1px solid #ccc;padding:3px 8px;"
    "text-align:left;font-size:13px;vertical-align:top;overflow-wrap:break-word}"
    "th{background:#f3f3f3}td.value{min-width:8em;max-width:32em;overflow-wrap:anywhere}"
    "td.unset{color:#777;font-style:italic;white-space:nowrap}td.help{color:#555}"
    "table.options th{white-space:nowrap}"
    ".wide{max-width:100%;overflow-x:auto}table.sweep th,table.sweep td{font-size:12px;"
    "padding:2px 5px}table.sweep td{white-space:nowrap}"
    "img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}li{margin:0.2em 0}"
    ".bad{color:#b00}"
)


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def _where(reached: dict[str, Any]) -> str:
    """Where a run stopped ("in round R, phase P, after N finished round(s)"), from the manifest."""
    if reached.get("phase") == "start" and reached.get("round") is None:
        return "while starting the federation"
    parts = []
    if reached.get("round") is not None:
        parts.append(f"in round {reached['round']}")
    if reached.get("phase"):
        parts.append(f"phase {reached['phase']}")
    if reached.get("rounds_finished") is not None:
        parts.append(f"after {reached['rounds_finished']} finished round(s)")
    return ", ".join(parts)


def _status_html(m: dict[str, Any]) -> str:
    """The banner of a run that did not complete: its status, the error or signal, and how far
    it got (no result was kept); empty for a complete run."""
    status = m.get("status")
    if status == "failed":
        where = _where(m.get("reached") or {})
        return (
            "<p class='bad'><b>failed</b>"
            + (f" {html.escape(where)}" if where else "")
            + f": {html.escape(str(m.get('error')))}. No result was kept.</p>"
        )
    if status == "interrupted":
        where = m.get("interrupted") or {}
        text = f"by {where.get('signal')}"
        if _where(where):
            text += f" {_where(where)}"
        return f"<p class='bad'><b>interrupted</b> {html.escape(text)}. No result was kept.</p>"
    return ""


def _round_and_loss_lines(manifest: dict[str, Any]) -> list[str]:
    """The terminal's lines on what the run used and what happened: options used at another
    value than asked, notes on its inputs (a trace's coverage), per-round and lost members (a
    failed run's from its manifest)."""
    from rayfed.protocols.base import adjusted_lines, loss_lines, round_lines

    metrics = manifest.get("metrics", {})
    notes = [
        f"  inputs:   {x['note']}" for x in (manifest.get("inputs") or {}).values() if "note" in x
    ]
    return (
        adjusted_lines(manifest.get("adjusted") or [])
        + notes
        + round_lines(metrics.get("per_round") or [])
        + loss_lines(metrics.get("losses") or manifest.get("losses") or [])
    )


def _lines_html(lines: list[str]) -> str:
    """The summary's indented ``rounds:``/``lost:`` lines as one block, a line each."""
    if not lines:
        return ""
    return "<p>" + "<br>".join(html.escape(line.strip()) for line in lines) + "</p>"


def _unfired_html(unfired: list[str] | None) -> str:
    """The warning the run printed for injected faults that never fired."""
    if not unfired:
        return ""
    text = f"injected fault(s) never fired (no such round or phase reached): {', '.join(unfired)}"
    return f"<p class='bad'>{html.escape(text)}</p>"


def _privacy_html(m: dict[str, Any]) -> str:
    """The terminal summary's privacy, note and noise lines, from the manifest's privacy report
    (the same ``PrivacyReport.summary`` text); a run that ended before its report was written
    gets its randomness statement from the configuration it ran with."""
    import dataclasses

    from rayfed.privacy.ledger import PrivacyReport
    from rayfed.privacy.source import STATEMENTS

    privacy = m.get("privacy")
    if privacy:
        names = {f.name for f in dataclasses.fields(PrivacyReport)}
        report_ = PrivacyReport(**{k: v for k, v in privacy.items() if k in names})
        by_then = " (charged by the time it failed)" if m.get("status") == "failed" else ""
        lines = [f"<p><b>privacy{by_then}:</b> {html.escape(report_.summary())}</p>"]
        if report_.private or report_.statement not in report_.summary():
            lines.append(f"<p>{html.escape(report_.statement)}</p>")
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in report_.notes)
        lines.append(f"<ul>{notes}</ul>" if notes else "")
        noise = report_.randomness_statement
    else:
        lines = [
            "<p><b>privacy:</b> the run ended before its privacy report was written; the ε "
            "spent by then is not recorded.</p>"
        ]
        randomness = (m.get("config", {}).get("run") or {}).get("randomness")
        noise = STATEMENTS.get(randomness, "")
    if noise:
        lines.append(f"<p class='noise'><b>noise:</b> {html.escape(noise)}</p>")
    return "".join(lines)


def _config_object(cls: type, values: dict[str, Any]) -> Any:
    """The config dataclass ``cls`` holding the manifest's ``values`` (nested groups too),
    without validation: only to ask which options the configuration reads."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            value = values[f.name]
            if dataclasses.is_dataclass(hints[f.name]) and isinstance(value, dict):
                value = _config_object(hints[f.name], value)
            kwargs[f.name] = value
    return cls(**kwargs)


def _applies(cfg: Any, f: Any) -> bool:
    """Whether the configuration reads option ``f``: its ``when`` modes hold and its data
    source is the run's (the declarations rayfed.config.check_applicable enforces)."""
    from rayfed.config import _mode

    if any(_mode(cfg, key) not in allowed for key, allowed in f.metadata.get("when", {}).items()):
        return False
    path = getattr(getattr(cfg, "data", None), "path", None)
    source = f.metadata.get("source")
    return not (source == "file" and path is None or source == "synthetic" and path is not None)


def option_rows(cfg: Any, prefix: str = "") -> tuple[list[tuple[str, Any, str]], int]:
    """(name, value, help) of every option ``cfg`` reads, nested groups expanded, and the
    number left out because the configuration does not read them."""
    import dataclasses

    from rayfed.config import DataConfig

    rows: list[tuple[str, Any, str]] = []
    skipped = 0
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if not _applies(cfg, f):
            skipped += 1
        elif dataclasses.is_dataclass(value):
            inner, more = option_rows(value, f"{prefix}{f.name}.")
            rows += inner
            skipped += more
        elif isinstance(cfg, DataConfig) and cfg.path is None and f.name != "path":
            skipped += 1  # format, key and columns describe a data file
        else:
            rows.append((prefix + f.name, value, f.metadata.get("help", "")))
    return rows, skipped


def _config_html(m: dict[str, Any]) -> str:
    """The protocol's and the run's options, whole, with their help; options the configuration
    does not read are left out (and counted), an option left unset says so."""
    from rayfed.config import RunOptions
    from rayfed.protocols import get_protocol

    config = m.get("config", {})
    parts = []
    for title, cls, values in (
        ("Protocol options", None, config.get("protocol") or {}),
        ("Run options", RunOptions, config.get("run") or {}),
    ):
        try:
            cls = cls or get_protocol(m.get("protocol")).Config
            rows, skipped = option_rows(_config_object(cls, values))
        except Exception:  # a manifest of another version: every value as recorded
            rows, skipped = [(k, v, "") for k, v in values.items()], 0
        cells = "".join(
            f"<tr><th>{html.escape(name)}</th>"
            + (
                "<td class='unset'>not set (default)</td>"
                if value is None
                else f"<td class='value'>{html.escape(_fmt(value))}</td>"
            )
            + f"<td class='help'>{html.escape(help_)}</td></tr>"
            for name, value, help_ in rows
        )
        note = (
            f"<p>{skipped} option(s) that do not apply to this configuration are not listed.</p>"
            if skipped
            else ""
        )
        parts.append(
            f"<h3>{title}</h3><div class='wide'><table class='options'>{cells}</table></div>{note}"
        )
    return "".join(parts)


def _summary_html(run: Run, images: list[Path]) -> str:
    m = run.manifest
    scalars = {
        k: v
        for k, v in m.get("metrics", {}).items()
        if v is not None and not isinstance(v, (dict, list))
    }
    totals = m.get("transcript") or {}
    overview = {
        "protocol": m.get("protocol"),
        "seed": m.get("seed"),
        "status": m.get("status"),
        "seconds": m.get("seconds"),
    }
    if totals:
        overview["messages / bytes"] = f"{totals.get('messages')} / {totals.get('bytes')}"
    omitted = [
        text
        for name, text in (
            ("privacy", "privacy (no DP noise was charged)"),
            ("timings", "timings (nothing was timed)"),
            ("bytes", "bytes (no transcript was written)"),
        )
        if name not in {p.stem for p in images}
    ]
    body = [
        _status_html(m),
        f"<p><b>{html.escape(m['headline'])}</b></p>" if m.get("headline") else "",
        *(f"<p>{html.escape(line)}</p>" for line in m.get("details") or []),
        _lines_html(_round_and_loss_lines(m)),
        _unfired_html(m.get("metrics", {}).get("faults_unfired")),
        _table({k: v for k, v in overview.items() if v is not None}),
        "<h2>Privacy</h2>",
        _privacy_html(m),
        *(["<h2>Metrics</h2>", _table(scalars)] if scalars else []),
        "<h2>Plots</h2>" if images or omitted else "",
        *(f"<img src='{p.name}' alt='{p.stem}'>" for p in images),
        f"<p>No plot of {', '.join(omitted)}.</p>" if omitted else "",
        "<h2>Configuration</h2>",
        _config_html(m),
    ]
    return _page(f"rayfed run {run.label}", "".join(body))


# --- entry points -------------------------------------------------------------------------------
def report(run_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the plots and ``report.html`` of one run (into the run directory by default), or of
    a ``rayfed stress`` directory (:func:`stress_report`)."""
    if (Path(run_dir) / "stress.json").exists():
        return stress_report(run_dir, out)
    run = load(run_dir)
    out = Path(out) if out else run.path
    out.mkdir(parents=True, exist_ok=True)
    drawn = [
        plot_privacy([run], out / "privacy.png"),
        plot_timings(run, out / "timings.png"),
        plot_bytes([run], out / "bytes.png"),
        plot_round_values([run], out / "rounds.png"),
    ]
    images = [p for p in drawn if p is not None]
    page = out / "report.html"
    page.write_text(_summary_html(run, images))
    return [*images, page]


def stress_report(stress_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    """``report.html`` of a ``rayfed stress`` directory: its plot, and one table row per rate,
    scenario or sweep point with every value it recorded."""
    stress_dir = Path(stress_dir)
    record = json.loads((stress_dir / "stress.json").read_text())
    out = Path(out) if out else stress_dir
    out.mkdir(parents=True, exist_ok=True)
    rows = record["rows"]
    columns = list(dict.fromkeys(k for row in rows for k in row if k not in ("security",)))
    # a long column name may break after each underscore; a wider table scrolls in its box
    head = "".join(f"<th>{html.escape(c).replace('_', '_<wbr>')}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(c, '')))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    image = stress_dir / "stress.png"
    where = Path(os.path.relpath(image.resolve(), out.resolve())).as_posix()
    img = f"<img src='{html.escape(where)}' alt='stress'>" if image.exists() else ""
    settings = _table({"options": record.get("options", {}), "sets": record.get("sets", [])})
    security = rows[0].get("security") if rows else None
    status = record.get("status", "complete")  # (stress directories before issue 28 had none)
    unfinished = (
        f"<p style='color:#b00'><b>{html.escape(status)}</b>: "
        f"{record.get('points_finished')} of {record.get('points')} points finished"
        + (f" ({html.escape(record['error'])})" if record.get("error") else "")
        + "</p>"
        if status != "complete"
        else ""
    )
    page = out / "report.html"
    page.write_text(
        _page(
            f"rayfed stress {record['protocol']}",
            unfinished
            + img
            + (f"<p>{html.escape(security)}</p>" if security else "")
            + f"<p class='noise'><b>noise:</b> {html.escape(_stress_randomness(record))}</p>"
            + f"<div class='wide'><table class='sweep'><tr>{head}</tr>{body}</table></div>"
            + f"<h2>Settings</h2>{settings}",
        )
    )
    return [page]


def _stress_randomness(record: dict[str, Any]) -> str:
    """The randomness statement of a stress directory's runs, as they ran (``rayfed stress``
    records each point's: a run's options may make it secure, e.g. secure-sum's
    ``mode=secure``); never guessed from the options."""
    statement = record.get("randomness_statement")
    if statement:
        return statement
    if not record.get("rows"):
        return "no point has finished: no run's randomness to state yet"
    return (
        "not recorded: this stress directory was written before rayfed recorded its runs' "
        "randomness (see a run's own manifest)"
    )


def compare(run_dirs: list[str | Path], out: str | Path) -> list[Path]:
    """Several runs on one set of plots, and ``compare.html`` with their scalar metrics."""
    if len(run_dirs) < 2:
        raise ConfigError("--compare", f"needs 2 or more run directories, got {len(run_dirs)}")
    runs = [load(d) for d in run_dirs]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    drawn = [
        plot_privacy(runs, out / "privacy.png"),
        plot_bytes(runs, out / "bytes.png"),
        plot_round_values(runs, out / "rounds.png"),
    ]
    images = [p for p in drawn if p is not None]
    keys = sorted(
        {
            k
            for r in runs
            for k, v in r.manifest.get("metrics", {}).items()
            if not isinstance(v, (dict, list))
        }
    )
    head = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
    lines = []
    for key in ["protocol", "epsilon spent", "seconds", *keys]:
        cells = []
        for r in runs:
            if key == "protocol":
                value = r.manifest.get("protocol")
            elif key == "epsilon spent":
                value = r.manifest.get("privacy", {}).get("epsilon")
            elif key == "seconds":
                value = r.manifest.get("seconds")
            else:
                value = r.manifest.get("metrics", {}).get(key, "")
            cells.append(f"<td>{html.escape(_fmt(value))}</td>")
        lines.append(f"<tr><th>{html.escape(key)}</th>{''.join(cells)}</tr>")
    body = f"<table><tr><th></th>{head}</tr>{''.join(lines)}</table>" + "".join(
        f"<img src='{p.name}' alt='{p.stem}'>" for p in images
    )
    page = out / "compare.html"
    page.write_text(_page(f"rayfed: {len(runs)} runs compared", body))
    return [*images, page]
