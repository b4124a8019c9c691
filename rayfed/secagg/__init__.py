"""Secure aggregation (SecAgg, Bonawitz et al. CCS 2017; SecAgg+, Bell et al. CCS 2020) over
any group of members: simulated users held in UserCohortActors, or the parties (one user each).

The one recipe protocols use is :func:`secure_sum`: every member's users contribute a vector
(computed by ``input_fn`` inside the member), and the server learns the sum over the users
whose masked input arrived — nothing else — or the round ends with BelowThreshold. Driver calls
per phase are one per member, never one per user (:mod:`rayfed.secagg.group`).

Modes (same code path for the first two):

* ``secure``     — X25519 keys, self-mask seeds and Shamir randomness from the OS;
* ``simulation`` — the same code with all of these from the run's seeded streams, keyed by user id:
  reproducible, and *not* secure (anyone with the seed, the coordinator included, derives them);
* ``dealer``     — a trusted dealer (the coordinator) derives every self-mask and pairwise-mask
  seed from one key (AES as a PRF): the same mask structure without key agreement or secret
  sharing, for n >= 10^5; *not* secure against the server — a scale simulation;
* ``plain``      — no masking at all: an insecure baseline, labelled so in every output.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfed.dropout import DropoutSchedule
from rayfed.errors import ConfigError
from rayfed.secagg import client, phases
from rayfed.secagg import server as server_steps
from rayfed.secagg.client import by_user
from rayfed.secagg.encoding import FixedPoint, RingWords
from rayfed.secagg.group import Members, PerMember, Server, member_ids, party_ids
from rayfed.secagg.params import (
    THREAT_MODELS,
    SecAggParams,
    check_model,
    check_params,
    find_params,
)
from rayfed.secagg.spec import MODES, ProtocolViolation, RoundSpec, UnauthenticatedKeys

__all__ = [
    "MODES",
    "AggregationResult",
    "DropoutSchedule",
    "FixedPoint",
    "ProtocolViolation",
    "RingWords",
    "RoundSpec",
    "SecAggParams",
    "THREAT_MODELS",
    "UnauthenticatedKeys",
    "by_user",
    "check_params",
    "find_params",
    "make_spec",
    "party_ids",
    "secure_sum",
]


@dataclass
class AggregationResult:
    """The decoded sum of the survivors' inputs and what the round looked like."""

    sum: np.ndarray
    words: np.ndarray
    survivors: np.ndarray
    dropped_after_sharing: np.ndarray
    counts: dict[str, int]
    failed_cohorts: list[str]
    mode: str
    #: the neighbour graph's seed (the run's; in secure mode the server's OS draw, or with the
    #: consistency round the PKI's beacon)
    graph_seed: int

    @property
    def secure(self) -> bool:
        """Only ``secure`` mode protects the inputs from the server (see the module docstring)."""
        return self.mode == "secure"


def make_spec(
    *,
    round: int,
    mode: str,
    registry: np.ndarray,
    params: SecAggParams,
    encoding: FixedPoint,
    dim: int,
    dropout: DropoutSchedule | None = None,
    tag: bytes = b"rayfed",
    min_survivors: int | None = None,
    corrupt: float = 0.05,
) -> RoundSpec:
    """A round's public parameters; ``min_survivors`` can raise (never lower) the finder's quorum,
    e.g. to a protocol's own threshold such as LFL's ⌈(1-ω)n⌉ (under ``malicious`` the users
    themselves refuse a survivors list below it). The threat model is the one ``params`` were
    sized for (``params.threat_model``), so a round never claims a model its t was not sized
    for: ``find_params(..., threat_model="malicious")`` (t > (k + corrupt)/2) gives a round with
    the consistency round and the simulated PKI (signed keys, signed survivors lists), which need
    the users' own keys (secure and simulation modes only)."""
    threat_model = params.threat_model
    check_model(threat_model)
    if threat_model == "malicious" and mode not in ("secure", "simulation"):
        raise ConfigError(
            "threat_model",
            f"malicious needs the consistency round and the users' own keys, which mode "
            f"{mode!r} has none of",
            "mode=secure or mode=simulation, or threat_model=semi-honest",
        )
    quorum = (
        params.min_survivors if min_survivors is None else max(params.min_survivors, min_survivors)
    )
    return RoundSpec(
        round=round,
        mode=mode,
        registry=np.asarray(registry, dtype=np.int64),
        degree=params.degree,
        threshold=params.threshold,
        min_survivors=quorum,
        complete=params.complete,
        encoding=encoding,
        dim=dim,
        dropout=dropout or phases.schedule(),
        tag=tag,
        threat_model=threat_model,
        corrupt_users=math.ceil(corrupt * len(registry)),
    )


def _beacon(spec: RoundSpec) -> int | None:
    """The neighbour graph's seed in a secure consistency round: the simulated PKI's public
    randomness, drawn from the OS once every user has advertised and handed to the server and to
    every user alike. A server that drew the seed itself could try seeds until a victim's
    neighbours were all corrupt; the users refuse a key table whose seed is not the beacon's.
    Elsewhere there is no PKI, and the server picks the seed (``server._graph_seed``)."""
    if not (spec.consistency and spec.mode == "secure"):
        return None
    return int.from_bytes(os.urandom(8), "little")


