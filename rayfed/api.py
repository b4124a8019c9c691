"""``rayfed.run``: one protocol run from configuration to result and run directory."""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm.auto import tqdm

from rayfed.config import build_config, load_yaml, merge, parse_assignment, to_dict
from rayfed.errors import ConfigError, Interrupted
from rayfed.faults import check_members, check_phases
from rayfed.faults import parse as parse_fault
from rayfed.federation import Federation, check_member_names
from rayfed.protocols import get_protocol
from rayfed.protocols.base import Plan, Result
from rayfed.rundir import RunDir, check_out_dir, new_run_id, versions
from rayfed.runtime import ensure_ray
from rayfed.sizing import check_data_size, check_fit, machine_memory

#: the ``lost`` table: one row per member that died (Federation.losses)
LOSS_SCHEMA = pa.schema(
    [
        ("round", pa.int64()),
        ("phase", pa.string()),
        ("role", pa.string()),
        ("member", pa.string()),
        ("users", pa.int64()),
        ("fate", pa.string()),
        ("restored", pa.string()),
        ("back_round", pa.int64()),
        ("back_phase", pa.string()),
    ]
)


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def resolve(
    protocol: str,
    config: Mapping[str, Any] | str | Path | None = None,
    sets: Sequence[str] = (),
    **options: Any,
):
    """(protocol object, RunOptions, protocol config) from a YAML file or mapping, keyword options and
    ``key=value`` assignments, in that order of precedence (later wins). Raises ConfigError."""
    proto = get_protocol(protocol)
    values: dict[str, Any] = {}
    if isinstance(config, (str, Path)):
        values = load_yaml(config)
    elif config is not None:
        values = copy.deepcopy(dict(config))
    _deep_merge(values, options)
    for text in sets:
        merge(values, *parse_assignment(text))
    run_opts, cfg = build_config(proto.Config, values)
    return proto, run_opts, cfg


def run(
    protocol: str,
    config: Mapping[str, Any] | str | Path | None = None,
    *,
    sets: Sequence[str] = (),
    progress: bool = False,
    **options: Any,
) -> Result:
    """Run one protocol and return its :class:`~rayfed.protocols.base.Result`.

    Parameters
    ----------
    protocol:
        A registered name, e.g. ``"pattern-count"`` (see ``rayfed list``).
    config:
        A YAML file or a mapping of options.
    sets:
        ``"key=value"`` overrides with dotted keys, e.g. ``"data.path=ratings.csv"``.
    progress:
        Show a progress bar over rounds.
    **options:
        Options as keywords, e.g. ``epsilon=0.5, seed=3, backend="local"``.

    Raises
    ------
    ConfigError, DataError
        Bad configuration or data, before any actor starts.
    BudgetExceeded, PartyFailed, RoundTimeout, BelowThreshold
        During the run; the run directory, if any, is then marked failed.
    """
    proto, run_opts, cfg = resolve(protocol, config, sets, **options)
    cfg, run_opts = _reconcile(proto, cfg, run_opts)
    plan, faults, placement = _prepare(proto, cfg, run_opts)  # every refusal comes before here
    return execute(proto, cfg, run_opts, plan, faults, placement, progress=progress)


def execute(
    proto, cfg, run_opts, plan: Plan, faults=(), placement=None, *, progress: bool = False
) -> Result:
    """Run a prepared ``plan``: the federation, the driver, the result and its directory. (The
    sensitivity check runs a plan whose tables it edited into a neighbour's.)"""
    placement = placement or {}
    record = _Record.new(proto, cfg, run_opts, plan)
    bar = tqdm(total=plan.rounds, desc=proto.name, unit="round", disable=not progress, leave=False)
    fed = None
    try:
        record.open()  # inside the try: a signal while the directory is made is still recorded
        fed = _federation(record.run_id, plan, run_opts, faults, placement, bar)
        fed.start()
        record.manifest["placement"] = fed.placement()
        outcome = proto.drive(fed, cfg, plan)
        result = _result(proto, fed, plan, outcome, record)
        record.complete(result)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM under the CLI (errors.Interrupted)
        err.reached = record.interrupt(err, fed)  # what the CLI's one line says
        raise
    except BaseException as err:
        err.losses = fed.losses() if fed else []  # what the CLI's lines after the error say
        record.fail(err, fed)
        raise
    finally:
        bar.close()
        if fed is not None:
            fed.shutdown()
    return result


def _reconcile(proto, cfg, run_opts):
    """The protocol's own key options and the run's randomness agree; start or connect Ray first
    when given a cluster or CPUs (cohorts default to the cluster's CPUs)."""
    cfg, randomness = proto.resolve_randomness(cfg, run_opts.randomness)
    run_opts = dataclasses.replace(run_opts, randomness=randomness)  # as run, in the manifest
    if run_opts.backend == "ray" and (
        run_opts.address or os.environ.get("RAY_ADDRESS") or run_opts.num_cpus
    ):
        ensure_ray(run_opts.address, run_opts.num_cpus)
    return cfg, run_opts


