"""A node lost for good under a stage of long-lived tasks: found within a minute, never a silent wait.

Backends ``ps`` and ``sharded`` run every worker's task at once, each holding a task slot for the
whole stage. When an executor is lost (a spot node terminated, its Worker daemon killed) Spark
runs its task again, which waits for a free slot; when the cluster manager brings no replacement,
that task would wait until the workers' silence ran out (``workerTimeout``, 600 s by default) with
nothing on the console (``../shared/cases`` C49).

A :class:`SlotWatch` counts the cluster's task slots at each look of the fit's membership watcher
(:class:`~sparkdl.spark.training.membership.Monitor`): when they are fewer than the stage's workers
still running and an executor was removed since the fit started, it says so on the console at once
(which executor, Spark's reason, how long it waits) and, when no replacement came within
:func:`node_wait_s` (60 s, 180 s on YARN and Kubernetes, or half of ``workerTimeout`` when that is
shorter), reports a :class:`NodeLoss`. The transport then goes on without the node where it can
(``ps`` round modes: backend ``rounds`` for the remaining rounds, the same rounds) or fails with
:class:`~sparkdl.errors.NodeLostError` naming the executor and what to do. Workers that never wait
for each other (the asynchronous modes but ``ssp``) are only told: the waiting worker's task runs
on the slot another frees when its slots are done. While slots are short, the monitor judges no
worker by its silence: the node's rule decides (the round's timeout still bounds every wait).

Not on a ``local`` master (its slots are fixed), on Spark Connect (no slot count, no executor
list) nor with dynamic allocation (slots that come and go are its nature).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("sparkdl")

NODE_WAIT_S = 60.0  # how long a stage waits for lost task slots to come back (seconds), at most
CONTAINER_WAIT_S = 180.0  # the same on YARN and Kubernetes, whose replacement executors start a container or a pod
LOOK_EVERY_S = 1.0  # how often the slots are counted (seconds; each count is one call into the driver's JVM)


def node_wait_s(worker_timeout_s: float, master: str = "") -> float:
    """How long a stage short of task slots waits for a replacement executor before its node counts
    as lost (seconds): :data:`NODE_WAIT_S` (:data:`CONTAINER_WAIT_S` on a ``yarn`` or ``k8s://``
    master), or half of ``workerTimeout`` when that is shorter, so the verdict comes before any
    worker could be called silent."""
    wait = CONTAINER_WAIT_S if master == "yarn" or master.startswith("k8s://") else NODE_WAIT_S
    return min(wait, worker_timeout_s / 2)


def lost_since(spark, before: frozenset[str]) -> tuple[dict, ...]:
    """The executors removed since ``before`` (:attr:`~sparkdl.spark.cluster.ClusterFacts.removed_executors`, read when the fit started): each ``id``,
    ``host_port`` and ``remove_reason``, at most five."""
    from sparkdl.spark import internals

    try:
        found = [e for e in internals.executors(spark.sparkContext) if not e["active"] and e["id"] not in before]
    except Exception:  # noqa: BLE001
        return ()
    found.sort(key=lambda e: (len(e["id"]), e["id"]))  # Spark numbers executors as they come: the last ones are the newest
    return tuple({"id": e["id"], "host_port": e["host_port"], "remove_reason": e["remove_reason"]} for e in found[-5:])


def tell(line: str, verbose: bool) -> None:
    """One line about a lost node: to the ``sparkdl`` log, and to the console when the fit is verbose."""
    log.warning(line)
    if verbose:
        print(line, flush=True)


def executors_text(lost: tuple[dict, ...]) -> str:
    """``executor 1 (10.0.0.7:43239: worker lost)`` for each, or words for none named."""
    if not lost:
        return "an executor (Spark named none removed)"
    return "; ".join(f"executor {e['id']} ({e['host_port']}: {e['remove_reason'] or 'removed'})" for e in lost)


@dataclass(frozen=True)
class NodeLoss:
    """A stage that went short of task slots and stayed short.

    Attributes:
        slots: the cluster's task slots when it was declared.
        needed: the stage's workers still running (each needs a slot at once).
        lost: the executors removed since the fit started (``id``, ``host_port``, ``remove_reason``).
        waited_s: how long the stage waited for a replacement (seconds).
    """

    slots: int
    needed: int
    lost: tuple[dict, ...]
    waited_s: float

    def describe(self, what: str) -> str:
        """One sentence: what was lost and what is left, ``what`` naming the workers (``"ps workers"``)."""
        return (f"{executors_text(self.lost)} lost, and no replacement came within {self.waited_s:.0f} s: "
                f"{self.slots} task slot{'s' if self.slots != 1 else ''} left for {self.needed} {what}, which run at once")

    def info(self) -> dict:
        """For ``fitInfo``."""
        return {"executors": [dict(e) for e in self.lost], "slots": self.slots, "workers": self.needed,
                "waited_s": round(self.waited_s, 1)}


class SlotWatch:
    """Counts a stage's task slots for its monitor (see the module docstring).

    The slots count as short only while fewer than the stage's running workers *and* an executor
    has been removed since the fit started: a cluster that never had the slots is refused before any
    job (:meth:`~sparkdl.spark.cluster.ClusterFacts.check_slots`), and one still growing is not a lost node.

    Args:
        slots: counts the cluster's task slots now (None: unknown).
        lost: the executors removed since the fit started (:func:`lost_since`).
        wait_s: how long slots may stay short before the node counts as lost (:func:`node_wait_s`).
        what: the workers in words (``"ps workers"``).
        say: writes one line for the user (the console and the log).
        decides: whether a shortage that lasts ``wait_s`` is a verdict (:class:`NodeLoss`); False for
            workers that never wait for each other (the lost worker's task runs on the slot another
            frees when it ends), which are only told.
        every_s: the least time between two counts (seconds).
    """

    def __init__(self, slots: Callable[[], int | None], lost: Callable[[], tuple], wait_s: float, what: str,
                 say: Callable[[str], None], decides: bool = True, every_s: float = LOOK_EVERY_S) -> None:
        self.slots, self.lost, self.wait_s, self.what, self.say, self.decides = slots, lost, wait_s, what, say, decides
        self.every_s = every_s
        self.since: float | None = None  # when the slots went short (time.monotonic()), None while enough
        self._looked = -every_s
        self._count: int | None = None

    @classmethod
    def for_job(cls, job, what: str, decides: bool = True) -> SlotWatch | None:
        """The watch of ``job``'s stages, or None where slots are fixed, unknown or meant to change
        (``local``, Connect, dynamic allocation)."""
        from sparkdl.spark.session import task_slots

        cluster = job.cluster
        if cluster is None or cluster.local or cluster.connect or cluster.dynamic_allocation:
            return None
        spark, verbose, before = job.spark, bool(job.config.verbose), cluster.removed_executors
        return cls(lambda: task_slots(spark), lambda: lost_since(spark, before), node_wait_s(job.config.worker_timeout_s, cluster.master),
                   what, lambda line: tell(line, verbose), decides)

    @property
    def short(self) -> bool:
        """Whether the stage is short of slots now (its waiting workers are judged by this rule)."""
        return self.since is not None

    def reset(self) -> None:
        """A new stage: nothing seen yet."""
        self.since, self._looked = None, -self.every_s

    def look(self, needed: int) -> NodeLoss | None:
        """Count the slots (at most every ``every_s``) against ``needed`` workers still running;
        a :class:`NodeLoss` once they have been short for ``wait_s`` seconds, else None."""
        now = time.monotonic()
        if now - self._looked < self.every_s:
            return self._verdict(now, needed)
        self._looked, self._count = now, self.slots()
        slots = self._count
        lost = self.lost() if slots is not None and slots < needed else ()
        if not lost:
            if self.since is not None:
                self.say(f"sparkdl: {slots} task slot{'s' if slots != 1 else ''} now for the {needed} {self.what} still to run; "
                         "the fit goes on")
            self.since = None
            return None
        if self.since is None:
            self.since = now
            then = (f"waiting up to {self.wait_s:.0f} s for a replacement" if self.decides else
                    "the waiting worker's task runs on the slot another frees when its slots are done")
            self.say(f"sparkdl: {executors_text(lost)} lost: {slots} task slot{'s' if slots != 1 else ''} left for {needed} "
                     f"{self.what}, which run at once; {then}")
        return self._verdict(now, needed)

    def _verdict(self, now: float, needed: int) -> NodeLoss | None:
        if not self.decides or self.since is None or now - self.since < self.wait_s:
            return None
        return NodeLoss(self._count, needed, self.lost(), now - self.since)
