"""The run's ratings, shared by both settings' plans: loaded or generated, checked against R, and
laid out as the members' tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayfed import mf, rng
from rayfed.data import load_table, require_clean, require_columns
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


@dataclass(frozen=True)
class PublicShape:
    """What a run already takes as public about its ratings (the plans' ``TAKEN_AS_PUBLIC``): the
    number of users n, of items m and of ratings; and the configuration's rating scale
    [low, high] = [1, R] — R is the run's ``bound``, 1 the low end the project's generator uses
    for a generated data set (``_read``), so a stand-in of generated data has its scale, and a
    stand-in of a 1–5 star file at R = 5 the stars' (0, the domain's low end, where R <= 1). The
    parties' shares of the users or items follow from n, m and the seed (the plans deal them by
    the run's seed), so a stand-in of the same shape gets the same split sizes. No rating value
    (not even the data's min or max), no user's count and no (user, item) pair is in it."""

    users: int
    items: int
    ratings: int
    low: float
    high: float


def public_shape(cfg: FederatedMFConfig, gen: np.random.Generator) -> PublicShape:
    """The public shape of the run's ratings, read from the user and item columns alone (a file's
    rating column is dropped unread; a generated data set is the generator's, from ``gen``), with
    the scale from the configuration."""
    if cfg.data.path is None:
        ratings = _read(cfg, gen)
        users, items, count = ratings.n, ratings.m, len(ratings)
    else:
        keys = (cfg.data.columns or {}).get("ratings", DEFAULT_COLUMNS)[:2]
        table = load_table(cfg.data.path, cfg.data.format)
        require_columns(table, keys, "data.columns")
        table = table.select(keys)  # the rating column goes here, unread
        require_clean(table, keys)
        users, items = (int(pc.count_distinct(table.column(key)).as_py()) for key in keys)
        count = table.num_rows
    return PublicShape(users, items, count, 1.0 if cfg.bound > 1 else 0.0, float(cfg.bound))


def stand_in(shape: PublicShape, seed: int) -> mf.Ratings:
    """Synthetic ratings of the public ``shape`` from the project's generator, drawn from the
    ``public-tuning`` stream of ``seed``: a knob tuned on them reads nothing private."""
    return mf.synthetic_ratings(
        shape.users,
        shape.items,
        count=shape.ratings,
        low=shape.low,
        high=shape.high,
        rng=rng.stream(seed, "public-tuning", 0, "federated-mf"),
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
