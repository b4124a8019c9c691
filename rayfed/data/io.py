"""Loading tables from CSV, Parquet or Arrow IPC files, and checking them against the config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from rayfed.errors import DataError

SUFFIXES = {
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
}


def load_table(
    path: str | Path,
    format: str = "auto",
    *,
    field: str = "data.path",
    format_field: str | None = None,
) -> pa.Table:
    """Read a whole file into a pyarrow.Table (format from the suffix unless given). Errors name
    ``field``, the option that gave the path (``format_field``: the one that gave the format;
    default ``data.format`` for ``data.path``, else ``field``)."""
    path = Path(path).expanduser()
    if format_field is None:
        format_field = "data.format" if field == "data.path" else field
    if not path.exists():
        raise DataError(field, f"{path} does not exist", "the path of a CSV, Parquet or Arrow file")
    if path.is_dir():
        raise DataError(
            field, f"{path} is a directory, not a file", "the path of a CSV, Parquet or Arrow file"
        )
    if format == "auto":
        format = SUFFIXES.get(path.suffix.lower(), "")
        if not format:
            raise DataError(
                format_field,
                f"cannot tell the format of {path.name!r} from its suffix",
                ["csv", "parquet", "arrow"],
            )
    if format not in ("csv", "parquet", "arrow"):
        raise DataError(
            format_field, f"unknown format {format!r}", ["auto", "csv", "parquet", "arrow"]
        )
    if path.is_file() and path.stat().st_size == 0:
        raise DataError(field, f"{path} is empty: no rows", "a file with at least one row")
    try:
        table = _read(path, format)
    except (OSError, pa.ArrowException) as err:
        raise DataError(field, f"cannot read {path} as {format}: {err}") from err
    if table.num_rows == 0:
        raise DataError(
            field,
            f"{path} has no rows (columns: {', '.join(table.column_names) or 'none'})",
            "a file with at least one row",
        )
    return table


def _read(path: Path, format: str) -> pa.Table:
    if format == "csv":
        return pacsv.read_csv(path)
    if format == "parquet":
        return pq.read_table(path)
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()


def require_columns(table: pa.Table, columns: list[str], field: str) -> None:
    """DataError naming ``field`` if any of ``columns`` is missing from ``table``."""
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(field, f"column(s) {missing} not in the data", table.column_names)


def require_clean(
    table: pa.Table, columns: list[str], field: str = "data", *, numeric: bool = False
) -> None:
    """DataError if a column has missing values, or NaN/inf in a floating-point column; with
    ``numeric``, also if a column is not integer or floating point (checked at plan time, so a
    text column never reaches an actor)."""
    for name in columns:
        col = table.column(name)
        if numeric and not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            raise DataError(
                f"{field}.{name}",
                f"column {name!r} is not numeric ({col.type})",
                "a numeric column (integers or floats)",
            )
        if col.null_count:
            raise DataError(
                f"{field}.{name}",
                f"{col.null_count} missing value(s)",
                "fill or drop them before the run",
            )
        if pa.types.is_floating(col.type):
            values = col.to_numpy()
            bad = int(np.count_nonzero(~np.isfinite(values)))
            if bad:
                raise DataError(
                    f"{field}.{name}", f"{bad} NaN or infinite value(s)", "finite numbers only"
                )


def sort_by_key(table: pa.Table, key: str | None) -> pa.Table:
    """Rows in ascending key order (the order every party and reduction uses); unique keys required."""
    if key is None:
        return table
    require_columns(table, [key], "data.key")
    if pc.count_distinct(table.column(key)).as_py() != table.num_rows:
        raise DataError("data.key", f"column {key!r} has duplicate values", "one row per user")
    return table.sort_by(key)
