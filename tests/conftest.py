"""Shared fixtures: one local Ray for the whole session (2 CPUs), temporary output directories."""

from __future__ import annotations

import pytest


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
