"""Shared fixtures: one local Ray for the whole session (2 CPUs), temporary output directories."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# before anything loads numpy: the golden runs' BLAS kernel (see tests/golden/record.py)
sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
import record  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _unsharded_auto(request, monkeypatch):
    """server_shards="auto" is 1 in every test, whatever the machine's CPUs (the rule would shard
    the server from 8 CPUs on, and tests that patch the coordinator's server steps or compare
    transcripts and goldens would test the unsharded server no more); a test marked
    ``auto_server_shards`` gets the CPU rule (:func:`rayfed.sizing.default_server_shards`)."""
    if request.node.get_closest_marker("auto_server_shards") is None:
        from rayfed import sizing

        monkeypatch.setattr(sizing, "AUTO_SERVER_SHARDS", False)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray shared by every test that needs one; shut down at the end of the session."""
    import rayfed

    rayfed.ensure_ray(num_cpus=2)
    yield
    rayfed.shutdown()


@pytest.fixture
def out_dir(tmp_path):
    path = tmp_path / "runs"
    path.mkdir()
    return path


@pytest.fixture
def run_small_job(tmp_path):
    """Run ``jobs/<name> --small --out tmp_path`` as a subprocess; fail with its stderr tail."""
    import subprocess
    import sys
    from pathlib import Path

    def run(name: str, timeout: float = 600):
        job = Path(__file__).resolve().parents[1] / "jobs" / name
        done = subprocess.run(
            [sys.executable, str(job), "--small", "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "RESULT_JSON" in done.stdout
        return tmp_path

    return run


@pytest.fixture
def bounded():
    """``bounded(seconds, fn, *args, **kwargs)``: fn's result (or exception), or a test failure if
    fn has not finished within ``seconds`` — a guard against a hang, not a speed check."""
    import concurrent.futures

    def call(seconds, fn, *args, **kwargs):
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        future = pool.submit(fn, *args, **kwargs)
        done, _ = concurrent.futures.wait([future], timeout=seconds)
        pool.shutdown(wait=False)
        if not done:  # (not result(timeout=): its TimeoutError would also catch fn's own)
            pytest.fail(f"{getattr(fn, '__name__', fn)} hung for {seconds} s")
        return future.result()

    return call
