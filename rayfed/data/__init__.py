"""Data loading, validation and partitioning (vertical, horizontal, per user)."""

from rayfed.data.io import load_table, require_clean, require_columns, sort_by_key
from rayfed.data.partition import even_groups, horizontal, party_names, per_user, vertical

__all__ = [
    "even_groups",
    "horizontal",
    "load_table",
    "party_names",
    "per_user",
    "require_clean",
    "require_columns",
    "sort_by_key",
    "vertical",
]
