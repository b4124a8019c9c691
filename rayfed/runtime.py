"""Starting or connecting Ray.

By default rayfed starts an embedded local Ray, quiet and sized to the machine. With an address
(``--address``, the ``address`` option, or the RAY_ADDRESS environment variable) it connects to an
existing cluster instead. A Ray that is already initialised in this process is reused, so several
runs in one process share it.

What rayfed keeps for the life of one Ray session — the warm actors that finished runs leave for
the next one — belongs to that :class:`Session` (:func:`session`), and is drained when it ends
(:func:`shutdown`); a new Ray session (after a ``ray.shutdown`` elsewhere) starts a new one.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
from typing import Any
from urllib.parse import urlparse

from rayfed.errors import ConfigError

CONNECT_TIMEOUT_S = 15.0


class Session:
    """What rayfed keeps while this process is connected to one Ray session — its ``key``, (Ray's
    session name, the job id): a job id alone is the same ('01000000') after ``ray.shutdown();
    ray.init()`` — the :class:`~rayfed.backends.WarmActors` finished runs leave for the next run
    of the same shape."""

    def __init__(self, key: tuple[str, str]):
        from rayfed.backends import WarmActors

        self.key = key
        self.warm = WarmActors()

    def close(self) -> None:
        """The session ends: stop its warm actors (on a cluster they would outlive it)."""
        self.warm.drain()


_SESSION: Session | None = None
_SESSION_LOCK = threading.RLock()  # runs in threads of one process share one session


def session() -> Session:
    """The session of the Ray this process is connected to (which must be initialised): opened
    on first use, also for a Ray that the caller initialised; a Ray session that replaced the
    last one gets a new Session (the old one's actors went with the old Ray)."""
    import ray

    global _SESSION
    context = ray.get_runtime_context()
    key = (context.get_session_name(), context.get_job_id())
    with _SESSION_LOCK:
        if _SESSION is None or _SESSION.key != key:
            _SESSION = Session(key)
        return _SESSION


def _check_reachable(address: str, timeout_s: float) -> None:
    """Fail fast on a host:port that does not answer: ray.init itself retries for minutes."""
    if address in ("auto", "local"):
        return
    try:
        parsed = urlparse(address if "://" in address else f"gcs://{address}")
        host, port = parsed.hostname, parsed.port
    except ValueError:  # a port that is not a number
        host = port = None
    if host is None or port is None:
        raise ConfigError(
            "address",
            f"{address!r} is not a Ray address"
            + (" (from RAY_ADDRESS)" if os.environ.get("RAY_ADDRESS") == address else ""),
            "host:port, ray://host:port or auto; or nothing (and RAY_ADDRESS unset) for an "
            "embedded local Ray",
        )
    try:
        socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(
            "address",
            f"nothing answers at {address!r} within {timeout_s:g} s ({err})",
            "a running cluster's address, or nothing for an embedded local Ray",
        ) from err


#: processes of actors killed by an injected fault (rayfed.faults): Ray's report of their death
#: ("A worker died or was killed ... OOM killer ... SIGSEGV") is not printed
_MUTED_PIDS: set[int] = set()


def mute_worker_death(pid: int) -> None:
    """Keep Ray's driver from printing its crash report for the worker process ``pid``, which an
    injected fault is about to end (its death is reported by the run itself). Other deaths are
    printed as before."""
    import ray._private.worker as ray_worker

    _MUTED_PIDS.add(int(pid))
    if getattr(ray_worker.print_to_stdstream, "_rayfed_muted", False):
        return
    printer = ray_worker.print_to_stdstream

    def print_to_stdstream(data, ignore_prefix: bool):
        if data.get("pid") == "raylet":
            lines = [line for line in data.get("lines", []) if not _muted(line)]
            if not lines:
                return None
            data = {**data, "lines": lines}
        return printer(data, ignore_prefix)

    print_to_stdstream._rayfed_muted = True
    ray_worker.print_to_stdstream = print_to_stdstream  # looked up at call time by Ray's listener


def _muted(line: str) -> bool:
    found = _WORKER_PID.search(line)
    return bool(found) and int(found.group(1)) in _MUTED_PIDS


_WORKER_PID = re.compile(r"Worker PID: (\d+)")


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Make sure Ray is initialised and return ``ray.cluster_resources()``.

    Parameters
    ----------
    address:
        A Ray address (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); ``None`` means
        RAY_ADDRESS if set, otherwise an embedded local Ray.
    num_cpus:
        CPUs of the embedded Ray (default: all of this machine's); ignored when connecting.
    """
    import ray

    if ray.is_initialized():
        return ray.cluster_resources()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if num_cpus is not None and (not isinstance(num_cpus, int) or num_cpus < 1):
        raise ConfigError("num_cpus", f"must be an integer >= 1, got {num_cpus!r}")
    quiet = dict(log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    # A failed step's payload ref is never fetched (its error arrives through the meta ref, and
    # becomes a typed rayfed error); without this Ray prints it again as "Unhandled error".
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    # Ray warns on every local start that token authentication is on by default; that is noise
    # for an embedded single-machine run, so it is muted for the duration of init only.
    ray_logger = logging.getLogger("ray")
    level = ray_logger.level
    ray_logger.setLevel(logging.ERROR)
    # ray.init replaces the SIGTERM handler with sys.exit(15); a handler already installed (the
    # CLI's, which marks the run interrupted and stops Ray cleanly) is put back after it
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if address:
            _check_reachable(address, CONNECT_TIMEOUT_S)
            ray.init(address=address, **quiet)
        else:
            # "local": a new embedded Ray, never the last `ray start` cluster on this machine
            # (which ray.init() with no address silently joins, refusing num_cpus)
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                **quiet,
            )
    except ConnectionError as err:
        raise ConfigError(
            "address",
            f"cannot connect to a Ray cluster at {address!r}: {err}",
            "a running cluster's address, or nothing for an embedded local Ray",
        ) from err
    finally:
        ray_logger.setLevel(level)
        if callable(sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)
    return ray.cluster_resources()


def shutdown() -> None:
    """Shut down this process's Ray connection (an embedded Ray stops with it; a cluster keeps
    running). Call it when done with rayfed in a long-lived process."""
    import ray

    global _SESSION
    with _SESSION_LOCK:
        if ray.is_initialized():
            session().close()  # on a cluster, the idle actors kept for the next run would outlive us
            ray.shutdown()
        _SESSION = None


def connect(address: str | None, who: str = "rayfed") -> tuple[str | None, dict[str, Any]]:
    """How job scripts join Ray: ``address`` or RAY_ADDRESS if given, else a running cluster
    (``"auto"``), else an embedded local Ray, saying so on stderr. Returns (the address used, None
    for an embedded Ray; ``ray.cluster_resources()``)."""
    import sys

    explicit = address or os.environ.get("RAY_ADDRESS")
    if explicit:
        return explicit, ensure_ray(explicit)
    try:
        return "auto", ensure_ray("auto")
    except ConfigError:
        print(
            f"{who}: no running Ray cluster found (address 'auto'); using an embedded local Ray",
            file=sys.stderr,
        )
        return None, ensure_ray(None)
