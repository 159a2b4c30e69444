"""Process memory as Linux reports it: anonymous (private) and file-backed resident bytes.

Peak figures come from a sampling thread, since Linux keeps a peak only of the total (VmHWM).
The sampler reads /proc/self/status every `interval` seconds; a spike shorter than that can be
missed, which is why the benchmark also reports the end-of-load figures.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from types import TracebackType

__all__ = ["STATUS", "PeakSampler", "Resident", "can_measure", "resident"]

STATUS = "/proc/self/status"


def can_measure() -> bool:
    """Whether this system reports resident memory the way `resident` reads it."""
    return os.path.exists(STATUS)


@dataclass(frozen=True)
class Resident:
    """Resident bytes of this process, split by kind."""

    anon: int
    file: int


def resident() -> Resident:
    """Current anonymous and file-backed resident bytes (RssAnon, RssFile)."""
    values: dict[str, int] = {}
    with open(STATUS) as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    return Resident(anon=values["RssAnon"], file=values["RssFile"])


class PeakSampler:
    """Samples resident memory in a background thread; use as a context manager.

    Attributes (after exit):
        start: resident bytes when sampling began.
        peak: the largest anon and file figures seen (each its own maximum).
    """

    def __init__(self, *, interval: float = 0.0005) -> None:
        self.interval = interval
        self.start = resident()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        now = resident()
        self.peak = Resident(max(self.peak.anon, now.anon), max(self.peak.file, now.file))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self.start = resident()
        self.peak = self.start
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def anon_growth(self) -> int:
        """Peak anonymous bytes above the start."""
        return self.peak.anon - self.start.anon

    @property
    def file_growth(self) -> int:
        """Peak file-backed resident bytes above the start."""
        return self.peak.file - self.start.file
