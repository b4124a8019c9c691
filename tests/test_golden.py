"""Golden runs: every protocol's examples give, bit for bit, the tables and ledger entries
recorded in tests/golden/ (``python tests/golden/record.py`` re-records them when a result is
meant to change). A restructuring must leave them untouched."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import rayfed
from rayfed.protocols import get_protocol

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))
from record import BLAS_KERNEL, golden_run, ledger  # noqa: E402


def blas_kernels() -> set[str]:
    from threadpoolctl import threadpool_info

    return {i.get("architecture", "") for i in threadpool_info() if i["internal_api"] == "openblas"}


@pytest.fixture(autouse=True, scope="module")
def pinned_blas_kernel():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return  # record.py pins x86-64's kernel only; elsewhere the last bits may differ
    kernels = blas_kernels()
    if kernels and kernels != {BLAS_KERNEL}:
        pytest.fail(
            f"OpenBLAS runs the {kernels} kernel, the golden runs were recorded with "
            f"{BLAS_KERNEL}: numpy was loaded before tests/conftest.py pinned it "
            "(OPENBLAS_CORETYPE)"
        )


CASES = [
    pytest.param(name, i, id=f"{name}-{i}")
    for name in sorted(rayfed.PROTOCOLS)
    for i in range(len(get_protocol(name).examples))
]


@pytest.mark.parametrize("name,i", CASES)
def test_tables_and_ledger_are_bit_identical_to_the_golden_run(name, i):
    folder = GOLDEN / name / str(i)
    recorded = json.loads((folder / "ledger.json").read_text())
    assert recorded["example"] == get_protocol(name).examples[i], "examples changed: re-record"
    result = golden_run(name, recorded["example"])
    files = sorted(p.stem for p in folder.glob("*.arrow"))
    assert sorted(result.tables) == files
    for table_name in files:
        with pa.memory_map(str(folder / f"{table_name}.arrow")) as source:
            expected = pa.ipc.open_file(source).read_all()
        assert result.tables[table_name].equals(expected), f"{name}-{i}: table {table_name}"
    assert json.loads(json.dumps(ledger(result))) == recorded["ledger"]
