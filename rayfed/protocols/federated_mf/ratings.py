"""The run's ratings, shared by both settings' plans: loaded or generated, checked against R, and
laid out as the members' tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayfed import mf
from rayfed.privacy import Clipped, DataDomain, Field, Interval, enforce
from rayfed.protocols.federated_mf.config import FederatedMFConfig

#: a ratings file's (user, item, rating) columns unless ``data.columns.ratings`` names them
DEFAULT_COLUMNS = ["user_id", "item_id", "rating"]


def domain(cfg: FederatedMFConfig) -> Interval:
    """Where a rating lies: [0, R] (every sensitivity bound depends on it)."""
    return Interval(0.0, float(cfg.bound))


def load(cfg: FederatedMFConfig, gen: np.random.Generator) -> tuple[mf.Ratings, Clipped]:
    """The run's ratings in [0, R]: a rating outside is refused (a DataError naming it), or
    clipped and counted with ``out_of_domain=clip``."""
    ratings = _read(cfg, gen)
    values, clipped = enforce(
        ratings.rating,
        domain(cfg),
        cfg.out_of_domain,
        field="rating",
        option="out_of_domain",
        widen=f"set bound >= {ratings.high:g} (R also bounds the embeddings)",
    )
    if clipped.count:
        ratings = mf.Ratings(
            ratings.user,
            ratings.item,
            values,
            ratings.n,
            ratings.m,
            float(values.min()),
            float(values.max()),
        )
    return ratings, clipped


def data_domain(cfg: FederatedMFConfig, members: str, per_user: bool) -> DataDomain:
    """Where the protected units live in the members' tables: a user's rows (``user_id``) for
    per-user privacy, one rating row for per-rating; each rating in [0, R]."""
    return DataDomain(
        (Field(("rating",), domain(cfg)),), members=members, key="user_id" if per_user else None
    )


def _read(cfg: FederatedMFConfig, gen: np.random.Generator) -> mf.Ratings:
    if cfg.data.path is None:
        return mf.synthetic_ratings(
            cfg.resolved_users(),
            cfg.items,
            density=cfg.resolved_density(),
            low=1.0,
            high=cfg.bound,
            rng=gen,
        )
    cols = (cfg.data.columns or {}).get("ratings", DEFAULT_COLUMNS)
    return mf.load_ratings(
        cfg.data.path, user=cols[0], item=cols[1], rating=cols[2], format=cfg.data.format
    )


def member_table(train: mf.Ratings, test: mf.Ratings) -> pa.Table:
    """A member's ratings, test then train (its last row is a training rating: the row a
    per-rating neighbour removes), with a ``split`` column its steps select on."""
    return pa.table(
        {
            "user_id": np.concatenate([test.user, train.user]),
            "item": np.concatenate([test.item, train.item]),
            "rating": np.concatenate([test.rating, train.rating]),
            "split": ["test"] * len(test) + ["train"] * len(train),
        }
    )
