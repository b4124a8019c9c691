"""Peak memory of a benchmark: the summed proportional set size (PSS) of the driver and every
process it started (an embedded Ray's raylet, GCS and workers), polled in a background thread."""

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
    """Polls the summed PSS of the driver and its descendants in a background thread."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(_pss(p) for p in _family(os.getpid())))
            time.sleep(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