def _prepare(proto, cfg, run_opts) -> tuple[Plan, list, dict[str, dict]]:
    """(plan, faults, actor placement): the size check before any data is built, the plan (bad
    data fails there), the faults and the cluster's fit — all before any actor or run directory."""
    check_size(proto, cfg, run_opts)
    if run_opts.out_dir:
        check_out_dir(run_opts.out_dir)
    plan: Plan = proto.plan(cfg, run_opts.seed)
    plan.privacy.validate(proto.name)
    check_member_names(list(plan.parties) + list(plan.cohorts))
    faults = [parse_fault(text) for text in run_opts.fail or []]
    check_members(faults, _members(plan))
    check_phases(faults, proto.phases, proto.name)
    proto.check_faults(cfg, faults)
    placement: dict[str, dict] = {}
    if run_opts.backend == "ray":
        resources = ensure_ray(run_opts.address, run_opts.num_cpus)  # an unreachable address, too
        placement = actor_placement(run_opts, len(plan.parties), resources)
        check_fit(plan, resources, run_opts.cohort_memory_mb)
    return plan, faults, placement


def _members(plan: Plan) -> dict[str, list[str]]:
    return {"parties": sorted(plan.parties), "cohorts": sorted(plan.cohorts)}


def _federation(run_id, plan: Plan, run_opts, faults, placement, bar) -> Federation:
    return Federation(
        run_id=run_id,
        seed=run_opts.seed,
        parties=plan.parties,
        cohorts=plan.cohorts,
        privacy=plan.privacy,
        backend=run_opts.backend,
        randomness=run_opts.randomness,
        deadline_s=run_opts.deadline_s,
        progress=bar,
        faults=faults,
        actor_options=placement,
        cohort_restarts=plan.cohort_restarts,
        server_shards=plan.server_shards,
    )


def _result(proto, fed: Federation, plan: Plan, outcome, record: _Record) -> Result:
    """The Result: the driver's outcome with what the federation measured and the ledger's
    report (an ε spent above the ε requested is stated in the headline)."""
    outcome.metrics.setdefault("phase_seconds", fed.phase_seconds())
    unfired = [f"{f.role}:{f.member}@{f.phase or f.round}" for f in fed.unfired_faults]
    if unfired:
        outcome.metrics["faults_unfired"] = unfired
        warnings.warn(
            f"injected fault(s) never fired (no such round or phase reached): {unfired}",
            RuntimeWarning,
            stacklevel=3,
        )
    losses = fed.losses()
    per_round = [dict(row) for row in fed.per_round]
    if losses:  # every death, its fate, and per round the members lost in it
        outcome.metrics["losses"] = losses
        outcome.tables["lost"] = pa.Table.from_pylist(losses, schema=LOSS_SCHEMA)
        for row in per_round:
            row["lost"] = [x["member"] for x in losses if x["round"] == row["round"]]
    if per_round:
        outcome.metrics.setdefault("per_round", per_round)
    privacy = fed.privacy_report()
    privacy.requested_epsilon = requested = plan.privacy.requested_epsilon
    if requested is not None and privacy.epsilon > requested * (1 + 1e-9):
        outcome.headline += (
            f" [ε spent {privacy.epsilon:.4g} > ε requested {requested:g}: this mode's "
            "calibration does not deliver the requested ε]"
        )
    return Result(
        protocol=proto.name,
        run_id=record.run_id,
        seed=fed.seed,
        config=record.config,
        tables=outcome.tables,
        metrics=outcome.metrics,
        privacy=privacy,
        transcript=fed.transcript.to_table(),
        transcript_totals=fed.transcript.totals(),
        timings=fed.timings,
        seconds=time.perf_counter() - record.started,
        headline=outcome.headline,
        details=outcome.details,
        run_dir=str(record.rundir.path) if record.rundir else None,
        noise_fingerprints=fed.noise_fingerprints(),
        adjusted=list(plan.adjusted),
    )


