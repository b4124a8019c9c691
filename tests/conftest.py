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
