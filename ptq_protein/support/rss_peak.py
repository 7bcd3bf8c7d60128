"""The peak resident memory of a stretch of code, measured without touching the process's own peak.

Linux keeps one peak resident size per process (``VmHWM``), which ``/usr/bin/time``, ``getrusage``'s
``ru_maxrss`` and every tool built on them report. Restarting it (writing ``/proc/self/clear_refs``) would give
a stretch its own peak, but those tools would then under-report the whole process's. So a stretch's peak is
polled instead: a daemon thread reads the resident size (``/proc/self/statm``) every :data:`INTERVAL` seconds
while the stretch runs, and once more at its start and end. A spike shorter than the interval can be missed;
a fold's pair tensors live for seconds.

>>> with PeakSampler() as sampler:
...     data = bytearray(64 << 20)
>>> sampler.peak is None or sampler.peak >= 64 << 20
True
"""

from __future__ import annotations

import os
import threading
from typing import Optional

__all__ = ["PeakSampler", "INTERVAL"]

INTERVAL = 0.005  # seconds between reads; one read of /proc/self/statm costs a few microseconds
_STATM = "/proc/self/statm"


class PeakSampler:
    """Context manager: ``peak`` is the largest resident size (bytes) seen inside the block, None where the
    resident size cannot be read (not Linux)."""

    def __init__(self, interval: float = INTERVAL):
        self.interval = interval
        self.peak: Optional[int] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._handle = None

    def __enter__(self) -> "PeakSampler":
        try:
            self._handle = open(_STATM, "rb", buffering=0)
        except OSError:
            return self
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._sample()
        self._thread = threading.Thread(target=self._poll, name="ptq-rss-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._sample()
        self._handle.close()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        try:
            self._handle.seek(0)
            resident = int(self._handle.read().split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return
        if self.peak is None or resident > self.peak:
            self.peak = resident
