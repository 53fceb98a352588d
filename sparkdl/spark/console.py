"""Spark's console progress bar (``[Stage 21:>    (0 + 2) / 2]``), hidden while a fit prints its own lines.

Spark draws the bar on the driver's stderr when ``spark.ui.showConsoleProgress`` is true, as it is
for a session started from Python (``SparkSession.builder...getOrCreate()`` in a script or a
notebook; a ``spark-submit`` job has it false). The setting is read once, when the SparkContext
starts, into ``SparkContext.progressBar`` (a ``ConsoleProgressBar`` with its own refresh thread)
and has no runtime switch, so :func:`progress_bar_hidden` works on that object through py4j: it
stops the bar and takes it off the context for the block, then gives the context a new bar
(``new ConsoleProgressBar(sc)``, as SparkContext makes it). Nested and concurrent blocks (two fits
on two threads) share one hiding: the bar comes back when the last ends. On a Spark Connect session,
a context without a bar, or a Spark whose internals differ, it does nothing (a DEBUG log says why).
"""

from __future__ import annotations

import contextlib
import logging
import threading

from sparkdl.spark import internals

log = logging.getLogger(__name__)

_lock = threading.Lock()
_holders = 0  # blocks inside progress_bar_hidden
_hidden_on = None  # the SparkContext whose bar was taken off, while _holders > 0


def _hide(spark):
    """Stop and remove the bar of ``spark``'s SparkContext; returns that SparkContext, or None when
    there was none to hide (Connect, whose session has no SparkContext, no bar, internals not found)."""
    try:
        sc = spark.sparkContext  # a Connect session raises here
        return sc if internals.take_progress_bar(sc) else None
    except Exception as e:  # noqa: BLE001 - Spark internals: keep the bar rather than fail a fit
        log.debug("Spark's console progress bar stays: %s: %s", type(e).__name__, e)
        return None


@contextlib.contextmanager
def progress_bar_hidden(spark, hide: bool = True):
    """A block during which Spark's console progress bar of ``spark`` (a SparkSession) is not drawn.

    Args:
        spark: the session whose SparkContext's bar to hide (classic sessions only).
        hide: False makes the block a no-op (e.g. a fit with ``verbose=0`` prints nothing to
            keep apart from the bar).

    The bar, when the context had one, is running again after the block, also when the block
    raises; a context stopped inside the block gets none.
    """
    global _holders, _hidden_on
    if not hide:
        yield
        return
    with _lock:
        if _holders == 0:
            _hidden_on = _hide(spark)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _hidden_on is not None:
                try:
                    internals.give_progress_bar(_hidden_on)
                except Exception as e:  # noqa: BLE001 - Spark internals: a fit's result stands without its bar
                    log.debug("Spark's console progress bar could not be restored: %s: %s", type(e).__name__, e)
                _hidden_on = None
