"""Protocol plumbing: the interface a protocol module implements and the result of a run.

A protocol is one module in ``rayfed/protocols/`` with a config dataclass, pure step functions for
each role, and a subclass of :class:`Protocol` with:

* ``examples``: small configurations of its main modes (the conformance suite runs on them);
* ``data_bytes(cfg)``: the memory its data will take, checked before anything is built;
* ``resolve_randomness(cfg, randomness)``: where an option of its own names a key source;
* ``plan(cfg, seed)`` loads or generates the data, checks it against the config, partitions it
  and declares its privacy (:class:`~rayfed.privacy.declaration.PrivacyDeclaration`: the budget,
  accountant, relation and every release as a Measurement) — everything that can fail on bad
  input, before any actor starts;
* ``drive(fed, cfg, plan)`` runs the rounds on a started :class:`~rayfed.federation.Federation`
  and returns an :class:`Outcome` (tables and metrics).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from rayfed.errors import ConfigError
from rayfed.privacy.declaration import PrivacyDeclaration
from rayfed.privacy.ledger import PrivacyReport


@dataclass
class Plan:
    """Everything a run needs before its actors start.

    ``evaluation`` holds ground truth computed from the raw data for the result's error metrics;
    it is never given to an actor and never part of the protocol's transcript.
    """

    #: the budget, accountant, relation, composition, statement and releases, checked
    #: (PrivacyDeclaration.validate) before any actor or run directory exists
    privacy: PrivacyDeclaration
    parties: dict[str, tuple[pa.Table, dict]] = field(default_factory=dict)
    cohorts: dict[str, tuple[pa.Table, dict]] = field(default_factory=dict)
    rounds: int = 1
    #: times a dead cohort actor is restarted (its constructor re-run on its partition, so its
    #: state is rebuilt from the seed): only where cohorts keep no state across rounds
    cohort_restarts: int = 0
    #: server-shard actors splitting the server's per-round work (1: the coordinator alone)
    server_shards: int = 1
    evaluation: Any = None
    #: everything resolved at planning time, as the protocol's frozen, typed Params
    params: Any = None
    #: options the run uses at another value than asked, each {option, asked, used, why}: stated
    #: once in the summary and recorded in the manifest (``adjusted``)
    adjusted: list[dict[str, Any]] = field(default_factory=list)
    #: what the run used of an input that applies only in part (option -> record, e.g. the
    #: population trace's coverage): recorded in the manifest (``inputs``)
    inputs: dict[str, Any] = field(default_factory=dict)


def adjusted(option: str, asked: Any, used: Any, why: str) -> dict[str, Any]:
    """One entry of :attr:`Plan.adjusted`."""
    return {"option": option, "asked": asked, "used": used, "why": why}


@dataclass
class Outcome:
    """What a driver returns: result tables (written as Parquet) and scalar metrics."""

    tables: dict[str, pa.Table]
    metrics: dict[str, Any] = field(default_factory=dict)
    headline: str = ""
    #: more lines for the summary under the headline (baselines, a learning curve)
    details: list[str] = field(default_factory=list)


@dataclass
class Result:
    """The result of one run: output, metrics, privacy actually spent, transcript and timings."""

    protocol: str
    run_id: str
    seed: int
    config: dict[str, Any]
    tables: dict[str, pa.Table]
    metrics: dict[str, Any]
    privacy: PrivacyReport
    transcript: pa.Table
    transcript_totals: dict[str, Any]
    timings: list[dict[str, Any]]
    seconds: float
    headline: str = ""
    run_dir: str | None = None
    #: member -> digests of its noise releases (NoiseSource.fingerprints): compare two runs'
    #: noise without exposing it; in memory only, never written to the run directory
    noise_fingerprints: dict[str, list[str]] = field(default_factory=dict, repr=False)
    details: list[str] = field(default_factory=list)
    #: options used at another value than asked (:attr:`Plan.adjusted`)
    adjusted: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        """A few lines for the end of a CLI run."""
        totals = self.transcript_totals
        lines = [
            f"{self.protocol} run {self.run_id} (seed {self.seed})",
            f"  result:  {self.headline}" if self.headline else None,
            *(f"           {line}" for line in self.details),
            *adjusted_lines(self.adjusted),
            *round_lines(self.metrics.get("per_round") or []),
            *loss_lines(self.metrics.get("losses") or []),
            f"  privacy: {self.privacy.summary()}",
            *(f"           {note}" for note in self.privacy.notes),
            f"  noise:   {self.privacy.randomness_statement}",
            f"  time:    {self.seconds:.2f} s",
            "  phases:  "
            + ", ".join(f"{k} {v:.2f} s" for k, v in self.metrics["phase_seconds"].items())
            if "phase_seconds" in self.metrics
            else None,
            f"  moved:   {totals['bytes']:,} bytes in {totals['messages']} messages",
            f"  output:  {self.run_dir}" if self.run_dir else None,
        ]
        return "\n".join(line for line in lines if line is not None)


def adjusted_lines(entries: list[dict[str, Any]]) -> list[str]:
    """The summary's lines for options used at another value than asked."""
    return [
        f"  {'adjusted:' if i == 0 else '':<9} {e['option']}={e['asked']} asked, "
        f"{e['used']} used: {e['why']}"
        for i, e in enumerate(entries)
    ]


