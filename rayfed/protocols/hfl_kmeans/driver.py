"""The rounds of ``hfl-kmeans``: setup (group key, sizes, the server's public setup, the initial
centroids), t_max round trips of masked uploads and noisy aggregates (on the server, or around the
ring), and a last update that leaves every client with the final centroids."""

from __future__ import annotations

import time

import numpy as np

from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.hfl_kmeans import report
from rayfed.protocols.hfl_kmeans.config import DATA_INITS, HflKmeansConfig
from rayfed.protocols.hfl_kmeans.params import Params, Settings, Setup
from rayfed.protocols.hfl_kmeans.steps import (
    aggregate_step,
    data_init_step,
    iterate_step,
    prepare_step,
    ring_close_step,
    ring_step,
    setup_step,
    size_step,
)
from rayfed.secagg import pads
from rayfed.secagg.keys import agree_group_key


def drive(fed, cfg: HflKmeansConfig, plan: Plan) -> Outcome:
    params: Params = plan.params
    order = sorted(plan.parties)
    with fed.round(0):
        setup = _setup(fed, cfg, order, d=len(params.features))
    started = time.perf_counter()
    aggregate = None
    for t in range(1, setup.t_max + 1):
        with fed.round(t):
            uploads = fed.parties.run(iterate_step, aggregate, t=t, phase="assign-upload")
            if cfg.topology == "ring":
                aggregate = _ring(fed, setup, order, t).single()
            else:
                aggregate = _aggregate(fed, setup, uploads, t).single()
    with fed.round(setup.t_max + 1):
        final = fed.parties.run(iterate_step, aggregate, t=setup.t_max + 1, phase="update")
    seconds = time.perf_counter() - started
    outputs = {p: np.asarray(c) for p, c in fed.get(final, phase="outputs").items()}
    centers = outputs[order[0]]
    if not all(np.array_equal(c, centers) for c in outputs.values()):
        # every client unpads the same words: a difference is a protocol bug
        raise RuntimeError("the clients' final centroids differ")
    for note in report.notes(cfg, setup):
        fed.note(note)
    return report.outcome(cfg, params, setup, centers, seconds, plan.evaluation)


def _setup(fed, cfg: HflKmeansConfig, order: list[str], *, d: int) -> Setup:
    """The clients' group key, then the server (on the ring: the first client) learns N and
    derives the public setup; every client prepares its initial centroids."""
    ring = cfg.topology == "ring"
    agree_group_key(
        fed,
        order,
        purpose="group-key",
        slot="group_key",
        pair_info=pads.INFO_PAIRS if cfg.masking == "pairwise" else None,
    )
    host = fed.parties if ring else fed.coordinator
    sizes = fed.parties.run(size_step, to=order[0] if ring else "coordinator", phase="sizes")
    broadcast = host.run(
        setup_step, sizes, cfg=cfg, d=d, phase="setup", **({"members": [order[0]]} if ring else {})
    )
    setup = fed.get(broadcast.single())
    given = None
    if cfg.init in DATA_INITS:
        given = fed.parties.run(
            data_init_step, init=cfg.init, k=cfg.k, members=[order[0]], phase="init"
        ).single()
    fed.parties.run(
        prepare_step,
        broadcast.single(),
        given,
        settings=Settings.of(cfg),
        order=order,
        phase="prepare",
    )
    return setup


def _aggregate(fed, setup: Setup, uploads, t: int):
    if setup.noise:
        fed.charge([("clients", "discrete-Laplace noise on the padded aggregate", setup.event())])
    return fed.coordinator.run(aggregate_step, uploads, setup=setup, t=t, phase="aggregate")


def _ring(fed, setup: Setup, order: list[str], t: int):
    running = None
    if setup.noise and setup.honest is not None:
        label = f"split discrete-Laplace noise (ring, {setup.honest} honest clients)"
        fed.charge([("clients", label, setup.event())])
    for p in order:
        if setup.noise and setup.honest is None:
            fed.charge([(p, "local discrete-Laplace noise (ring)", setup.event())])
        running = fed.parties.run(ring_step, running, t=t, members=[p], phase="ring").single()
    return fed.parties.run(ring_close_step, running, members=[order[0]], phase="ring-close")
