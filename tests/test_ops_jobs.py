"""The operations jobs: jobs/sweep.py and jobs/secure_sum.py with --small."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_sweep_job_small(run_small_job):
    out = run_small_job("sweep.py", timeout=300)
    record = json.loads((out / "sweep.json").read_text())
    assert len(record["rows"]) == 4  # ε = 1, 4 x 2 seeds
    assert {r["point"]["epsilon"] for r in record["rows"]} == {1, 4}
    assert all(r["epsilon_spent"] == pytest.approx(r["point"]["epsilon"]) for r in record["rows"])
    assert (out / "sweep.png").stat().st_size > 10_000
    assert (out / "compare" / "compare.html").exists()


@pytest.mark.slow
@pytest.mark.ray
def test_secure_sum_job_small(run_small_job):
    out = run_small_job("secure_sum.py", timeout=300)
    (run_dir,) = [p for p in out.iterdir() if p.name.startswith("secure-sum-")]
    assert (run_dir / "report.html").exists() and (run_dir / "rounds.png").exists()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [r["survivors"] for r in manifest["metrics"]["per_round"]] == [500, 500]
