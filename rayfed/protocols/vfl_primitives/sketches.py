"""The sketch family of ``vfl-primitives``: the shared Gaussian sketch G, the round in which every
server releases G A^(j) + N(0, σ²) (l2-moment, lowrank, regression), and the tasks lowrank
(Alg. 4) and regression (E.2). lowrank's input-perturbation baseline (spec §4.4) releases
A^(j) + N(0, σ²) instead, without a sketch."""

from __future__ import annotations

import numpy as np

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.data.scaling import features_of
from rayfed.errors import ConfigError
from rayfed.privacy import Measurement
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.vfl_primitives import report
from rayfed.protocols.vfl_primitives.config import VflPrimitivesConfig
from rayfed.protocols.vfl_primitives.params import (
    PerturbationParams,
    SketchParams,
    column_norm_bound,
)

LABEL_SERVER = "labels"
SKETCH_CHUNK = 8192


# --- the shared sketch G (public: from the run seed, never from data) ------------------------------
def sketch_block(seed: int, attempt: int, s: int, start: int, stop: int) -> np.ndarray:
    """Columns start..stop of the shared sketch G (draw ``attempt``), from the public seed."""
    return rng.stream(seed, "sketch", attempt, ("gaussian-sketch", start)).standard_normal(
        (s, stop - start)
    )


def sketch_multiply(seed: int, attempt: int, s: int, a: np.ndarray) -> np.ndarray:
    """G·A without holding G: chunk by chunk of users."""
    out = np.zeros((s,) + a.shape[1:])
    for start in range(0, a.shape[0], SKETCH_CHUNK):
        stop = min(start + SKETCH_CHUNK, a.shape[0])
        out += sketch_block(seed, attempt, s, start, stop) @ a[start:stop]
    return out


def passing_sketch(seed: int, s: int, m: int, max_attempts: int = 100) -> tuple[int, float]:
    """The first draw of G whose column norms pass Lemma E.2's test (public and data-independent,
    so redrawing costs no privacy), and its largest column norm."""
    bound = column_norm_bound(s, m)
    for attempt in range(max_attempts):
        largest = max(
            float(
                np.sqrt(
                    (sketch_block(seed, attempt, s, a, min(a + SKETCH_CHUNK, m)) ** 2).sum(0)
                ).max()
            )
            for a in range(0, m, SKETCH_CHUNK)
        )
        if largest <= bound:
            return attempt, largest
    raise ConfigError(
        "sketch_size", f"no sketch passed the column-norm test in {max_attempts} draws"
    )


# --- servers ---------------------------------------------------------------------------------------
def sketch_step(
    ctx: StepContext, *, s: int, attempt: int, releases: dict[str, Measurement]
) -> Message:
    """Server: G A^(j) + N(0, σ²) per entry, σ = z·Δ₂ of its release (the label server: G b + n)."""
    sketch = sketch_multiply(ctx.seed, attempt, s, features_of(ctx.table, ctx.meta["columns"]))
    noisy, event = releases[ctx.name](ctx.noise, sketch)
    return Message("noisy_sketch", noisy, dp_event=event)


def perturbed_rows_step(ctx: StepContext, *, releases: dict[str, Measurement]) -> Message:
    """Server (input-perturbation baseline): A^(j) + N(0, σ²) per entry, σ = z·Δ₂ — every row,
    m x d^(j) reals."""
    rows = features_of(ctx.table, ctx.meta["columns"])
    noisy, event = releases[ctx.name](ctx.noise, rows)
    return Message("noisy_rows", noisy, dp_event=event)


# --- the coordinator -------------------------------------------------------------------------------
def lowrank_step(
    ctx: StepContext, sketches: dict[str, np.ndarray], *, order: list[str], k: int
) -> np.ndarray:
    """CC (Alg. 4): the top-k right singular vectors of [G A^(1) + N^(1) | …]."""
    blocks = [np.asarray(sketches[p]) for p in order]
    _, _, vt = np.linalg.svd(np.hstack(blocks), full_matrices=False)
    return vt[:k].T


def regression_step(
    ctx: StepContext, sketches: dict[str, np.ndarray], *, order: list[str]
) -> np.ndarray:
    """CC (E.2): least squares of the noisy label sketch on the concatenated noisy sketches."""
    features = np.hstack([np.asarray(sketches[p]) for p in order])
    labels = np.asarray(sketches[LABEL_SERVER])[:, 0]
    return np.linalg.lstsq(features, labels, rcond=None)[0]


# --- the rounds ------------------------------------------------------------------------------------
def sketch_round(fed, params: SketchParams, senders: list[str], combine, **kwargs):
    """Round 0 of every sketch task: each sender's noisy sketch, combined by the CC's ``combine``."""
    with fed.round(0):
        fed.charge([params.releases[q].charge(q) for q in senders])
        sketches = fed.parties.run(
            sketch_step,
            s=params.s,
            attempt=params.attempt,
            releases=params.releases,
            members=senders,
            phase="sketch",
        )
        return fed.coordinator.call(
            combine, sketches, order=params.order, phase="combine", **kwargs
        )


def perturbation_round(fed, params: PerturbationParams, k: int) -> np.ndarray:
    """Input perturbation (spec §4.4): every server's noisy rows; the CC's top-k right singular
    vectors of [A^(1) + N^(1) | …] (the same combination as Alg. 4's, without the sketch)."""
    with fed.round(0):
        fed.charge([params.releases[q].charge(q) for q in params.order])
        rows = fed.parties.run(perturbed_rows_step, releases=params.releases, phase="noisy-rows")
        return fed.coordinator.call(lowrank_step, rows, order=params.order, k=k, phase="combine")


def drive(fed, cfg: VflPrimitivesConfig, plan: Plan) -> Outcome:
    """lowrank or regression: one sketch round (regression adds the label server's sketch)."""
    params: SketchParams = plan.params
    if cfg.baseline == "input-perturbation":
        v_mat = perturbation_round(fed, plan.params, cfg.k)
        fed.note(report.perturbation_note(cfg, plan.params))
        return report.perturbation_outcome(cfg, plan.params, v_mat, plan.evaluation)
    if cfg.task == "lowrank":
        v_mat = sketch_round(fed, params, params.order, lowrank_step, k=cfg.k)
        fed.note(report.sigma_note(cfg, params))
        noiseless = None
        if plan.evaluation is not None:  # spec §4.4's non-private baseline: the same G, no noise
            sketch = sketch_multiply(fed.seed, params.attempt, params.s, plan.evaluation.a)
            noiseless = np.linalg.svd(sketch, full_matrices=False)[2][: cfg.k].T
        return report.lowrank_outcome(cfg, params, v_mat, plan.evaluation, noiseless)
    x = sketch_round(fed, params, [*params.order, LABEL_SERVER], regression_step)
    fed.note(report.sigma_note(cfg, params))
    fed.note(report.ridge_note(params))
    return report.regression_outcome(cfg, params, x, plan.evaluation)
