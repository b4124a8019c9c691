"""Record the golden runs: every protocol's examples (seeded, in-process), their result tables as
Arrow IPC files and their ledger entries as JSON. ``tests/test_golden.py`` checks that the code
still produces them bit for bit: run this only when a result is meant to change, and say why in
the commit. Both pin OpenBLAS's kernel (BLAS_KERNEL), so the files hold on any x86-64 machine.

    python tests/golden/record.py
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

#: OpenBLAS picks its kernels by CPU, and an AVX-512 kernel sums in another order than an AVX2
#: one: results of matrix products differ in the last bits between machines. The golden runs pin
#: the AVX2 kernel every x86-64 CPU of the last decade has; this must happen before numpy loads
#: (tests/conftest.py imports this module first).
BLAS_KERNEL = "Haswell"
if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("OPENBLAS_CORETYPE", BLAS_KERNEL)

import pyarrow as pa  # noqa: E402

import rayfed  # noqa: E402
from rayfed.protocols import get_protocol  # noqa: E402

HERE = Path(__file__).resolve().parent


def golden_run(name: str, example: dict) -> rayfed.Result:
    """The example's run; server_shards="auto" is the coordinator alone (the goldens were
    recorded unsharded; a sharded run adds transcript rows), whatever this machine's CPUs."""
    import rayfed.sizing

    auto, rayfed.sizing.AUTO_SERVER_SHARDS = rayfed.sizing.AUTO_SERVER_SHARDS, False
    try:
        return rayfed.run(name, backend="local", out_dir=None, seed=0, **example)
    finally:
        rayfed.sizing.AUTO_SERVER_SHARDS = auto


def ledger(result: rayfed.Result) -> list[dict]:
    return result.privacy.entries


def main() -> None:
    for name in sorted(rayfed.PROTOCOLS):
        for i, example in enumerate(get_protocol(name).examples):
            folder = HERE / name / str(i)
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            result = golden_run(name, example)
            for table_name, table in sorted(result.tables.items()):
                with pa.OSFile(str(folder / f"{table_name}.arrow"), "wb") as sink:
                    with pa.ipc.new_file(sink, table.schema) as writer:
                        writer.write_table(table)
            record = {"example": example, "ledger": ledger(result)}
            (folder / "ledger.json").write_text(json.dumps(record, indent=1) + "\n")
            print(name, i, sorted(result.tables))


if __name__ == "__main__":
    main()
