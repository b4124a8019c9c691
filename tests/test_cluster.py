"""cluster.yaml is a valid Ray cluster-launcher config, and jobs/pattern_count.py runs as a Ray job.

The job test starts its own `ray start --head --block` in a fresh temp dir and process group and
stops exactly that one at the end (never `ray stop`, which would kill every Ray on the machine,
including the embedded one other tests share).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

import rayfed
from rayfed.cluster import validate_cluster_config
from rayfed.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
CLUSTER_YAML = REPO / "cluster.yaml"
VENV_BIN = Path(sys.executable).parent
# Exact loss of the pattern-count message at epsilon=1 with the paper's calibration eps'=1/16:
# 2 ln((1 + 2/16) / (1 - 2/16)) = 2 ln(9/7).
EXPECTED_EPSILON = 0.5026288565618121


# --- cluster.yaml ------------------------------------------------------------------------------
@pytest.fixture
def no_aws(monkeypatch):
    """Make any import of the AWS SDK fail, so validation provably cannot contact AWS."""
    for name in ("boto3", "botocore"):
        monkeypatch.setitem(sys.modules, name, None)


def test_cluster_yaml_is_valid(no_aws):
    cfg = validate_cluster_config(CLUSTER_YAML)
    assert cfg["cluster_name"] == "rayfed"
    assert cfg["provider"]["type"] == "aws"
    assert cfg["provider"]["region"] == "us-west-2"
    assert cfg["provider"]["availability_zone"].startswith("us-west-2")
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types and len(types) == 2
    (worker,) = (t for name, t in types.items() if name != cfg["head_node_type"])
    assert 0 <= worker["min_workers"] <= worker["max_workers"] <= cfg["max_workers"]
    assert cfg["file_mounts"] == {"~/rayfed": "."}
    # prepare_config merged setup_commands into the head's and workers' lists, as `ray up` does.
    for key in ("head_setup_commands", "worker_setup_commands"):
        assert "pip install -U ~/rayfed" in cfg[key]
    assert any("ray start --head" in c for c in cfg["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP:6379" in c for c in cfg["worker_start_ray_commands"])


def _broken_copy(tmp_path: Path, edit) -> Path:
    cfg = yaml.safe_load(CLUSTER_YAML.read_text())
    edit(cfg)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _drop_worker_node_config(cfg):
    del cfg["available_node_types"]["ray.worker.default"]["node_config"]


def _unknown_top_level_key(cfg):
    cfg["max_worker"] = 3  # a typo of max_workers


def _head_type_not_declared(cfg):
    cfg["head_node_type"] = "ray.head.missing"


def _min_workers_above_global_max(cfg):
    cfg["max_workers"] = 0


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (_drop_worker_node_config, "node_config"),
        (_unknown_top_level_key, "max_worker"),
        (_head_type_not_declared, "head_node_type"),
        (_min_workers_above_global_max, "max_workers"),
    ],
)
def test_broken_cluster_yaml_raises_config_error(tmp_path, no_aws, edit, needle):
    path = _broken_copy(tmp_path, edit)
    with pytest.raises(ConfigError) as info:
        validate_cluster_config(path)
    assert info.value.field == "cluster.yaml"
    assert needle in info.value.problem


def test_missing_or_non_yaml_cluster_file_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        validate_cluster_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        validate_cluster_config(bad)


# --- a real `ray job submit` against a separate local head ---------------------------------------
def _free_ports(n: int) -> list[int]:
    """n distinct ports that are free right now (the OS picks them; all bound at once)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _worker_port_range(size: int = 100) -> tuple[int, int]:
    """A block of ports below Linux's ephemeral range (32768+) whose ends are free right now."""
    for _ in range(50):
        low = random.randrange(20000, 32000 - size)
        try:
            for port in (low, low + size - 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return low, low + size - 1
    raise RuntimeError("no free worker port range found")


def _processes_mentioning(temp_dir: str) -> list[tuple[int, str]]:
    """Live processes whose command line mentions ``temp_dir`` or whose cwd is inside it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if "State:\tZ" in status:
            continue
        if temp_dir in cmd or cwd == temp_dir or cwd.startswith(temp_dir + "/"):
            found.append((int(entry.name), cmd.strip()))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def _stop_head(proc: subprocess.Popen, temp_dir: str) -> None:
    """Stop the head and everything it started; SIGKILL whatever is left after a grace period.

    SIGTERM goes to `ray start --block` first: its handler stops the raylet, GCS, dashboard and
    workers in order. SIGTERM to the whole group at once makes that handler (and the autoscaler
    monitor's) block on a GCS that is already gone.
    """
    pgid = proc.pid  # start_new_session=True: the head leads its own process group
    proc.terminate()
    if not _wait(lambda: proc.poll() is not None, 20):
        os.killpg(pgid, signal.SIGTERM)
        _wait(lambda: proc.poll() is not None, 5)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    for pid, _cmd in _processes_mentioning(temp_dir):  # ours: the temp dir is unique to this test
        os.kill(pid, signal.SIGKILL)
    proc.poll()
    _wait(lambda: not _group_alive(pgid) and not _processes_mentioning(temp_dir), 10)


@pytest.fixture
def ray_head():
    """A separate local Ray head (auth off, free ports, own temp dir); stopped afterwards."""
    temp_dir = tempfile.mkdtemp(prefix="rfh", dir="/tmp")  # short: Unix socket paths <= 107 bytes
    names = (
        "port",
        "dashboard-port",
        "ray-client-server-port",
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    )
    ports = dict(zip(names, _free_ports(len(names)), strict=True))
    low, high = _worker_port_range()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        # On SIGTERM, Ray 2.60's `ray start --block` first drains the node for up to 30 s.
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    cmd = [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--num-cpus=2",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        "--disable-usage-stats",
        f"--min-worker-port={low}",
        f"--max-worker-port={high}",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]
    log_path = Path(temp_dir) / "head.log"
    log = open(log_path, "wb")  # closed in the finally below
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=temp_dir
    )
    dashboard = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ray start exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{dashboard}/api/jobs/", timeout=2) as resp:
                    if resp.status == 200:
                        json.load(resp)
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"job API at {dashboard} not up within 90 s:\n{log_path.read_text()}")
            time.sleep(0.5)
        yield {"dashboard": dashboard, "env": env, "temp_dir": temp_dir, "log": log_path}
    finally:
        _stop_head(proc, temp_dir)
        log.close()
        leftovers = _processes_mentioning(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not leftovers, f"processes of the test head still running: {leftovers}"


@pytest.mark.slow
@pytest.mark.ray
def test_pattern_count_job_runs_via_ray_job_submit(ray_head, tmp_path):
    out_dir = tmp_path / "runs"
    started = time.monotonic()
    # fmt: off
    cmd = [
        str(VENV_BIN / "ray"), "job", "submit",
        "--address", ray_head["dashboard"],
        "--working-dir", str(REPO),
        "--", "python", "jobs/pattern_count.py", "--small", "--out", str(out_dir),
    ]
    # fmt: on
    done = subprocess.run(
        cmd, env=ray_head["env"], capture_output=True, text=True, timeout=150, cwd=tmp_path
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"ray job submit failed after {elapsed:.0f} s:\n{output}"
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT_JSON ")]
    assert len(lines) == 1, output
    record = json.loads(lines[0].removeprefix("RESULT_JSON "))

    assert record["protocol"] == "pattern-count"
    assert record["epsilon"] == pytest.approx(EXPECTED_EPSILON, abs=1e-9)
    assert record["delta"] == 0
    # The job ran on the test head (2 CPUs), not on an embedded Ray of its own.
    assert record["address"] != "embedded"
    assert record["ray"]["CPU"] == 2
    metrics = record["metrics"]
    assert metrics["users"] == 5000
    assert metrics["rmse"] > 0 and metrics["mean_predicted_sd"] > 0
    # Same config and seed => the same result as the in-process path (no Ray), bit for bit.
    local = rayfed.run(
        "pattern-count", seed=0, epsilon=1.0, users=5000, backend="local", out_dir=None
    )
    for key in ("max_abs_error", "rmse", "mean_predicted_sd"):
        assert metrics[key] == local.metrics[key], key
    # The error is in line with the predicted standard deviation (9 cells).
    assert metrics["max_abs_error"] < 5 * metrics["mean_predicted_sd"]

    run_dir = Path(record["run_dir"])
    assert run_dir.parent == out_dir
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["run_id"] == record["run_id"]
    assert manifest["privacy"]["epsilon"] == pytest.approx(EXPECTED_EPSILON, abs=1e-9)
    assert (run_dir / "transcript.parquet").exists()
