"""The run directory ``<out_dir>/<run-id>/``: manifest.json and result tables as Parquet.

Files are written atomically (a temporary file, then ``os.replace``). The manifest is written
first with status "running", rewritten "failed" (with the error) if the run fails, and "complete"
only after every table is on disk — so a directory is never marked complete while half-written.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayfed.errors import ConfigError

PACKAGES = (
    "rayfed-dp",
    "ray",
    "numpy",
    "scipy",
    "pyarrow",
    "pandas",
    "dp-accounting",
    "cryptography",
    "scikit-learn",
)


def new_run_id(protocol: str) -> str:
    return f"{protocol}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return repr(obj)


def _atomic_write(path: Path, write) -> None:
    """Write to a temporary file, flush it to disk, then rename it over ``path`` (and sync the
    directory), so a reader sees either the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def check_out_dir(out_dir: str | Path, field: str = "out_dir") -> None:
    """Refuse an ``out_dir`` that cannot hold run directories, creating nothing: it, or the
    nearest folder above it that exists, must be a directory this process can write in."""
    out = Path(out_dir)
    there = next((p for p in (out, *out.parents) if p.exists()), None)
    if there is None:  # (not even the file system's root: nothing to check)
        return
    if not there.is_dir():
        raise ConfigError(
            field,
            f"{str(there)!r} is a file, not a directory",
            "a directory (created if missing) or an empty value to write nothing",
        )
    if not os.access(there, os.W_OK | os.X_OK):
        raise ConfigError(
            field,
            f"cannot write in {str(there)!r} (permission denied)",
            "a writable directory or an empty value to write nothing",
        )


class RunDir:
    """One run's output directory."""

    def __init__(self, out_dir: str | Path, run_id: str):
        self.path = Path(out_dir) / run_id
        self.exists = False  # made by this run (never another run's directory of the same id)

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=False)
        self.exists = True

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        text = json.dumps(manifest, indent=2, sort_keys=False, default=_json_default)
        _atomic_write(self.path / "manifest.json", lambda p: p.write_text(text + "\n"))

    def write_table(self, name: str, table: pa.Table) -> str:
        filename = f"{name}.parquet"
        _atomic_write(self.path / filename, lambda p: pq.write_table(table, p))
        return filename