def secure_sum(
    group: Members,
    spec: RoundSpec,
    input_fn: Callable[..., Any],
    input_args: tuple = (),
    *,
    server: Server,
    ids: Mapping[str, Any] | None = None,
    after_phase: Callable[[str], None] | None = None,
    shards: Members | None = None,
) -> AggregationResult:
    """Run one aggregation round over ``group``'s members (:class:`~rayfed.secagg.group.Members`:
    the user cohorts, or the parties), aggregated by ``server`` (the coordinator).
    ``input_fn(ctx, round, user_ids, *input_args)`` returns the (users x dim) inputs of a member's
    surviving users: values (floats or integers, fixed-point encoded), or :class:`RingWords` (words
    of the ring Z_2^b, in [0, 2^b), summed as they are).

    A member holds the users it registered (``meta["users"]``, else its table's ``user_id``s);
    ``ids`` gives each member its user ids instead — ``party_ids(order)`` makes every party one
    user, its index in ``order``.

    A member that dies (or misses a deadline) turns its users into dropouts at that phase;
    the round completes if enough users survive, else raises BelowThreshold. ``after_phase(name)``,
    if given, is called after each client phase (benchmarks use it to sample memory).

    ``shards`` (the federation's server shards, when it has two or more) split the server's
    reconstruction and mask removal by user range; the sum is bit-identical to the coordinator's
    alone. A shard that fails is a server failure: the round ends with its name.
    """
    failed: list[str] = []

    def alive() -> list[str]:
        return [n for n in group.names if n not in failed]

    def client_phase(step, *args, phase: str, **scatter):
        """``step`` on the members still alive; a member that fails becomes a dropout."""
        replies = group.run(
            step, spec, *args, phase=phase, members=alive(), on_failure="drop", **scatter
        )
        failed.extend(replies.failed)
        if after_phase is not None:
            after_phase(phase)
        return replies

    keys = client_phase(client.advertise, *_ids_arg(ids), phase="advertise")
    beacon = _beacon(spec)
    table = server.run(server_steps.collect_keys, spec, keys, beacon=beacon, phase="collect_keys")
    # the simulated PKI: in a consistency round the cohorts get the advertise replies (and the
    # beacon) themselves (the driver stands for a trusted directory of signing keys and a public
    # randomness beacon), not through the coordinator
    pki = (keys, beacon) if spec.consistency else ()
    sharded = shards is not None and len(shards.names) >= 2
    # shard-<i> (by its index i) owns the user positions server.bounds(n, S, i): it routes the
    # shares they receive and reconstructs their secrets
    ranges = server_steps.shard_ranges(spec.n, shards.names) if sharded else {}
    if sharded:
        shares = client_phase(
            client.share_keys_split,
            table.single(),
            *pki,
            ranges=ranges,
            phase="share_keys",
            scatter_to=list(ranges),
        )
        u2, parts = _route_sharded(spec, shares, ranges, alive(), server, shards)
        masked = client_phase(
            client.masked_input_parts,
            u2.single(),
            PerMember(parts),
            input_fn,
            tuple(input_args),
            phase="masked_input",
        )
    else:
        shares = client_phase(client.share_keys, table.single(), *pki, phase="share_keys")
        routed = server.scatter(
            server_steps.route_shares, spec, shares, to=alive(), phase="route_shares"
        )
        masked = client_phase(
            client.masked_input,
            PerMember(routed),
            input_fn,
            tuple(input_args),
            phase="masked_input",
        )
    request = server.run(server_steps.collect_masked, spec, masked, phase="collect_masked")
    if spec.consistency:
        signed = client_phase(client.consistency, request.single(), phase="consistency")
        request = server.run(
            server_steps.collect_signatures, spec, signed, phase="collect_signatures"
        )
    if sharded:  # every cohort sends each shard only the shares whose owner it owns
        answers = client_phase(
            client.unmask_split, request.single(), ranges, phase="unmask", scatter_to=list(ranges)
        )
        out = _finish_sharded(spec, answers, ranges, server, shards)
    else:
        answers = client_phase(client.unmask, request.single(), phase="unmask")
        out = server.call(server_steps.finish, spec, answers, phase="reconstruct")
    return AggregationResult(failed_cohorts=sorted(failed), mode=spec.mode, **out)


def _route_sharded(spec: RoundSpec, shares, ranges: dict, alive: list, server, shards):
    """Route shares on a sharded server: each shard forwards the shares its users receive to the
    receivers' cohorts and counts U2, which the coordinator checks and broadcasts. Returns (U2's
    broadcast, each cohort's parts by shard)."""
    cohort_of = server.run(server_steps.route_context, spec, phase="route_context")
    parts = {name: {c: shares.payloads[c][name] for c in shares.names()} for name in ranges}
    routed = shards.run(
        server_steps.shard_route,
        spec,
        cohort_of.single(),
        PerMember(parts),
        PerMember(ranges),
        phase="route_shares",
        scatter_to=[*alive, "coordinator"],
    )
    u2 = server.run(
        server_steps.collect_u2,
        spec,
        {name: routed.payloads[name]["coordinator"] for name in ranges},
        phase="collect_u2",
    )
    to_cohorts = {c: {name: routed.payloads[name][c] for name in ranges} for c in alive}
    return u2, to_cohorts


def _finish_sharded(spec: RoundSpec, answers, ranges: dict, server: Server, shards: Members):
    """The sharded server's finish: each shard gets every cohort's shares of its owners only and
    answers one partial mask correction; the coordinator subtracts them from y_sum."""
    view = server.run(server_steps.finish_context, spec, phase="finish_context")
    parts = {
        name: {cohort: answers.payloads[cohort][name] for cohort in answers.names()}
        for name in ranges
    }
    partials = shards.run(
        server_steps.shard_finish,
        spec,
        view.single(),
        PerMember(parts),
        PerMember(ranges),
        phase="reconstruct",
    )
    return server.call(server_steps.finish_sharded, spec, partials, phase="finish")


def _ids_arg(ids: Mapping[str, Any] | None) -> tuple:
    """advertise's extra argument: each member its own user ids, or nothing (its registered
    users), so that the cohorts' call is the one it always was."""
    return () if ids is None else (member_ids(ids),)