@dataclass
class _Record:
    """The run's identity and its directory: a manifest marked running, then complete (after
    every table is written) or failed (with the error)."""

    run_id: str
    config: dict[str, Any]
    manifest: dict[str, Any]
    rundir: RunDir | None
    started: float

    @staticmethod
    def new(proto, cfg, run_opts, plan: Plan) -> _Record:
        run_id = new_run_id(proto.name)
        config = {"run": to_dict(run_opts), "protocol": to_dict(cfg)}
        manifest: dict[str, Any] = {
            "run_id": run_id,
            "protocol": proto.name,
            "status": "running",
            "seed": run_opts.seed,
            "config": config,
            "versions": versions(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "members": _members(plan),
        }
        if plan.adjusted:  # what the run used where it differs from the config above
            manifest["adjusted"] = plan.adjusted
        if plan.inputs:
            manifest["inputs"] = plan.inputs
        rundir = RunDir(run_opts.out_dir, run_id) if run_opts.out_dir else None
        return _Record(run_id, config, manifest, rundir, time.perf_counter())

    def open(self) -> None:
        """The run directory with its manifest marked running."""
        if self.rundir:
            self.rundir.create()
            self.rundir.write_manifest(self.manifest)

    def complete(self, result: Result) -> None:
        if self.rundir:
            _write_result(self.rundir, self.manifest, result)

    def interrupt(self, err: KeyboardInterrupt, fed: Federation | None) -> str:
        """Marked ``interrupted``: the signal, the round and phase the run had reached, and the
        rounds it finished (nothing of the run's result is kept). Returns where it stopped, in
        words."""
        reached = {"signal": signal.Signals(Interrupted.signal_of(err)).name, **_reached(fed)}
        text = (
            f"in round {reached['round']}, phase {reached['phase']} "
            f"({reached['rounds_finished']} round(s) finished)"
            if fed and fed.phase
            else "while starting the federation"
        )
        if not (self.rundir and self.rundir.exists):
            return text
        self.manifest.update(
            status="interrupted",
            interrupted=reached,
            seconds=time.perf_counter() - self.started,
            timings=fed.timings if fed else [],
            transcript=fed.transcript.totals() if fed else None,
        )
        self.rundir.write_manifest(self.manifest)
        return f"{text}; run directory {self.rundir.path} (status interrupted)"

    def fail(self, err: BaseException, fed: Federation | None) -> None:
        if not (self.rundir and self.rundir.exists):
            return
        self.manifest.update(
            status="failed",
            error=f"{type(err).__name__}: {err}",
            losses=getattr(err, "losses", []),
            # how far it got, as an interruption records it (the report's failed-run page)
            reached=_reached(fed),
            privacy=_privacy_so_far(fed),
            seconds=time.perf_counter() - self.started,
            timings=fed.timings if fed else [],
            transcript=fed.transcript.totals() if fed else None,
        )
        self.rundir.write_manifest(self.manifest)


def _reached(fed: Federation | None) -> dict[str, Any]:
    """The round and phase a run that stopped early had reached, and the rounds it finished."""
    if not (fed and fed.phase):
        return {"round": None, "phase": "start", "rounds_finished": 0}
    rounds = [t for t in fed.timings if t["phase"] == "(round)"]
    return {"round": fed.round_no, "phase": fed.phase, "rounds_finished": len(rounds)}


def _privacy_so_far(fed: Federation | None) -> dict[str, Any] | None:
    """The ledger's report of what a failed run had charged (a charge is spent whether or not
    its release arrived), or None where the coordinator cannot say (it is the one that died)."""
    if not (fed and fed.phase):
        return None
    try:
        return fed.privacy_report().to_dict()
    except Exception:  # noqa: BLE001 - the failure being recorded is the one to report
        return None


def check_size(proto, cfg, run_opts) -> None:
    """Refuse a run whose data would not fit this machine (or the connected cluster), from the
    protocol's estimate alone: on both backends, before any data is built."""
    have, where = machine_memory(), "this machine"
    if run_opts.backend == "ray":
        import ray

        if ray.is_initialized():
            have = int(ray.cluster_resources().get("memory", 0)) or have
            where = "the Ray cluster"
    check_data_size(proto.data_bytes(cfg), cfg, where, have)


def actor_placement(run_opts, parties: int, resources: dict[str, float]) -> dict[str, dict]:
    """Ray actor options per role: SPREAD scheduling for parties and cohorts, and one unit of the
    ``party_resource`` node resource per party; a cluster without enough of it is refused before
    any actor starts (the actors would wait for nodes forever)."""
    options: dict[str, dict] = {"party": {}, "cohort": {}}
    if run_opts.spread:
        options["party"]["scheduling_strategy"] = "SPREAD"
        options["cohort"]["scheduling_strategy"] = "SPREAD"
    name = run_opts.party_resource
    if name:
        have = resources.get(name, 0.0)
        if have < parties:
            raise ConfigError(
                "party_resource",
                f"the cluster has {have:g} of resource {name!r} but the run has {parties} parties "
                "(one unit each)",
                f"nodes declaring {name}: 1 (cluster.yaml resources or ray start --resources), "
                "or drop party_resource",
            )
        options["party"]["resources"] = {name: 1.0}
    if run_opts.cohort_memory_mb is not None:
        options["cohort"]["memory"] = run_opts.cohort_memory_mb << 20
    return options


def _write_result(rundir: RunDir, manifest: dict[str, Any], result: Result) -> None:
    """Tables first, then the manifest marked complete (so "complete" implies every file is there)."""
    files = {name: rundir.write_table(name, table) for name, table in result.tables.items()}
    files["transcript"] = rundir.write_table("transcript", result.transcript)
    manifest.update(
        status="complete",
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        seconds=result.seconds,
        headline=result.headline,
        details=result.details,
        privacy=result.privacy.to_dict(),
        metrics=result.metrics,
        timings=result.timings,
        transcript=result.transcript_totals,
        tables=files,
    )
    rundir.write_manifest(manifest)
