"""Peak memory of a benchmark: the summed proportional set size (PSS) of the driver and every
process it started (an embedded Ray's raylet, GCS and workers), polled in a background thread;
and, per process, its own peak PSS and peak resident set (the kernel's VmHWM), so that each actor's
memory can be read apart (:meth:`PeakMemory.per_process`)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def _pss(pid: str) -> int:
    """Proportional set size: shared pages (libraries, Ray's object store) split among sharers."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _hwm(pid: str) -> int:
    """The process's peak resident set so far (VmHWM), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _label(pid: str) -> str:
    """What the process is: a Ray worker's title names its actor class (``ray::UserCohortActor``,
    the method it runs stripped), else the executable's name (raylet, gcs_server, python)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    first = argv[0].decode(errors="replace").strip()
    if first.startswith("ray::"):
        return first.split()[0].split(".")[0]
    return Path(first).name or "?"


def _family(root: int) -> list[str]:
    """The driver and every process descended from it (the embedded Ray's raylet, GCS, workers)."""
    parent: dict[str, str] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        parent[pid] = stat.rsplit(")", 1)[1].split()[1]
    family, frontier = {str(root)}, [str(root)]
    while frontier:
        current = frontier.pop()
        children = [p for p, pp in parent.items() if pp == current and p not in family]
        family.update(children)
        frontier.extend(children)
    return sorted(family)


class PeakMemory:
    """Polls the summed PSS of the driver and its descendants in a background thread, and each
    process's own peak PSS and peak RSS."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._procs: dict[str, dict] = {}  # pid -> {label, peak_pss, peak_rss}
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            total = 0
            for pid in _family(os.getpid()):
                pss = _pss(pid)
                total += pss
                proc = self._procs.get(pid)
                if proc is None:
                    proc = self._procs[pid] = {"label": _label(pid), "peak_pss": 0, "peak_rss": 0}
                elif proc["label"] in ("ray::IDLE", "default_worker.py", "python"):
                    proc["label"] = _label(pid)  # a pooled worker becomes an actor later
                proc["peak_pss"] = max(proc["peak_pss"], pss)
                proc["peak_rss"] = max(proc["peak_rss"], _hwm(pid))
            self.peak = max(self.peak, total)
            time.sleep(self.interval)

    def per_process(self) -> dict[str, dict]:
        """pid -> {label, peak_pss, peak_rss} (bytes) of every process seen."""
        return {pid: dict(p) for pid, p in self._procs.items()}

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
