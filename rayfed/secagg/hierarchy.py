"""Hierarchical secure aggregation: populations beyond one SecAgg+ instance.

Bonawitz et al., "Towards Federated Learning at Scale: System Design" (SysML 2019) describe a
Master Aggregator that hands a round's devices to several Aggregators, each running secure
aggregation over its own devices, the Master combining the Aggregators' results (the paper's
text was not at hand here: no section is cited). Here the registry is split into G contiguous groups of users (sizes as equal as possible); each group is
one :func:`~rayfed.secagg.secure_sum` round with its own :class:`RoundSpec` (the finder's graph
and threshold for its size, its own round number and so its own salt, dealer key and masks),
over the members that hold its users (``ids=``: a member holding users of several groups takes
part in each with only that group's users). The group sums are then combined in one of two
variants (:data:`VARIANTS`):

* ``revealed`` — every group's server is the master (the coordinator), which learns
  each group's sum and its survivors and adds the sums;
* ``secure`` — every group has its own aggregator, a server distinct from the master (an
  honest-but-curious server colluding neither with the master nor with another aggregator); it
  keeps its group's decoded sum in its own state (never returned to the driver), and the
  aggregators then run a second secure sum among themselves (one SecAgg user per group, the
  ``party_ids`` shape), aggregated by the master, which in ``mode=secure`` learns only the total
  and each group's survivor count (in ``dealer`` and ``simulation`` it holds what unmasks every
  input; ``plain`` is refused). Aggregator g runs on a cohort holding none of group g's users, a
  different one per group (:func:`place_aggregators`).

Every group round draws its dropout at the protocol's round (:class:`AtRound`), its own round
number keying only its salt, keys and masks; its spec addresses the transcript to its server and
its broadcasts to its members (``RoundSpec.server``, ``clients``).

A group whose round aborts (BelowThreshold: fewer survivors than its quorum) is dropped: the round
goes on with the other groups and the total misses that group's users (stated, see
:func:`server_learns`); only a round whose every group aborts raises BelowThreshold. In ``secure``
an aborted group's aggregator enters the zero vector in the second sum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rayfed.dropout import DropoutSchedule
from rayfed.errors import BelowThreshold
from rayfed.secagg import AggregationResult, secure_sum
from rayfed.secagg import server as server_steps
from rayfed.secagg.client import by_user
from rayfed.secagg.encoding import RingWords
from rayfed.secagg.group import Members, Server
from rayfed.secagg.spec import RoundSpec

VARIANTS = ("revealed", "secure")
#: where an aggregator keeps its group's sum (``secure``), by the group's round number
STATE_KEY = "hierarchy_sums"

__all__ = [
    "VARIANTS",
    "AtRound",
    "HierarchyResult",
    "group_rounds",
    "hierarchical_sum",
    "place_aggregators",
    "server_learns",
    "split_groups",
]


def split_groups(registry: np.ndarray, groups: int) -> list[np.ndarray]:
    """The registry in ``groups`` contiguous runs (by position), sizes differing by at most one."""
    return [np.asarray(g, dtype=np.int64) for g in np.array_split(np.asarray(registry), groups)]


def group_rounds(round: int, groups: int) -> tuple[list[int], int]:
    """Round numbers of protocol round ``round``: one per group, then the second-level sum's.
    Distinct across groups and rounds, so no two groups share a salt, a dealer key or masks (and a
    member's per-round state, keyed by round number, never collides)."""
    base = round * (groups + 1)
    return [base + g for g in range(groups)], base + groups


#: why the master can undo the second sum's masks outside mode=secure (flat runs' statements say it)
_NOT_PROTECTED = {
    "simulation": "every key and mask seed derives from the run's root seed, which the coordinator "
    "holds",
    "dealer": "the coordinator deals every mask seed",
}


def server_learns(
    variant: str,
    groups: int,
    dropped: Sequence[int] = (),
    *,
    mode: str = "secure",
    hosts: Sequence[str] | None = None,
) -> str:
    """What the master learns in ``variant`` under ``mode`` (derived from both, never written
    beside them); in ``secure``, the aggregators' placement ``hosts`` (group g's on ``hosts[g]``)
    and the trust assumed of them."""
    if variant not in VARIANTS:
        raise ValueError(f"hierarchy variant {variant!r} is none of {VARIANTS}")
    if variant == "secure" and mode == "plain":
        raise ValueError("hierarchy=secure with mode=plain sends every group's sum to the master")
    if variant == "revealed":
        learned = (
            f"the master (the coordinator, every group's SecAgg server) learns each of the "
            f"{groups} groups' sums and survivor sets, and their total"
        )
    elif mode != "secure":
        learned = (
            f"mode={mode} does NOT protect the group sums from the master: "
            f"{_NOT_PROTECTED[mode]}, so it can unmask each aggregator's input to the second sum "
            f"(each of the {groups} groups' sums), and the cohorts' masked inputs in the "
            "groups' rounds too; the run simulates the secure variant's messages only"
        )
    else:
        learned = (
            f"the master learns only the total over the {groups} groups and each group's "
            "participant count per phase (its survivor count among them); each group's sum and "
            "survivor set stay with its aggregator, which enters it in a second secure sum among "
            "the aggregators"
        )
        if groups == 2:
            learned += (
                " (with 2 groups the second sum's threshold is t = 1: either aggregator knows "
                "its own group's sum, so the total gives it the other's anyway)"
            )
    if variant == "secure":
        learned += (
            "; trust assumed: the aggregators are honest-but-curious, collude with no one (not "
            "the master, not another aggregator, not a user) and stay online"
        )
        if hosts is not None:
            where = ", ".join(f"group {g} on {h}" for g, h in enumerate(hosts))
            learned += (
                f"; each simulated on a cohort actor holding none of its group's users ({where})"
            )
    if dropped:
        missed = ", ".join(str(int(g)) for g in dropped)
        learned += f"; group(s) {missed} fell below their threshold and were dropped: the total misses their users"
    return learned


def place_aggregators(
    group_users: Sequence[np.ndarray], holders: Mapping[str, np.ndarray]
) -> list[str]:
    """A host per group for its aggregator (``hierarchy=secure``): a member of ``holders`` (name ->
    its users) holding none of the group's users, a different one per group (a bipartite
    matching, groups in order, candidates in name order); ValueError when none exists."""
    names = sorted(holders)
    candidates = []
    for users in group_users:
        candidates.append([n for n in names if not np.isin(np.asarray(holders[n]), users).any()])
    host_of: dict[str, int] = {}

    def assign(g: int, seen: set[str]) -> bool:
        for name in candidates[g]:
            if name in seen:
                continue
            seen.add(name)
            if name not in host_of or assign(host_of[name], seen):
                host_of[name] = g
                return True
        return False

    for g in range(len(group_users)):
        if not assign(g, set()):
            raise ValueError(f"no distinct cohort holding none of group {g}'s users is left")
    hosts = {g: name for name, g in host_of.items()}
    return [hosts[g] for g in range(len(group_users))]


@dataclass(frozen=True)
class AtRound(DropoutSchedule):
    """A group round's availability: ``schedule`` drawn at the protocol's round ``at``, whatever
    round number the group's spec carries (that number keys its salt, keys and masks only), so
    outages, Markov chains, diurnal cycles and traces hit the protocol's rounds, as in a flat run."""

    at: int = 0

    @classmethod
    def of(cls, schedule: DropoutSchedule, at: int) -> AtRound:
        fields = {f.name: getattr(schedule, f.name) for f in dataclasses.fields(DropoutSchedule)}
        return cls(**fields, at=at)

    def round(self, seed: int, round: int, ids: np.ndarray, *, latency: bool = True):
        return super().round(seed, self.at, ids, latency=latency)

    def simulated_seconds(self, seed: int, round: int, ids: np.ndarray) -> dict[str, float]:
        return super().simulated_seconds(seed, self.at, ids)


@dataclass
class HierarchyResult:
    """One hierarchical round: the total and what each level revealed to the master."""

    variant: str
    #: the decoded total and its ring words
    sum: np.ndarray
    words: np.ndarray
    #: each group's registry (contiguous runs of the whole registry's positions)
    group_users: list[np.ndarray]
    #: each group's |U3| (None: the group aborted); the master learns these in both variants
    group_counts: list[int | None]
    #: groups whose round aborted (below their threshold)
    dropped: list[int]
    #: each group's round (``revealed``: the full AggregationResult the master got; ``secure``: the
    #: result with ``sum``, ``words`` and ``survivors`` None, as they never left the aggregator);
    #: None for an aborted group
    group_results: list[AggregationResult | None]
    #: the second-level secure sum among the aggregators (``secure``; None in ``revealed``)
    top: AggregationResult | None = None
    #: per group, the phase its round aborted in (BelowThreshold's), None for a completed group
    abort_phases: list[str | None] | None = None
    #: the rounds' mode and (``secure``) each group's aggregator host: the statement derives from them
    mode: str = "secure"
    hosts: list[str] | None = None

    @property
    def group_sums(self) -> list[np.ndarray | None] | None:
        """The groups' decoded sums as the master knows them: ``revealed`` only (None in secure)."""
        if self.variant != "revealed":
            return None
        return [None if r is None else r.sum for r in self.group_results]

    @property
    def survivors(self) -> np.ndarray | None:
        """The users in the total, as the master knows them: ``revealed`` only."""
        if self.variant != "revealed":
            return None
        parts = [r.survivors for r in self.group_results if r is not None]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    @property
    def survivor_count(self) -> int:
        return int(sum(c for c in self.group_counts if c is not None))

    @property
    def server_learned(self) -> str:
        return server_learns(
            self.variant, len(self.group_users), self.dropped, mode=self.mode, hosts=self.hosts
        )


def hierarchical_sum(
    members: Members,
    member_users: Mapping[str, np.ndarray],
    group_specs: Sequence[RoundSpec],
    input_fn: Callable[..., Any],
    input_args: tuple = (),
    *,
    round: int,
    variant: str,
    master: Server,
    aggregators: Sequence[Server] | None = None,
    aggregator_members: Members | None = None,
    aggregator_hosts: Sequence[str] | None = None,
    top_spec: RoundSpec | None = None,
) -> HierarchyResult:
    """One hierarchical round over ``members`` (each holding ``member_users[name]``), group g run
    with ``group_specs[g]`` (its registry is the group's users). Every user's input is
    ``input_fn(ctx, round, ids, *input_args)`` at the protocol's ``round``, whatever the group's
    round number, so the users enter the same inputs as in one flat round.

    ``revealed``: every group is aggregated by ``master``. ``secure``: group g by
    ``aggregators[g]``, a one-member server on the actor ``aggregator_hosts[g]`` (a member of
    ``aggregator_members``); the second sum runs over ``aggregator_members`` (aggregator g is
    SecAgg user g of ``top_spec``, whose registry is ``arange(G)``), aggregated by ``master``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"hierarchy variant {variant!r} is none of {VARIANTS}")
    n_groups = len(group_specs)
    if variant == "secure" and (
        aggregators is None
        or aggregator_members is None
        or aggregator_hosts is None
        or top_spec is None
        or len(aggregators) != n_groups
        or len(aggregator_hosts) != n_groups
    ):
        raise ValueError(
            "hierarchy=secure needs an aggregator and its host per group, and top_spec"
        )
    results: list[AggregationResult | None] = []
    aborted: list[BelowThreshold] = []
    dropped: list[int] = []
    for g, spec in enumerate(group_specs):
        ids = _group_ids(member_users, spec.registry)
        server = master if variant == "revealed" else _Keeping(aggregators[g])
        # the transcript's addresses: the group's server, its broadcasts to the group's members
        spec = dataclasses.replace(
            spec,
            server=spec.server if variant == "revealed" else aggregator_hosts[g],
            clients=tuple(sorted(ids)),
        )
        try:
            result = secure_sum(
                _Subset(members, sorted(ids)),
                spec,
                _at_round_by_user if getattr(input_fn, "by_user", False) else _at_round,
                (input_fn, round, tuple(input_args)),
                server=server,
                ids=ids,
            )
        except BelowThreshold as err:
            dropped.append(g)
            aborted.append(err)
            results.append(None)
            continue
        results.append(result)
    if len(dropped) == n_groups:
        raise aborted[0]
    phases: list[str | None] = [None] * n_groups
    for g, err in zip(dropped, aborted, strict=True):
        phases[g] = err.phase
    counts = [None if r is None else int(r.counts["masked_input"]) for r in results]
    if variant == "revealed":
        words = np.zeros(group_specs[0].dim, dtype=np.uint64)
        for r in results:
            if r is not None:
                words = words + r.words.astype(np.uint64)
        enc = group_specs[0].encoding
        words = enc.reduce(words)
        return HierarchyResult(
            variant,
            enc.decode(words),
            words,
            [s.registry for s in group_specs],
            counts,
            dropped,
            results,
            mode=group_specs[0].mode,
            abort_phases=phases,
        )
    hosts = {}
    for g, host in enumerate(aggregator_hosts):
        hosts.setdefault(host, []).append(g)
    rounds = [s.round for s in group_specs]
    top = secure_sum(
        aggregator_members,
        dataclasses.replace(top_spec, clients=tuple(sorted(hosts))),
        group_words,
        (rounds, tuple(dropped), top_spec.dim),
        server=master,
        ids={h: np.array(gs, dtype=np.int64) for h, gs in hosts.items()},
    )
    return HierarchyResult(
        variant,
        top.sum,
        top.words,
        [s.registry for s in group_specs],
        counts,
        dropped,
        results,
        top,
        mode=group_specs[0].mode,
        hosts=list(aggregator_hosts),
        abort_phases=phases,
    )


def _group_ids(member_users: Mapping[str, np.ndarray], group: np.ndarray) -> dict[str, np.ndarray]:
    """Each member's users in ``group`` (members with none are left out of the group's round): a
    range test, as a group is a contiguous run of the sorted registry."""
    lo, hi = group[0], group[-1]
    out = {}
    for name in sorted(member_users):
        users = np.asarray(member_users[name], dtype=np.int64)
        mine = users[(users >= lo) & (users <= hi)]
        if mine.size:
            out[name] = np.sort(mine)
    return out


def _at_round(ctx, _group_round: int, ids: np.ndarray, input_fn, round: int, args: tuple):
    """The users' inputs of the protocol's ``round`` (not of their group's round number)."""
    return input_fn(ctx, round, ids, *args)


@by_user
def _at_round_by_user(ctx, _group_round: int, ids: np.ndarray, input_fn, round: int, args: tuple):
    """:func:`_at_round` for an ``input_fn`` marked :func:`~rayfed.secagg.client.by_user`: a
    group's users then stream in chunks, as in a flat round."""
    return input_fn(ctx, round, ids, *args)


# --- the aggregators (``secure``) ------------------------------------------------------------------
def keep_sum(ctx, spec: RoundSpec, replies: dict) -> dict:
    """The aggregator's last step: the server's ``finish``, its decoded words kept in the
    aggregator's state for the second sum; the reply (to the driver and on to the master) holds
    the counts and the public graph seed, not the sum nor the survivor set."""
    out = server_steps.finish(ctx, spec, replies)
    ctx.state.setdefault(STATE_KEY, {})[spec.round] = out["words"]
    return {
        "sum": None,
        "words": None,
        "survivors": None,
        "dropped_after_sharing": None,
        "counts": dict(out["counts"]),
        "graph_seed": out["graph_seed"],
    }


def group_words(ctx, round: int, ids: np.ndarray, rounds: Sequence[int], dropped: tuple, dim: int):
    """Aggregator ``g``'s input to the second sum (``ids`` are group indices): its group's kept
    words as ring words (the zero vector for a group that aborted); taken out of its state."""
    kept = ctx.state.get(STATE_KEY, {})
    rows = np.zeros((len(ids), dim), dtype=np.uint64)
    for i, g in enumerate(np.asarray(ids).tolist()):
        if g not in dropped:
            if rounds[g] not in kept:  # its actor restarted after the group's round: state lost
                raise RuntimeError(
                    f"the aggregator of group {g} no longer holds its group's sum (its actor was "
                    "restarted after the group's round): the second sum cannot include it"
                )
            rows[i] = kept.pop(rounds[g])
    return RingWords(rows)


@dataclass
class _Subset:
    """The members holding a group's users (``secure_sum`` runs its phases on these only)."""

    group: Members
    only: list[str]

    @property
    def names(self) -> list[str]:
        return list(self.only)

    def run(self, step, *args, phase: str, members=None, **kwargs):
        names = self.only if members is None else [n for n in members if n in self.only]
        return self.group.run(step, *args, phase=phase, members=names, **kwargs)


@dataclass
class _Keeping:
    """An aggregator that keeps its group's sum: its ``finish`` is :func:`keep_sum`."""

    server: Server

    def run(self, step, *args, phase: str, **kwargs):
        return self.server.run(step, *args, phase=phase, **kwargs)

    def scatter(self, step, *args, to, phase: str, **kwargs):
        return self.server.scatter(step, *args, to=to, phase=phase, **kwargs)

    def call(self, step, *args, phase: str, **kwargs):
        if step is not server_steps.finish:
            raise ValueError(f"an aggregator's call is finish, not {step.__name__}")
        return self.server.call(keep_sum, *args, phase=phase, **kwargs)
