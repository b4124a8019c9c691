"""Splitting one table among parties or cohorts.

* vertical: column groups per party, every party sees the same users in the same row order;
* horizontal: contiguous row blocks per party;
* per user: users (by key) dealt to cohorts in contiguous blocks of sorted ids.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayfed.data.io import require_columns
from rayfed.errors import ConfigError


def party_names(n: int) -> list[str]:
    return [f"p{i}" for i in range(n)]


def even_groups(columns: list[str], n_parties: int, field: str = "parties") -> dict[str, list[str]]:
    """Deal ``columns`` into ``n_parties`` contiguous groups as even as possible."""
    if n_parties < 1:
        raise ConfigError(field, f"must be >= 1, got {n_parties}")
    if n_parties > len(columns):
        raise ConfigError(
            field,
            f"{n_parties} parties but only {len(columns)} column(s) to split {columns}",
            f"at most {len(columns)} parties, or more columns",
        )
    bounds = np.linspace(0, len(columns), n_parties + 1).round().astype(int)
    return {
        name: columns[a:b]
        for name, a, b in zip(party_names(n_parties), bounds[:-1], bounds[1:], strict=True)
    }


def vertical(
    table: pa.Table, groups: dict[str, list[str]], key: str | None = None
) -> dict[str, pa.Table]:
    """One table per party with its columns (and the key column, if any); columns must be disjoint."""
    seen: dict[str, str] = {}
    for party, cols in groups.items():
        require_columns(table, cols, f"data.columns.{party}")
        for c in cols:
            if c in seen:
                raise ConfigError(
                    f"data.columns.{party}",
                    f"column {c!r} is also held by {seen[c]!r}",
                    "disjoint column groups",
                )
            seen[c] = party
    keep = [key] if key else []
    return {party: table.select(keep + list(cols)) for party, cols in groups.items()}


def horizontal(table: pa.Table, n_parties: int) -> dict[str, pa.Table]:
    """Contiguous row blocks, as even as possible, one per party."""
    if not 1 <= n_parties <= table.num_rows:
        raise ConfigError(
            "parties",
            f"cannot split {table.num_rows} rows over {n_parties} parties",
            f"1 to {table.num_rows}",
        )
    bounds = np.linspace(0, table.num_rows, n_parties + 1).round().astype(int)
    return {
        name: table.slice(a, b - a)
        for name, a, b in zip(party_names(n_parties), bounds[:-1], bounds[1:], strict=True)
    }


def per_user(table: pa.Table, key: str, n_cohorts: int) -> dict[str, pa.Table]:
    """Users dealt to cohorts in contiguous blocks of sorted key; all rows of a user stay together.

    The key becomes the ``user_id`` column (integers) every cohort step keys its randomness by.
    """
    require_columns(table, [key], "data.key")
    ids = table.column(key).to_numpy()
    if not np.issubdtype(ids.dtype, np.integer) or (ids.size and ids.min() < 0):
        raise ConfigError("data.key", f"user key {key!r} must hold non-negative integers")
    order = np.argsort(ids, kind="stable")
    table = table.take(order)
    ids = ids[order]
    users = np.unique(ids)
    if not 1 <= n_cohorts <= max(1, users.size):
        raise ConfigError(
            "cohorts",
            f"cannot deal {users.size} users to {n_cohorts} cohorts",
            f"1 to {users.size}",
        )
    cuts = users[np.linspace(0, users.size, n_cohorts + 1).round().astype(int)[1:-1]]
    starts = np.searchsorted(ids, cuts)
    bounds = [0, *starts.tolist(), ids.size]
    if key != "user_id":
        table = table.rename_columns(["user_id" if c == key else c for c in table.column_names])
    return {
        f"c{i}": table.slice(a, b - a)
        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
    }
