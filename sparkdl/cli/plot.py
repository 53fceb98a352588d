"""``plot_history``: a fit's per-epoch history as a PNG (matplotlib, the ``plot`` extra).

Uses matplotlib's object API with the Agg canvas: no pyplot, no global backend switch, no display.
"""

from __future__ import annotations

import math
import os


def metric_names(history: dict) -> list[str]:
    """The metrics to plot, one subplot each: ``loss`` first, then the others in the history's order;
    a ``val_x`` key is drawn in ``x``'s subplot (its own subplot when there is no ``x``)."""
    names = []
    for key in history:
        base = key[4:] if key.startswith("val_") else key
        if base not in names:
            names.append(base)
    if "loss" in names:
        names.remove("loss")
        names.insert(0, "loss")
    return names


def plot_history(history: dict[str, list[float]], path: str, title: str | None = None) -> str:
    """Write ``history`` (as ``KerasModel.history``: metric -> one value per epoch, ``val_*`` for
    validation) to ``path`` as a PNG: one subplot per metric (loss first), the training curve and,
    when present, the ``val_*`` curve against the epoch (1, 2, ...). Returns ``path``.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'sparkdl-keras[plot]'``).
        ValueError: an empty history, or a metric whose values are not a list of numbers.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not history:
        raise ValueError("plot_history needs at least one metric. Received: an empty history")
    for key, values in history.items():
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, (int, float)) for v in values):
            raise ValueError(f"history[{key!r}] must be a list of numbers, one per epoch. Received: {values!r}")
    names = metric_names(history)
    cols = min(len(names), 3)
    rows = math.ceil(len(names) / cols)
    fig = Figure(figsize=(4.5 * cols, 3.4 * rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    for i, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, i + 1)
        for key, label, style in ((name, "train", "o-"), (f"val_{name}", "validation", "s--")):
            values = history.get(key)
            if values:
                ax.plot(range(1, len(values) + 1), values, style, label=label, markersize=4)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
        epochs = max(len(history.get(k) or ()) for k in (name, f"val_{name}"))
        ax.set_xlim(0.5, max(epochs, 1) + 0.5)
        if epochs <= 12:
            ax.set_xticks(range(1, max(epochs, 1) + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
    if title:
        fig.suptitle(title)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, format="png")
    return path
