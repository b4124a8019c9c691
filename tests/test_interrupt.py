"""SIGINT and SIGTERM end ``rayfed run`` cleanly on both backends: exit 130 / 143, one line and no
traceback, the manifest ``interrupted`` with the signal, round and phase reached, no process of
the run's Ray left behind, and ``rayfed report`` renders the directory.

Each test starts ``rayfed run federated-mf`` as a subprocess and signals it once its progress bar
shows a finished round."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rayfed.cli import main

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 30


def _descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (from /proc), as pid -> its start time (a reused pid is
    another process)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
        starts[int(entry.name)] = fields[19]
    out, todo = {}, [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out[child] = starts[child]
            todo.append(child)
    return out


def _alive(processes: dict[int, str]) -> list[str]:
    """Those of ``processes`` still running (zombies count as gone), with their command."""
    left = []
    for pid, start in processes.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[19] == start and fields[0] != "Z":
            left.append(f"{pid} {cmd[:120]}")
    return left


class _Reader(threading.Thread):
    """Collects a pipe's text as it comes (the progress bar rewrites one line with \\r)."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe, self.text = pipe, ""

    def run(self):
        for chunk in iter(lambda: self.pipe.read1(4096), b""):
            self.text += chunk.decode(errors="replace")

    def rounds_done(self) -> int:
        done = re.findall(rf"\| *(\d+)/{ROUNDS} ", self.text)
        return int(done[-1]) if done else 0


def _start(tmp_path: Path, backend: str, *sets: str, ignore_sigint: bool = False):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "rayfed.cli", "run", "federated-mf", "--backend", backend]
    for option in (f"iterations={ROUNDS}", *sets):
        cmd += ["--set", option]
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a process a non-interactive shell starts in the background inherits SIGINT ignored
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if ignore_sigint
        else None,
    )
    err = _Reader(proc.stderr)
    err.start()
    until = time.monotonic() + 240
    while err.rounds_done() < 1:
        if proc.poll() is not None or time.monotonic() > until:
            proc.kill()
            pytest.fail(f"the run never reached its rounds: rc {proc.poll()}\n{err.text[-2000:]}")
        time.sleep(0.1)
    return proc, err


def _check_interrupted(tmp_path, proc, err, signum: int, signals: int = 1) -> dict:
    rc = proc.wait(timeout=60)
    err.join(timeout=10)
    assert rc == 128 + signum, err.text[-3000:]
    name = signal.Signals(signum).name
    assert "Traceback" not in err.text and "SystemExit" not in err.text
    # nothing on stderr but the progress bar and one line (no Ray crash text, no C++ dump)
    text = err.text.replace("\r", "\n")
    lines = [
        x.strip() for x in text.splitlines() if x.strip() and not x.startswith("federated-mf:")
    ]
    note = "rayfed: stopping cleanly (Ray shutting down); again to exit at once"
    assert lines[-1].startswith(f"rayfed: interrupted by {name} in round ")
    assert lines[:-1] == [note] * (len(lines) - 1) and len(lines) <= signals, lines
    lines = lines[-1:]
    (run_dir,) = tmp_path.iterdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "error" not in manifest
    reached = manifest["interrupted"]
    assert reached["signal"] == name and 1 <= reached["rounds_finished"] < ROUNDS
    assert reached["round"] in (reached["rounds_finished"], reached["rounds_finished"] - 1)
    assert reached["phase"].split(":")[0] in ("coordinator", "cohorts", "parties")
    assert str(run_dir) in lines[0] and f"phase {reached['phase']}" in lines[0]
    # rayfed report renders it, and says so
    assert main(["report", str(run_dir)]) == 0
    page = (run_dir / "report.html").read_text()
    assert f"<b>interrupted</b> by {name} in round {reached['round']}" in page
    return manifest


@pytest.mark.parametrize(
    ("signum", "signals"),
    [(signal.SIGINT, 2), (signal.SIGTERM, 1)],
    ids=["SIGINT-twice", "SIGTERM"],
)
def test_a_signal_ends_a_ray_run_cleanly_and_leaves_no_ray_process(tmp_path, signum, signals):
    """Ctrl-C pressed twice (the second during the shutdown, which left Ray's agents orphaned)
    and SIGTERM (which Ray's own handler turned into SystemExit and a C++ abort)."""
    proc, err = _start(tmp_path, "ray", "users=300", "items=30")
    ray_processes = _descendants(proc.pid)  # gcs_server, raylet, agents, workers
    assert any("raylet" in Path(f"/proc/{p}/cmdline").read_text() for p in ray_processes)
    for _ in range(signals):
        proc.send_signal(signum)
        time.sleep(0.3)
    _check_interrupted(tmp_path, proc, err, signum, signals)
    until = time.monotonic() + 10
    while _alive(ray_processes) and time.monotonic() < until:
        time.sleep(0.5)
    assert _alive(ray_processes) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_a_local_run_even_with_sigint_inherited_ignored(tmp_path, signum):
    """The issue's case: Ctrl-C did not stop ``--backend local`` (its SIGINT was ignored, as in
    any process a script starts with ``&``); SIGTERM left the manifest ``running`` forever."""
    proc, err = _start(tmp_path, "local", "users=300", "items=30", ignore_sigint=True)
    proc.send_signal(signum)
    _check_interrupted(tmp_path, proc, err, signum)
