"""Resource sizing: how many user-cohort actors a run gets, and whether its actors fit the cluster.

Cohorts default to one per CPU of the Ray cluster the driver is connected to (this machine's CPUs
before Ray starts). Before any actor starts, the run's memory need — a fixed overhead per actor
process plus a multiple of its partition's Arrow bytes, or ``cohort_memory_mb`` per cohort when
given — is compared with the cluster's schedulable memory; a run that would not fit is a
ConfigError that says by how much.
"""

from __future__ import annotations

import os

from rayfed.errors import ConfigError

ACTOR_OVERHEAD_BYTES = 300 << 20  # a loaded actor's RSS: 284 MiB (benchmarks/actor_memory.py)
PARTITION_FACTOR = 4  # the Arrow partition plus working copies: an allowance, not measured


def cluster_cpus() -> int:
    """CPUs of the connected Ray cluster, else of this machine."""
    try:
        import ray

        if ray.is_initialized():
            return max(1, int(ray.cluster_resources().get("CPU", 1)))
    except ImportError:  # pragma: no cover - ray is a dependency
        pass
    return os.cpu_count() or 1


def default_cohorts(users: int, requested: int | None) -> int:
    """``requested``, or one cohort per cluster CPU; never more cohorts than users."""
    return max(1, min(requested or cluster_cpus(), users))


#: whether server_shards="auto" follows the cluster's CPUs; the test suite sets it False
#: (tests/conftest.py) so that a test's server does not depend on the machine it runs on
AUTO_SERVER_SHARDS = True


def default_server_shards(requested: int | str) -> int:
    """``requested``, or for "auto" one shard per 4 cluster CPUs (at most 16); below 8 CPUs 1:
    the coordinator alone is the whole server (CI, laptops, the golden runs)."""
    if requested != "auto":
        return int(requested)
    if not AUTO_SERVER_SHARDS:
        return 1
    cpus = cluster_cpus()
    return 1 if cpus < 8 else min(16, cpus // 4)


def cohorts_adjusted(users: int, requested: int | None, used: int) -> list[dict]:
    """The ``cohorts`` option's entry for :attr:`Plan.adjusted` when the run deals its users to
    fewer cohorts than asked (a cohort holds at least one user); none otherwise."""
    from rayfed.protocols.base import adjusted

    if requested is None or used == requested:
        return []
    return [adjusted("cohorts", requested, used, f"{users:,} users, at least one per cohort")]


def estimate_bytes(plan, cohort_memory_mb: int | None = None) -> int:
    """Memory the run's actors need: overhead + partition x factor each (coordinator included)."""
    shards = getattr(plan, "server_shards", 1)
    total = ACTOR_OVERHEAD_BYTES * (1 + (shards if shards > 1 else 0))  # coordinator, shards
    for table, _ in plan.parties.values():
        total += ACTOR_OVERHEAD_BYTES + PARTITION_FACTOR * table.nbytes
    for table, _ in plan.cohorts.values():
        if cohort_memory_mb is not None:
            total += cohort_memory_mb << 20
        else:
            total += ACTOR_OVERHEAD_BYTES + PARTITION_FACTOR * table.nbytes
    return total


def check_fit(plan, resources: dict[str, float], cohort_memory_mb: int | None = None) -> int:
    """Raise ConfigError when the run's estimated memory exceeds the cluster's schedulable memory;
    return the estimate."""
    need = estimate_bytes(plan, cohort_memory_mb)
    have = float(resources.get("memory", 0.0))
    if have and need > have:
        shards = getattr(plan, "server_shards", 1)
        actors = 1 + len(plan.parties) + len(plan.cohorts) + (shards if shards > 1 else 0)
        raise ConfigError(
            "cohorts" if plan.cohorts else "data",
            f"{actors} actors need about {need / 2**30:.1f} GiB (≈{ACTOR_OVERHEAD_BYTES >> 20} MiB "
            f"each plus {PARTITION_FACTOR}x their data) but the cluster has {have / 2**30:.1f} GiB "
            "of schedulable memory",
            "fewer cohorts, fewer users, or more / larger nodes",
        )
    return need


def machine_memory() -> int:
    """Physical memory of this machine, in bytes."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0


def size_options(cfg) -> dict[str, float]:
    """The numeric options marked ``size`` (what the run's memory grows with) and their values."""
    import dataclasses

    return {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.metadata.get("size") and isinstance(getattr(cfg, f.name), (int, float))
    }


def default_size(cfg, name: str) -> float:
    """The value option ``name`` takes when not given, in ``cfg``'s own setting: an option whose
    default is None resolves through the config's ``resolved_<name>()`` (federated-mf's users
    and density depend on the setting), else the field's default."""
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(cfg)}[name]
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    if default is None and hasattr(cfg, f"resolved_{name}"):
        return getattr(dataclasses.replace(cfg, **{name: None}), f"resolved_{name}")()
    return default or 1


def check_data_size(need: int, cfg, where: str, have: int) -> None:
    """ConfigError before any data is built when the protocol's estimate of the data it would
    build (``need`` bytes) exceeds ``have``; names the size option furthest above its default."""
    if not have or need <= have:
        return
    sizes = size_options(cfg)
    grown = {k: v / max(default_size(cfg, k), 1) for k, v in sizes.items()}
    name = max(grown, key=grown.get) if grown else "data"
    value = sizes.get(name)
    raise ConfigError(
        name,
        f"this run would build about {need / 2**30:,.1f} GiB of data"
        + (f" ({name}={value:,})" if value is not None else "")
        + f", more than the {have / 2**30:,.1f} GiB {where} has",
        f"lower {name}, or run on a larger machine or cluster",
    )
