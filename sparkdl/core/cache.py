"""A per-process cache with explicit keys and lifetimes, for executor Python workers.

Spark reuses a Python worker for many tasks (``spark.python.worker.reuse``), so a worker can
keep what a fit needs between rounds: each partition's rows as numpy and the compiled replica.
Entries belong to a fit (``fit_id``) and die with it:

- the task of a fit's last round releases its partition, and the fit's remaining entries once
  no partition of the fit is left in this process;
- at most ``max_fits`` fits are held (least recently used dropped first), so two concurrent
  fits (``CrossValidator(parallelism=2)``) keep their entries side by side;
- a fit not touched for ``idle_s`` seconds (a fit that failed or was cancelled on the driver,
  whose last round never came) is dropped at the next access of any fit.

Pure Python: no Spark, no Keras.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class WorkerCache:
    """Entries keyed by ``(fit_id, key)``, grouped per fit, with per-fit LRU and idle expiry.

    Args:
        max_fits: fits held at once (>= 1); the least recently used fit beyond it is dropped whole.
        idle_s: seconds after its last access at which a fit is dropped.
        clock: monotonic time source in seconds (tests pass their own).
    """

    def __init__(self, max_fits: int = 4, idle_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        if max_fits < 1:
            raise ValueError(f"max_fits must be >= 1. Received: {max_fits}")
        self.max_fits = max_fits
        self.idle_s = idle_s
        self._clock = clock
        self._fits: OrderedDict[str, tuple[float, dict[Hashable, Any]]] = OrderedDict()
        self._lock = threading.RLock()

    def _expire(self, now: float) -> None:
        for fit_id in [f for f, (seen, _) in self._fits.items() if now - seen > self.idle_s]:
            del self._fits[fit_id]

    def _entries(self, fit_id: str) -> dict[Hashable, Any]:
        now = self._clock()
        self._expire(now)
        entries = self._fits.pop(fit_id, (now, {}))[1]
        self._fits[fit_id] = (now, entries)
        while len(self._fits) > self.max_fits:
            self._fits.popitem(last=False)
        return entries

    def get(self, fit_id: str, key: Hashable, default: Any = None) -> Any:
        """The entry ``key`` of ``fit_id``, or ``default``; marks the fit as used."""
        with self._lock:
            return self._entries(fit_id).get(key, default)

    def get_or_create(self, fit_id: str, key: Hashable, factory: Callable[[], Any]) -> Any:
        """The entry ``key`` of ``fit_id``, built by ``factory()`` on a miss and kept."""
        with self._lock:
            entries = self._entries(fit_id)
            if key not in entries:
                entries[key] = factory()
            return entries[key]

    def put(self, fit_id: str, key: Hashable, value: Any) -> None:
        with self._lock:
            self._entries(fit_id)[key] = value

    def release(self, fit_id: str, key: Hashable | None = None) -> None:
        """Drop one entry of ``fit_id`` (or the whole fit when ``key`` is None); a missing one is fine."""
        with self._lock:
            if key is None:
                self._fits.pop(fit_id, None)
            elif fit_id in self._fits:
                self._fits[fit_id][1].pop(key, None)

    def keys(self, fit_id: str) -> list[Hashable]:
        """The keys held for ``fit_id`` (empty when the fit is not held); does not mark it as used."""
        with self._lock:
            held = self._fits.get(fit_id)
            return [] if held is None else list(held[1])

    def fits(self) -> list[str]:
        """Fit ids held, least recently used first."""
        with self._lock:
            return list(self._fits)
