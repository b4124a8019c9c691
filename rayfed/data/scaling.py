"""Feature matrices and the map of declared (public) bounds onto [-1, 1]."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayfed.errors import ConfigError, DataError


def features_of(table: pa.Table, columns: list[str]) -> np.ndarray:
    """(n, len(columns)) float64 matrix of the named columns."""
    return np.column_stack([table.column(c).to_numpy().astype(np.float64) for c in columns])


def to_unit(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Map declared bounds [lo, hi] to [-1, 1]."""
    return 2.0 * (values - lo) / (hi - lo) - 1.0


def from_unit(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (values + 1.0) / 2.0 * (hi - lo) + lo


def declared_bounds(bounds: dict | None, features: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of ``features`` from ``bounds``; a missing or empty interval names its field."""
    bounds = bounds or {}
    for col in features:
        b = bounds.get(col)
        if b is None or len(b) != 2 or not b[0] < b[1]:
            raise ConfigError(
                f"bounds.{col}",
                f"column {col!r} needs declared bounds [low, high] with low < high, got {b!r}",
                "public bounds from domain knowledge, e.g. [0, 100]",
            )
    lo = np.array([bounds[c][0] for c in features], dtype=np.float64)
    hi = np.array([bounds[c][1] for c in features], dtype=np.float64)
    return lo, hi


def check_bounds(x: np.ndarray, features: list[str], lo, hi, policy: str) -> None:
    """With ``policy="error"``, a value outside its declared bounds is a DataError."""
    outside = (x < lo) | (x > hi)
    if policy == "error" and outside.any():
        j = int(np.flatnonzero(outside.any(axis=0))[0])
        raise DataError(
            f"bounds.{features[j]}",
            f"{int(outside[:, j].sum())} value(s) of column {features[j]!r} lie outside the "
            f"declared bounds [{lo[j]:g}, {hi[j]:g}]",
            "wider bounds, or out_of_bounds=clip",
        )
