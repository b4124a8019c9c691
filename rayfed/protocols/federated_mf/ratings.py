"""The run's ratings, shared by both settings' plans: loaded or generated, checked against R, and
laid out as the members' tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayfed import mf
from rayfed.errors import ConfigError
from rayfed.protocols.federated_mf.config import FederatedMFConfig

#: a ratings file's (user, item, rating) columns unless ``data.columns.ratings`` names them
DEFAULT_COLUMNS = ["user_id", "item_id", "rating"]


def load(cfg: FederatedMFConfig, gen: np.random.Generator) -> mf.Ratings:
    """The run's ratings, checked to lie in [0, R]: every sensitivity bound depends on it."""
    ratings = _read(cfg, gen)
    if ratings.low < 0 or ratings.high > cfg.bound:
        raise ConfigError(
            "bound",
            f"ratings span [{ratings.low}, {ratings.high}] but R = {cfg.bound}",
            f"bound >= {ratings.high} (the clipping argument needs ratings in [0, R])",
        )
    return ratings


def _read(cfg: FederatedMFConfig, gen: np.random.Generator) -> mf.Ratings:
    if cfg.data.path is None:
        return mf.synthetic_ratings(
            cfg.users, cfg.items, density=cfg.density, low=1.0, high=cfg.bound, rng=gen
        )
    cols = (cfg.data.columns or {}).get("ratings", DEFAULT_COLUMNS)
    return mf.load_ratings(
        cfg.data.path, user=cols[0], item=cols[1], rating=cols[2], format=cfg.data.format
    )


def member_table(train: mf.Ratings, test: mf.Ratings) -> pa.Table:
    """A member's ratings, train then test, with a ``split`` column its steps select on."""
    return pa.table(
        {
            "user_id": np.concatenate([train.user, test.user]),
            "item": np.concatenate([train.item, test.item]),
            "rating": np.concatenate([train.rating, test.rating]),
            "split": ["train"] * len(train) + ["test"] * len(test),
        }
    )
