"""Public tuning for federated-mf: a knob (a learning rate, a clip, a number of alternations) picked
on a synthetic stand-in of the private ratings' public shape, never on the private ratings.

A pick by the private data's training MSE is a release of the private data that no ledger charges
(issue 30): the tuned run's true ε exceeds its stated one. Here the candidates run on
:func:`~rayfed.protocols.federated_mf.ratings.stand_in` ratings — the project's generator at the
same number of users, items and ratings (what the plans already take as public, counted from the
user and item columns alone) on the configuration's scale [1, R] (never the data's min or max),
drawn from the run seed's ``public-tuning`` stream — and the pick is the candidate of
lowest test MSE there. The caller then runs once on the private data with the picked knob, and
that run's guarantee is its own: the pick read nothing private. Records say
``tuning: "public (synthetic stand-in of the same public shape)"``.

    tuned = tune(options, [{"vfl_lr": lr} for lr in (0.05, 0.2, 0.5)])
    result = rayfed.run("federated-mf", **options, **tuned.picked)
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv

from rayfed import api, rng
from rayfed.errors import ConfigError
from rayfed.protocols.federated_mf import ratings as ratings_data

#: what a record says of a knob picked here
TUNING = "public (synthetic stand-in of the same public shape)"
#: the options that say where the private ratings are; a stand-in run replaces them
_DATA_OPTIONS = ("data", "users", "items", "density")


@dataclass(frozen=True)
class Tuned:
    """The picked candidate, every candidate's stand-in scores (``grid``) and the shape used."""

    picked: dict
    grid: list[dict]
    shape: ratings_data.PublicShape


def public_shape(options: dict) -> ratings_data.PublicShape:
    """The public shape of the ratings the run of ``options`` would read: n, m and the number of
    ratings from the user and item columns alone (or the generated data set), the scale [1, R]
    from the configuration."""
    return _resolve(options)[0]


def _resolve(options: dict) -> tuple[ratings_data.PublicShape, int]:
    """The public shape of ``options``' ratings and the run's seed (the one its plan uses)."""
    _, run_opts, cfg = api.resolve("federated-mf", **options)
    if cfg.split_column is not None:
        raise ConfigError(
            "split_column",
            "public tuning deals the stand-in's items by the seed; a column split has no stand-in",
            "drop split_column, or give the knob instead of tuning it",
        )
    gen = rng.stream(run_opts.seed, "synthetic", 0, "federated-mf")  # as the plan generates
    return ratings_data.public_shape(cfg, gen), run_opts.seed


def tune(options: dict, candidates: list[dict], *, score: str = "test_mse") -> Tuned:
    """The candidate (options laid over ``options``) of lowest ``score`` on a stand-in of the
    public shape of the ratings ``options`` name; ``grid`` holds every candidate's stand-in
    test and training MSE. Nothing here reads a private rating's value."""
    if not candidates:
        raise ConfigError("tuning", "no candidates to tune over", "give at least one value")
    shape, seed = _resolve(options)
    stand_in = ratings_data.stand_in(shape, seed)
    base = {k: v for k, v in options.items() if k not in _DATA_OPTIONS}
    grid = []
    with tempfile.TemporaryDirectory(prefix="rayfed-stand-in-") as tmp:
        path = Path(tmp) / "stand_in.csv"
        pyarrow.csv.write_csv(
            pa.table(
                {
                    "user_id": stand_in.user,
                    "item_id": stand_in.item,
                    "rating": stand_in.rating,
                }
            ),
            path,
        )
        for candidate in candidates:
            run = {**base, **candidate, "data": {"path": str(path)}, "out_dir": None}
            metrics = api.run("federated-mf", **run).metrics
            grid.append(
                {
                    **candidate,
                    "stand_in_test_mse": metrics["test_mse"],
                    "stand_in_train_mse": metrics.get("train_mse"),
                }
            )
    best = min(range(len(grid)), key=lambda i: grid[i][f"stand_in_{score}"])
    return Tuned(dict(candidates[best]), grid, shape)
