"""Loading every supported format and the three partitioners."""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from rayfed.data import horizontal, load_table, per_user, vertical
from rayfed.errors import ConfigError

TABLE = pa.table(
    {"id": np.arange(10, dtype=np.int64), "a": np.arange(10) * 1.5, "b": list("abcdefghij")}
)


@pytest.mark.parametrize(
    "suffix,write",
    [
        (".csv", lambda t, p: pacsv.write_csv(t, p)),
        (".parquet", lambda t, p: pq.write_table(t, p)),
        (".arrow", lambda t, p: feather.write_feather(t, p, compression="uncompressed")),
        (".ipc", lambda t, p: _write_stream(t, p)),
    ],
    ids=["csv", "parquet", "arrow-file", "arrow-stream"],
)
def test_load_every_format(tmp_path, suffix, write):
    path = tmp_path / f"data{suffix}"
    write(TABLE, path)
    loaded = load_table(path)
    assert loaded.column_names == TABLE.column_names
    assert loaded.column("a").to_pylist() == TABLE.column("a").to_pylist()
    assert loaded.column("b").to_pylist() == TABLE.column("b").to_pylist()


def _write_stream(table, path):
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def test_vertical_keeps_rows_aligned_and_columns_disjoint():
    parts = vertical(TABLE, {"p0": ["a"], "p1": ["b"]}, key="id")
    assert parts["p0"].column_names == ["id", "a"] and parts["p1"].column_names == ["id", "b"]
    assert parts["p0"]["id"].equals(parts["p1"]["id"])
    with pytest.raises(ConfigError, match="also held by"):
        vertical(TABLE, {"p0": ["a"], "p1": ["a", "b"]})


def test_horizontal_blocks_cover_all_rows_once():
    parts = horizontal(TABLE, 3)
    assert [t.num_rows for t in parts.values()] == [3, 4, 3]
    assert pa.concat_tables(parts.values()).equals(TABLE)
    with pytest.raises(ConfigError, match="parties"):
        horizontal(TABLE, 11)


def test_per_user_keeps_each_users_rows_together():
    rows = pa.table({"uid": np.array([5, 1, 5, 3, 1, 9], dtype=np.int64), "v": np.arange(6.0)})
    parts = per_user(rows, "uid", 2)
    ids = [set(t["user_id"].to_pylist()) for t in parts.values()]
    assert ids[0].isdisjoint(ids[1]) and set.union(*ids) == {1, 3, 5, 9}
    assert sum(t.num_rows for t in parts.values()) == 6
