"""The rounds of ``hfl-kmeans``: setup (group key, sizes, the server's public setup, the initial
centroids), t_max round trips of masked uploads and noisy aggregates (on the server, or around the
ring), and a last update that leaves every client with the final centroids."""

from __future__ import annotations

import time

import numpy as np

from rayfed.backends import PerMember
from rayfed.errors import BelowThreshold, PartyFailed
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.hfl_kmeans import report
from rayfed.protocols.hfl_kmeans.config import DATA_INITS, HflKmeansConfig
from rayfed.protocols.hfl_kmeans.params import (
    Params,
    Settings,
    Setup,
    malicious_coalition,
    sum_params,
)
from rayfed.protocols.hfl_kmeans.steps import (
    aggregate_step,
    data_init_step,
    deal_step,
    iterate_step,
    mpc_layer_step,
    mpc_start_step,
    prepare_step,
    release_step,
    ring_close_step,
    ring_step,
    secure_input,
    setup_step,
)
from rayfed.secagg import FixedPoint, make_spec, mpc, party_ids, secure_sum
from rayfed.secagg.keys import agree_group_key


def drive(fed, cfg: HflKmeansConfig, plan: Plan) -> Outcome:
    params: Params = plan.params
    setup = params.setup
    order = sorted(plan.parties)
    with fed.round(0):
        _setup(fed, cfg, setup, order)
    started = time.perf_counter()
    aggregate = None
    for t in range(1, setup.t_max + 1):
        with fed.round(t):
            uploads = fed.parties.run(iterate_step, aggregate, t=t, phase="assign-upload")
            if cfg.masking == "pairwise" and cfg.topology == "ring":
                _charge_ring(fed, setup, order, t)  # the clients' noise is in their uploads
                words = _secure_sum(fed, setup, order, t)
                aggregate = fed.coordinator.run(release_step, words, phase="release").single()
            elif cfg.masking == "pairwise":  # the padded uploads, summed securely
                uploads = {"secure-sum": _secure_sum(fed, setup, order, t)}
                aggregate = _aggregate(fed, setup, uploads, t).single()
            elif cfg.topology == "ring":
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


def _setup(fed, cfg: HflKmeansConfig, setup: Setup, order: list[str]) -> None:
    """The clients' group key, then the server (on the ring: the first client) broadcasts the
    public setup of the public N; every client prepares its initial centroids."""
    ring = cfg.topology == "ring"
    agree_group_key(fed, order, purpose="group-key", slot="group_key")
    host = fed.parties if ring else fed.coordinator
    broadcast = host.run(
        setup_step, setup=setup, phase="setup", **({"members": [order[0]]} if ring else {})
    )
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


def _aggregate(fed, setup: Setup, uploads, t: int):
    if setup.noise:
        fed.charge([setup.charge("clients", "discrete-Laplace noise on the padded aggregate")])
    return fed.coordinator.run(aggregate_step, uploads, setup=setup, t=t, phase="aggregate")


def _secure_sum(fed, setup: Setup, order: list[str], t: int) -> np.ndarray:
    """masking=pairwise: the parties' uploads (:func:`secure_input`) through the one secure sum
    (SecAgg on the complete graph over the parties, one user each, the coordinator relaying); the
    sum's words in Z_2^b. hfl-kmeans needs every client (its pads and its next iteration; the
    thesis aborts, [C] fail_together), so the quorum is M: a party lost at any phase ends the
    round before the unmask request (BelowThreshold in the server), and the run with PartyFailed
    naming it — the coordinator never reconstructs a sum of fewer than M uploads, which on the
    ring with split noise would carry only the survivors' noise shares, never charged."""
    spec = make_spec(
        round=t,
        mode="secure" if fed.randomness == "secure" else "simulation",
        registry=np.arange(len(order)),
        params=sum_params(len(order), setup.honest, setup.threat_model),
        encoding=FixedPoint(float(2 ** (setup.ring_bits - 1)), 0, setup.ring_bits),
        dim=setup.length,
        tag=b"hfl-kmeans",
        corrupt=malicious_coalition(len(order)) / len(order),
    )
    ids = party_ids(order)
    if setup.joint:
        _sample_noise(fed, setup, order, t)
    parties = _Watched(fed.parties)
    try:
        result = secure_sum(parties, spec, secure_input, (t,), server=fed.coordinator, ids=ids)
    except BelowThreshold as e:
        name = (parties.lost or ["a client"])[0]
        raise PartyFailed(
            name, t, "parties:secure-sum", f"dropped out of the secure sum: {e}"
        ) from e
    if result.failed_cohorts:  # unreachable with quorum M; kept as the last line of defence
        name = result.failed_cohorts[0]
        raise PartyFailed(name, t, "parties:secure-sum", "dropped out of the secure sum")
    return result.words


class _Watched:
    """The parties as :class:`~rayfed.secagg.group.Members`, recording whom each phase lost (the
    secure sum only counts them; hfl-kmeans names the first in its PartyFailed)."""

    def __init__(self, group):
        self.group, self.lost = group, []

    @property
    def names(self) -> list[str]:
        return self.group.names

    def run(self, step, *args, **kwargs):
        replies = self.group.run(step, *args, **kwargs)
        self.lost.extend(replies.failed)
        return replies


def _charge_ring(fed, setup: Setup, order: list[str], t: int) -> None:
    """The ring's charges, for the noise the clients added to their secure-sum uploads."""
    if setup.joint:
        label = "discrete-Laplace noise sampled in shares by the clients' MPC (ring, dealer)"
        fed.charge([setup.charge("clients", label)])
    elif setup.noise and setup.honest is not None:
        label = f"split discrete-Laplace noise (ring, {setup.honest} honest clients)"
        fed.charge([setup.charge("clients", label)])
    elif setup.noise:
        for p in order:
            fed.charge([setup.charge(p, "local discrete-Laplace noise (ring)")])


def _ring(fed, setup: Setup, order: list[str], t: int):
    _charge_ring(fed, setup, order, t)
    if setup.joint:
        _sample_noise(fed, setup, order, t)
    running = None
    for p in order:
        running = fed.parties.run(ring_step, running, t=t, members=[p], phase="ring").single()
    return fed.parties.run(ring_close_step, running, members=[order[0]], phase="ring-close")


def _sample_noise(fed, setup: Setup, order: list[str], t: int) -> None:
    """F2 (ring_noise=mpc): the dealer's correlated randomness, then the clients' AND layers and
    the B2A opening. The driver is the broadcast channel: it XORs each layer's opening shares and
    sends the opened values back; every client ends with its share of the noise."""
    dealt = fed.cohorts.scatter(
        deal_step, setup=setup, clients=order, t=t, to=order, phase="mpc-deal"
    )
    replies = fed.parties.run(mpc_start_step, PerMember(dealt), t=t, phase="mpc-and")
    layers = len(mpc.tree_widths(setup.noise[0].sampler.kappa))
    for layer in range(layers + 1):
        shares = fed.get(replies, phase="mpc-open")
        opened = mpc.xor_open([shares[p] for p in order])
        phase = "mpc-and" if layer < layers - 1 else "mpc-b2a"
        replies = fed.parties.run(mpc_layer_step, opened, t=t, phase=phase)