#: rounds listed one by one in the summary up to this many; beyond, the first, the last and every
#: round that lost a member
ROUND_LINES = 10


def round_lines(per_round: list[dict[str, Any]]) -> list[str]:
    """The summary's per-round lines (what each round recorded: survivors, dropouts, members lost
    in it) when the run had more than one round."""
    if len(per_round) < 2:
        return []
    last = per_round[-1]["round"]
    shown = [
        row
        for row in per_round
        if len(per_round) <= ROUND_LINES or row.get("lost") or row["round"] in (0, last)
    ]
    lines = []
    for row in shown:
        items = [
            f"{k.replace('_', ' ')} {_value(v)}"
            for k, v in row.items()
            if k not in ("round", "lost") and v is not None
        ]
        if row.get("lost"):
            items.append("lost " + ", ".join(row["lost"]))
        lines.append(f"round {row['round']}: " + ", ".join(items))
    if len(shown) < len(per_round):
        lines.append(
            f"({len(per_round) - len(shown)} more rounds without a loss: metrics.per_round)"
        )
    return [f"  {'rounds:' if i == 0 else '':<9}{line}" for i, line in enumerate(lines)]


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def loss_lines(losses: list[dict[str, Any]]) -> list[str]:
    """The summary's lines on members that died, one each, with their fate."""
    lines = []
    for x in losses:
        users = f", {x['users']} users" if x.get("users") is not None else ""
        fate = x["fate"]
        if fate == "resumed":
            again = (
                "the same phase re-run"
                if (x["back_round"], x["back_phase"]) == (x["round"], x["phase"])
                else f"back in round {x['back_round']} at {x['back_phase']}"
            )
            source = " from its checkpoint" if x.get("restored") == "checkpoint" else ""
            fate = f"resumed{source} ({again})"
        elif fate == "died again":
            fate = "restarted, and died again before it answered (next line)"
        elif fate == "not reported":
            fate = "restarted, but not asked again before the run ended (not in what followed)"
        else:
            fate = "dropped for good (dead for the rest of the run)"
        lines.append(
            f"{x['role']} {x['member']}{users} died in round {x['round']} at {x['phase']}: {fate}"
        )
    return [f"  {'lost:' if i == 0 else '':<9}{line}" for i, line in enumerate(lines)]


class Protocol:
    """Base of every protocol; subclasses set the class attributes and implement plan and drive."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Config: ClassVar[type]
    #: small, fast configurations covering the protocol's main modes (a second each, locally):
    #: tests/conformance runs every check on them, so a new protocol is checked by declaring these
    examples: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    #: the phase names its parties and cohorts run (``--fail ...@phase=P`` must name one);
    #: None: not checked
    phases: ClassVar[tuple[str, ...] | None] = None

    def resolve_randomness(self, cfg: Any, randomness: str) -> tuple[Any, str]:
        """(config, the run's randomness) once the run option ``randomness`` and the protocol's own
        options are reconciled: a protocol whose option asks for secure keys (e.g. secure-sum's
        ``mode=secure``) makes the run secure; a secure run makes its keys secure too."""
        return cfg, randomness

    def data_bytes(self, cfg: Any) -> int:
        """An estimate, from the config alone, of the memory the run's data takes (tables, the
        users' vectors, grids, n x n matrices): checked against the machine or cluster before
        ``plan`` builds anything. Scales with every option marked ``size``."""
        return 0

    def plan(self, cfg: Any, seed: int) -> Plan:
        raise NotImplementedError

    def drive(self, fed, cfg: Any, plan: Plan) -> Outcome:
        raise NotImplementedError

    def check_faults(self, cfg: Any, faults: list) -> None:
        """Refuse (ConfigError naming ``fail``) ``--fail`` faults the config cannot run with;
        called with the parsed faults before any actor starts."""


def reconcile_randomness(
    cfg: Any,
    randomness: str,
    option: str,
    *,
    upgrade: tuple[str, ...],
    refused: tuple[str, ...] = (),
) -> tuple[Any, str]:
    """For a protocol option that names where its keys come from: the value ``"secure"`` makes the
    run secure; in a secure run the values in ``upgrade`` (seeded keys) become ``"secure"``, and
    those in ``refused`` (keys derived from the run seed by design) are a ConfigError."""
    value = getattr(cfg, option)
    if value == "secure":
        return cfg, "secure"
    if randomness != "secure":
        return cfg, randomness
    if value in refused:
        raise ConfigError(
            option,
            f"{option}={value} derives its keys from the run seed, which a secure run refuses",
            f"{option}=secure, or randomness=seeded",
        )
    if value in upgrade:
        cfg = dataclasses.replace(cfg, **{option: "secure"})
    return cfg, randomness


def check_party_split(cfg: Any) -> None:
    """A ``parties`` count that ``data.columns`` (a party -> columns split) contradicts is an
    error: with data.columns, the parties are its keys."""
    default = type(cfg)()
    if cfg.data.columns is not None and cfg.parties not in (default.parties, len(cfg.data.columns)):
        raise ConfigError(
            "parties",
            f"{cfg.parties} parties but data.columns names {len(cfg.data.columns)}",
            "drop parties when data.columns is given",
        )
