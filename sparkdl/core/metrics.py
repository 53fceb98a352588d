"""Row-weighted means of the workers' Keras metrics, merged into a Keras-style history."""

from __future__ import annotations

from collections.abc import Mapping


class MetricMeans:
    """Accumulates ``{metric: value}`` dicts weighted by rows; :meth:`means` gives Σ nᵢ·mᵢ / Σ nᵢ."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._rows: dict[str, float] = {}

    def add(self, metrics: Mapping[str, float], rows: int) -> None:
        if rows <= 0:
            return
        for name, value in metrics.items():
            self._sums[name] = self._sums.get(name, 0.0) + float(value) * rows
            self._rows[name] = self._rows.get(name, 0.0) + rows

    def means(self) -> dict[str, float]:
        return {name: self._sums[name] / self._rows[name] for name in self._sums}


def append_epoch(history: dict[str, list[float]], metrics: Mapping[str, float]) -> None:
    """Append one epoch's metric means to a ``{"loss": [...], ...}`` history, as ``keras.callbacks.History``."""
    for name, value in metrics.items():
        history.setdefault(name, []).append(float(value))
