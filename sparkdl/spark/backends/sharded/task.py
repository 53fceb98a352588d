"""Executor-side task code of backend ``sharded``: one long-lived task per worker, which trains its
partition and owns one slice of the fit's state (:mod:`sparkdl.server.slices`).

A task starts a slice server in its Python worker (a certificate of its own, the fit's token),
registers it with the driver's coordinator (:mod:`sparkdl.server.coordinator`) and takes its slice:
the fit's start state from the driver (its first registration), or, for a retried task, the slice
as its previous owner or its backup holder kept it. Then, for each round g of its slots ``[first,
last)``, once the driver opened it:

1. it pulls round g's start from every owner (in parallel; its own slice from its own server);
2. trains τ steps (the rows, order and seeds of every backend: :func:`~sparkdl.spark.training.worker.train_slot`);
3. puts slice j of its state (or of its fp16 update; its weights alone with ``keepLocalOptimizer``)
   to owner j, keeping the pieces until the round closes, and reports its rows and metric sums to
   the coordinator.

With ``overlap`` (:mod:`sparkdl.core.modes.overlap`), steps 1 and 3 leave the critical path: a
background sender puts round g's pieces, reports, waits for the driver to open round g + 1 and
pulls its start, while the worker trains round g + 1 from its round-g contribution carried onto round g's start;
the worker waits only for the sender of the round before (one round in flight) and at a sync point.
Without an encoding a contribution is the worker's carried start: the owners keep its pieces, the
worker puts its own slice's piece to its backup holder too, and a retried attempt that finds no
start on its executor assembles it from them (:meth:`ShardedWorker._rebuilt_start`).

When the slice map changes during a round (an owner's task was retried), it puts its pieces of the
open round to the new owner again, and sends its own slice's versions to a new backup holder.
After its last slot it waits for the driver's stop (the driver reads the final slices first), then
shuts its server down. A retried task trains the open round again when it had rows in it: its
pushes that arrived before are dropped as duplicates, the others complete the round.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.pandas.types import from_arrow_schema

from sparkdl.core import piece_codec
from sparkdl.core.board import encode_metric_sums
from sparkdl.core.compression import encode_update
from sparkdl.core.modes import get_policy, policy_class
from sparkdl.core.modes.overlap import EagerOverlap
from sparkdl.core.piece_codec import PIECEWISE
from sparkdl.core.slices import SliceLayout
from sparkdl.core.state import ModelState, WorkerLocal
from sparkdl.errors import RoundTimeoutError
from sparkdl.server.coordinator import CoordinatorClient
from sparkdl.server.slices import SliceClient, SliceLost, SliceServer, SliceVersion, holder_of, read_slice, unavailable
from sparkdl.server.tls import TLSPin, self_signed
from sparkdl.spark.partitions import release, spill_dir
from sparkdl.spark.training import recovery, worker_state
from sparkdl.spark.training.recovery import KEEP_ON_DISK, DiskCopies, Look
from sparkdl.spark.training.tasks import TaskSpec, prepare_worker, replica_for
from sparkdl.spark.training.worker import Heartbeat, SupersededAttempt, load_rows, train_slot

log = logging.getLogger("sparkdl")
RESULT_SCHEMA = pa.schema([(name, pa.int32() if name == "partition" else pa.int64()) for name in
                           ("partition", "attempt", "rows", "steps", "pushes", "dropped", "retrained", "local_resets", "starts_rebuilt",
                            "bytes_pushed", "bytes_pulled", "train_ms", "wait_ms")])
RESULT_SPARK_SCHEMA = from_arrow_schema(RESULT_SCHEMA)
WAIT_CHUNK_S = 2.0  # a wait on the coordinator lasts at most this long before the worker looks again
HANDOFF_S = 60.0  # how long a superseded attempt keeps serving its slice for the attempt that replaces it (seconds)
# How long a pull or a put waits for an owner that does not answer (lost, cut off, being replaced): the
# driver's monitor (workerTimeout) or roundTimeout ends the stage first when it never comes back.
PATIENCE_S = 3600.0
# The longest one call to another worker's slice server waits beyond its bytes' time (seconds; above the
# server's own wait, WAIT_S = 5). Calls between workers are not retried by the client: the caller reads the
# slice map and asks again, so an owner cut off costs one such wait before its replacement is asked, not
# the client's retries x its timeout (measured: a cut owner held a round for 104 s with 4 x 30 s).
PEER_CALL_S = 15.0
FLUSH_S = 10.0  # how long an ending attempt waits for its slice copies to reach this executor's disk (seconds)


@dataclass(frozen=True)
class ShardedTaskSpec:
    """What travels to the sharded tasks: the fit's plain settings, the coordinator's address, token
    and pinned certificate (no weights), the slice layout (JSON), the mode, its settings and the
    trainable mask (for each owner's policy), the slots ``[first, last)`` and the clients' timeouts.

    ``layout``: the slice layout (JSON); with ``fresh_optimizer`` its weights only: the slices also
    hold the replicas' fresh optimizer state, whose arrays each task reads from its own replica
    (the driver never builds it);
    ``keep_local_optimizer``: workers keep their optimizer state and put their weights alone;
    ``encoding``: None, ``"fp16"`` (contributions as float16 differences from the round's start), or
    ``"int8"`` / ``"int4"`` / ``"1bit"`` / ``"threshold"`` (differences with error feedback, each piece
    against its start: :mod:`sparkdl.core.piece_codec`);
    ``checkpoint``: a sharded checkpoint's slices to start from (``{"uris": [...], "sha256": [...],
    "version": int}``), or None;
    ``overlap``: rounds that never block training, with sync points at the stage's first round and,
    with ``snapshots``, at each epoch's start and after each ``snapshot_every`` rounds
    (:class:`~sparkdl.core.modes.overlap.EagerOverlap`).
    """

    task: TaskSpec
    mode: str
    mode_settings: dict
    trainable: tuple
    names: tuple
    layout: dict
    location: str
    token: str
    tls: TLSPin | None
    first: int
    last: int
    keep_local_optimizer: bool = False
    fresh_optimizer: bool = False
    encoding: str | None = None
    checkpoint: dict | None = None
    overlap: bool = False
    snapshots: bool = False
    snapshot_every: int | None = None
    heartbeat_s: float = 2.0
    call_timeout_s: float = 30.0
    retries: int = 3


def reachable_address(location: str) -> str:
    """This machine's address on the route to ``location`` (the coordinator): where the other
    executors, on the driver's network, reach this one's slice server. Loopback for a loopback
    coordinator; ``SPARK_LOCAL_IP`` when set."""
    import os

    host = urlparse(location.replace("grpc+tls", "https").replace("grpc+tcp", "http")).hostname or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    if os.environ.get("SPARK_LOCAL_IP"):
        return os.environ["SPARK_LOCAL_IP"]
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # no packet is sent: the kernel picks the route's source address
        return probe.getsockname()[0]


def sharded_partition(spec: ShardedTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A sharded task (see the module docstring): yields one result row of :data:`RESULT_SCHEMA`. A
    failure is reported to the coordinator (heartbeat ``"error"`` with the message) before it is
    raised; Spark retries the task."""
    from sparkdl.server import ParameterServerClient

    context = TaskContext.get()
    partition, attempt = context.partitionId(), context.taskAttemptId()
    heartbeat = Heartbeat(spec.location, spec.token, spec.tls, spec.heartbeat_s, partition, attempt, spec.call_timeout_s).start()
    coordinator = CoordinatorClient(ParameterServerClient(spec.location, spec.token, tls=spec.tls, timeout_s=spec.call_timeout_s,
                                                          retries=spec.retries))
    worker = None
    try:
        prepare_worker(context, spec.task)
        data = load_rows(spec.task, partition, batches)
        worker = ShardedWorker(spec, coordinator, partition, attempt, context.attemptNumber(), heartbeat, stage_id=context.stageId())
        counts = worker.run(data)
        if worker.final:
            worker_state.drop(spec.task.fit_id, partition)
            release(spec.task.fit_id, "train", partition)
        coordinator.heartbeat(partition, "done", attempt=attempt)
    except SupersededAttempt:
        if worker is not None:
            worker.end_superseded()
        raise
    except BaseException as exc:
        try:
            if isinstance(exc, SliceLost):  # no retry mends it: the driver fails the fit at once
                coordinator.lost(partition, attempt, str(exc))
            coordinator.heartbeat(partition, "error", f"{type(exc).__name__}: {exc}", attempt=attempt)
        except Exception:  # noqa: BLE001 - the task's own error is the one to raise
            pass
        raise
    finally:
        if worker is not None:
            worker.close()
        heartbeat.stop()
        coordinator.close()
    yield pa.RecordBatch.from_pylist([{"partition": partition, "attempt": attempt, **counts}], schema=RESULT_SCHEMA)


def _flatten(residual: dict[int, ModelState]) -> list[np.ndarray]:
    """The residual of every piece as one list of arrays (a header array of each piece's counts first)."""
    counts = [(len(residual[j].weights), len(residual[j].optimizer or [])) for j in sorted(residual)]
    arrays = [a for j in sorted(residual) for a in [*residual[j].weights, *(residual[j].optimizer or [])]]
    return [np.asarray([c for pair in counts for c in pair], np.int64), *arrays]


def _unflatten(flat: list[np.ndarray]) -> dict[int, ModelState]:
    """The inverse of :func:`_flatten`."""
    counts, arrays, out, at = np.asarray(flat[0]).reshape(-1, 2), flat[1:], {}, 0
    for j, (weights, optimizer) in enumerate(counts.tolist()):
        out[j] = ModelState(list(arrays[at:at + weights]), list(arrays[at + weights:at + weights + optimizer]) or None)
        at += weights + optimizer
    return out


class ShardedWorker:
    """One worker and slice owner of a sharded stage (see the module docstring).

    Args:
        spec: the stage's settings.
        coordinator: a :class:`~sparkdl.server.coordinator.CoordinatorClient`.
        partition, attempt: this worker (its slice's index) and its task attempt id.
        attempt_number: Spark's attempt number of the task (the fault hooks).
        heartbeat: the task's :class:`~sparkdl.spark.training.worker.Heartbeat` (superseded attempts).
        stage_id: the task's Spark stage. The coordinator answers the registration with ``(stage id,
            the stage's current attempt)``; when an owner of a newer stage attempt registers, Spark
            resubmitted the stage: it runs every worker again and does not wait for this attempt, so
            this attempt ends (:class:`SupersededAttempt`) to free its task slot for its own
            replacement, which may have no other slot to run in.
    """

    def __init__(self, spec: ShardedTaskSpec, coordinator: CoordinatorClient, partition: int, attempt: int, attempt_number: int,
                 heartbeat: Heartbeat, stage_id: int | None = None) -> None:
        self.spec, self.coordinator, self.partition, self.attempt = spec, coordinator, partition, attempt
        self.attempt_number, self.heartbeat = attempt_number, heartbeat
        self.stage_id = stage_id
        self.stage: tuple[int, int] | None = None  # (stage id, attempt) as the coordinator answered the registration
        self.newer_stage: tuple[int, int] | None = None  # a newer stage attempt's, once seen in the slice map
        task = spec.task
        self.plan = task.plan
        self.layout = SliceLayout.from_json(spec.layout)  # its optimizer group from the replica, with fresh_optimizer
        self.owners = self.layout.owners
        settings = dict(spec.mode_settings)
        if policy_class(spec.mode).uses_trainable:  # the owner's pieces of the trainable mask
            settings["trainable"] = self.layout.per_piece(list(spec.trainable), partition)
        self.policy = get_policy(spec.mode, **settings)
        self.fresh: list[np.ndarray] | None = None  # the replica's fresh optimizer state (fresh_optimizer)
        self.counts = {"rows": 0, "steps": 0, "pushes": 0, "dropped": 0, "retrained": 0, "local_resets": 0, "starts_rebuilt": 0,
                       "bytes_pushed": 0, "bytes_pulled": 0, "train_ms": 0, "wait_ms": 0}
        self.eager = EagerOverlap(spec.first, self.plan.rounds_per_epoch if spec.snapshots else None,
                                  spec.snapshot_every) if spec.overlap else None
        self.starts: dict[int, ModelState] = {}  # overlap: round -> its start, pulled ahead by the sender
        # overlap without an encoding: a contribution is the worker's carried start, whose pieces the owners keep
        self.keeps_carried = spec.overlap and spec.encoding is None and not spec.keep_local_optimizer
        self.carried_starts: dict[int, ModelState] = {}  # overlap: round g -> this worker's carried start after it (the last 2)
        self._starts_lock = threading.Lock()  # overlap: one pull of a start at a time (the worker or its sender)
        self._counts_lock = threading.Lock()
        self._ending = threading.Event()  # overlap: the task ends; its sender stops at its next step
        self.map_version = -1
        self.registrations: list[dict | None] = [None] * self.owners
        self._clients: dict[int, SliceClient] = {}
        self._clients_lock = threading.Lock()
        self._unhandled: set[int] = set()  # owners that registered anew, seen by a thread that does not re-put (backups)
        self.pending: dict[int, tuple[ModelState, dict]] = {}  # owner -> (piece, meta) of the open round
        self.pool = ThreadPoolExecutor(max_workers=min(8, max(1, self.owners)), thread_name_prefix=f"sparkdl-slices-{partition}")
        self.server: SliceServer | None = None
        self.stopped = False
        self.final = False
        self.own_optimizer: list[np.ndarray] | None = None
        self.residual: dict[int, ModelState] = {}  # int8/int4/1bit/threshold: what quantization left of this worker's piece j
        self.disk = DiskCopies(spill_dir(task.fit_id), self.layout.has_optimizer, KEEP_ON_DISK + int(spec.overlap))

    # ---- the slice server and the slice map ----------------------------------------------------

    def start_server(self) -> dict:
        """Serve this worker's slice, register it and take the slice's state; returns the registration's answer."""
        spec = self.spec
        identity = self_signed()
        host = reachable_address(spec.location)
        self.server = SliceServer(self.partition, self.layout, self.policy, self.expected,
                                  names=self.layout.names(list(spec.names), self.partition), token=spec.token, tls=identity,
                                  host=host, on_ready=self._ready, send_backup=self._send_backup, persist=self.disk.write,
                                  keep_previous=spec.overlap, keep_carried=self.keeps_carried)
        self.server.start()
        reply = self.coordinator.register(self.partition, self.attempt, self.server.location, identity.cert_pem.decode(),
                                          identity.fingerprint, self.layout.to_json(), stage_id=self.stage_id)
        self.stage = tuple(reply["stage"]) if reply.get("stage") else None
        self._take_map(reply["map"])
        self._restore(reply)
        return reply

    def _take_map(self, slice_map: dict) -> list[int]:
        """Adopt the coordinator's slice map; returns the owners whose registration changed."""
        changed = []
        with self._clients_lock:
            for j, registration in enumerate(slice_map["owners"]):
                if registration != self.registrations[j]:
                    changed.append(j)
                    old = self._clients.pop(j, None)
                    if old is not None:
                        old.close()
                    self.registrations[j] = registration
                if self.stage is not None and registration is not None and registration.get("stage") is not None \
                        and tuple(registration["stage"]) > self.stage:
                    self.newer_stage = tuple(registration["stage"])
            self.map_version = slice_map["version"]
        return changed

    def client(self, owner: int) -> SliceClient:
        """A client of owner ``owner``'s slice server (as the slice map last said).

        Raises:
            SliceLost: the owner is not registered (yet).
        """
        with self._clients_lock:
            client = self._clients.get(owner)
            if client is None:
                registration = self.registrations[owner]
                if registration is None:
                    raise SliceLost(f"slice {owner} has no owner registered")
                pin = TLSPin(registration["cert"].encode(), registration["fingerprint"])
                client = SliceClient(registration["location"], self.spec.token, tls=pin,
                                     timeout_s=min(PEER_CALL_S, self.spec.call_timeout_s), retries=0)
                self._clients[owner] = client
            return client

    def _refresh_map(self, skip: int | None = None) -> list[int]:
        """Read the slice map and tend to the owners that registered anew since (with those the
        backup thread saw first): put them this round's pieces again, except ``skip`` (whose caller
        puts again itself)."""
        changed = self._take_map(self.coordinator.slice_map())
        with self._clients_lock:
            changed = sorted(set(changed) | self._unhandled)
            self._unhandled.clear()
        if changed:
            self._on_owners_changed(changed, skip)
        return changed

    def _on_owners_changed(self, changed: list[int], skip: int | None = None) -> None:
        """Owners in ``changed`` registered anew: put them this round's pieces again (but ``skip``),
        and send this slice's versions to its backup holder when that is one of them."""
        pending = self.pending  # the sender may replace it meanwhile (overlap)
        for owner in changed:
            if owner in pending and owner not in (self.partition, skip):
                piece, meta = pending[owner]
                self._put(owner, piece, meta)
        holder = holder_of(self.partition, self.owners)
        if holder is not None and holder in changed and self.server is not None:
            for version in sorted(v.version for v in (self.server.previous, self.server.committed, self.server.candidate) if v is not None):
                self._send_backup(version)

    def _restore(self, reply: dict) -> None:
        """Take this slice's state: the fit's start (first registration), else the version the
        driver accepted (and the candidate after it) from where :func:`recovery.restore_order` says,
        waiting at most :data:`recovery.RESTORE_WAIT_S` for a source that holds it.

        Raises:
            SliceLost: no source held it in that time.
        """
        spec, version, has_optimizer = self.spec, reply["version"], self.layout.has_optimizer
        previous = reply["previous"]
        on_disk = version in self.disk.versions(self.partition)
        order = recovery.restore_order(first_registration=reply["registrations"] == 1, at_fit_start=version == reply["start"],
                                       checkpoint=spec.checkpoint is not None, on_disk=on_disk,
                                       previous_answers=previous is not None and self._answers(previous))
        if order == (recovery.CHECKPOINT,):
            found = read_slice(spec.checkpoint["uris"][self.partition], spec.checkpoint["sha256"][self.partition])
            found.version = int(spec.checkpoint["version"])
            self.server.install(found)
            log.info("sparkdl: slice %d restored at version %d from the checkpoint", self.partition, found.version)
            return
        if order == (recovery.FIT_START,):
            found = self.coordinator.initial(self.partition, has_optimizer)
            if has_optimizer and not found.master.optimizer:  # the fit starts with a fresh optimizer: this replica's
                fresh = self.layout.take(ModelState([np.empty(s, d) for s, d in zip(self.layout.shapes[0], self.layout.dtypes[0],
                                                                                     strict=True)], self.fresh), self.partition)
                found.master = ModelState(found.master.weights, fresh.optimizer)
            self.server.install(found)
            log.info("sparkdl: slice %d restored at version %d from the fit's start", self.partition, found.version)
            return
        self._serve_disk_copies()
        looks: list[Look] = []

        def look() -> tuple | None:
            looks.clear()
            self._take_map(self.coordinator.slice_map())
            for source in order:
                found = self._look(source, version, previous, looks)
                if found is not None:
                    return found
            return None

        holder = holder_of(self.partition, self.owners)
        found = recovery.wait_bounded(look, f"slice {self.partition} (task attempt {self.attempt}) looks for its version {version}",
                                      recovery.RESTORE_WAIT_S, recovery.RESTORE_PAUSE_S, lambda: "; ".join(map(str, looks)) or "nobody asked",
                                      check=self._check)
        if found is None:
            registration = self.registrations[holder] if holder is not None else None
            where = "none (a single owner)" if holder is None else (
                f"worker {holder}'s task attempt {registration['attempt']} at {registration['location']}" if registration else
                f"worker {holder}, not registered")
            raise SliceLost(f"slice {self.partition} of the state (version {version}) must be found after its owner was lost. "
                            f"Received: it was found nowhere in {recovery.RESTORE_WAIT_S:g} s (owner: worker {self.partition}, "
                            f"task attempt {self.attempt}; backup holder: {where}; {'; '.join(map(str, looks)) or 'no source'}). Its "
                            "owner and every copy of it were lost together (two executors at once?): no retry can mend this; "
                            "resume from the fit's checkpointDir")
        committed, candidate, backups, what = found
        self.server.install(committed, candidate)
        for k, kept in backups:
            self.server.keep_backup(k, kept)
        log.info("sparkdl: slice %d restored at version %d from %s", self.partition, version, what)

    def _look(self, source: str, version: int, previous: dict | None, looks: list[Look]) -> tuple | None:
        """Ask one source for this slice's ``version``; returns ``(committed, candidate, backups,
        what)`` when it holds it, else None (its answer appended to ``looks``)."""
        if source == recovery.DISK:
            committed = self.disk.read(self.partition, version)
            looks.append(Look("this executor's disk", "here", self.disk.versions(self.partition)))
            if committed is None:
                return None
            return committed, self.disk.read(self.partition, version + 1), [], "this executor's disk"
        holder = holder_of(self.partition, self.owners)
        if source == recovery.PREVIOUS:
            asked = [("its previous owner", previous)]
        elif source == recovery.HOLDER:
            asked = [(f"its backup holder (worker {holder})", self.registrations[holder])] if holder is not None else []
        else:
            known = {previous["location"]} if previous else set()
            asked = [(f"worker {j}", self.registrations[j]) for j in range(self.owners)
                     if j not in (self.partition, holder) and self.registrations[j] is not None
                     and self.registrations[j]["location"] not in known]
        for what, registration in asked:
            if registration is None:
                continue
            try:
                pin = TLSPin(registration["cert"].encode(), registration["fingerprint"])
                with SliceClient(registration["location"], self.spec.token, tls=pin, timeout_s=min(10.0, self.spec.call_timeout_s),
                                 retries=1) as client:
                    versions = client.held(self.partition)
                    looks.append(Look(what, registration["location"], versions))
                    if version not in versions:
                        continue
                    has_optimizer = self.layout.has_optimizer
                    committed = client.fetch(f"held:{self.partition}:{version}", has_optimizer)
                    candidate = client.fetch(f"held:{self.partition}:{version + 1}", has_optimizer) if version + 1 in versions else None
                    backups = []
                    if source == recovery.PREVIOUS:  # it is on its way out: take what it kept for a neighbour, then release it
                        backups = self._take_backups(client)
                        try:
                            client.release()
                        except Exception:  # noqa: BLE001 - it may be gone already
                            pass
                return committed, candidate, backups, f"{what} at {registration['location']}"
            except Exception as exc:  # noqa: BLE001 - the next source
                looks.append(Look(what, registration["location"], error=f"{type(exc).__name__}: {str(exc)[:160]}"))
        return None

    def _serve_disk_copies(self) -> None:
        """Serve every copy of another slice this executor's disk holds (a neighbour's backup that a
        Python worker gone with its task kept): the slice's new owner may find it only here."""
        for k, versions in self.disk.everything().items():
            if k == self.partition:
                continue
            for kept in versions.values():
                self.server.keep_backup(k, kept, to_disk=False)
            log.info("sparkdl: slice server %d serves slice %d's versions %s from this executor's disk", self.partition, k,
                     sorted(versions))

    def _take_backups(self, source: SliceClient) -> list[tuple[int, SliceVersion]]:
        """The backups the previous owner of this slice kept for the slices this worker backs up
        (owner j - 1's), read from it before it ends. Best effort (its executor's disk has them too,
        and the owner j - 1 that is left sends them again when this worker registers)."""
        backed = [k for k in range(self.owners) if holder_of(k, self.owners) == self.partition and k != self.partition]
        taken = []
        try:
            for k in backed:
                for v in source.held(k):
                    taken.append((k, source.fetch(f"held:{k}:{v}", self.layout.has_optimizer)))
        except Exception as exc:  # noqa: BLE001 - the previous owner is on its way out
            log.warning("sparkdl: slice %d could not take the backups its previous owner kept: %s", self.partition, exc)
        return taken

    def _answers(self, registration: dict) -> bool:
        """Whether the slice server of ``registration`` answers now (within a few seconds)."""
        return self._answers_for(registration, self.partition)

    def _answers_for(self, registration: dict, slice_index: int) -> bool:
        try:
            pin = TLSPin(registration["cert"].encode(), registration["fingerprint"])
            with SliceClient(registration["location"], self.spec.token, tls=pin, timeout_s=3.0, retries=0) as probe:
                probe.held(slice_index)
            return True
        except Exception:  # noqa: BLE001 - gone, cut off, or not a server any more
            return False

    def _ready(self, version: int, problem: str | None) -> None:
        try:
            self.coordinator.ready(self.partition, self.attempt, version, problem)
        except Exception as exc:  # noqa: BLE001 - the driver's wait names the slice that never got ready
            log.warning("sparkdl: slice %d could not report version %d ready: %s", self.partition, version, exc)

    def _send_backup(self, version: int) -> None:
        holder = holder_of(self.partition, self.owners)
        found = self.server.held(version) if self.server is not None else None
        if holder is None or found is None:
            return
        for attempt in range(4):
            try:
                self.client(holder).put_backup(self.partition, found, self.attempt)
                return
            except Exception as exc:  # noqa: BLE001 - the holder may be restarting: a new one gets it again
                log.warning("sparkdl: slice %d could not send version %d to its backup holder %d: %s", self.partition, version, holder, exc)
                if attempt == 3:
                    return
                time.sleep(0.5 * 2 ** attempt)
                try:  # a new holder is asked next; the main thread puts every new owner its pieces again, this holder too
                    changed = self._take_map(self.coordinator.slice_map())
                    with self._clients_lock:
                        self._unhandled.update(changed)
                except Exception:  # noqa: BLE001
                    pass

    # ---- the rounds ------------------------------------------------------------------------------

    def expected(self, g: int) -> set[int]:
        """The workers with rows in round g (whose contributions round g waits for)."""
        r = g % self.plan.rounds_per_epoch
        return {p for p in range(len(self.plan.partition_rows)) if self.plan.row_range(p, r)[1] > self.plan.row_range(p, r)[0]}

    def _check(self) -> None:
        decision = recovery.supersession(later_attempt=self.heartbeat.superseded.is_set(), newer_stage=self.newer_stage is not None)
        if decision == recovery.END_NOW:
            raise SupersededAttempt(f"task attempt {self.attempt} of worker {self.partition} (stage {self.stage[0]}, attempt "
                                    f"{self.stage[1]}) is superseded: Spark resubmitted the stage (an owner of its attempt "
                                    f"{self.newer_stage[1]} registered); it ends to free its task slot")
        if decision == recovery.HAND_OFF:
            raise SupersededAttempt(f"task attempt {self.attempt} of worker {self.partition} is superseded by a later attempt "
                                    "(Spark resubmitted the stage while it ran); it ends to free its task slot")
        if self.server is not None and self.server.failure is not None:
            raise self.server.failure

    def wait_open(self, g: int) -> dict:
        """Wait until the driver opened round ``g`` (or stopped), tending to slice map changes meanwhile.
        Bounded by the driver (its ``roundTimeout`` cancels the stage); says at INFO what it waits
        for every :data:`recovery.QUIET_S` seconds."""
        started = said = time.monotonic()
        while True:
            self._check()
            reply = self.coordinator.wait_round(g, WAIT_CHUNK_S, self.partition, self.map_version)
            if reply["map_version"] != self.map_version or self._unhandled:
                self._refresh_map()
            if reply["open"] or reply["late"] or reply["stop"]:
                return reply
            if time.monotonic() - said >= recovery.QUIET_S:
                said = time.monotonic()
                log.info("sparkdl: worker %d (task attempt %d) waits %.0f s for the driver to open round %d (slice map version %d)",
                         self.partition, self.attempt, said - started, g, self.map_version)

    def run(self, data) -> dict:
        """Run the slots; returns the counts (``rows``, ``steps``, ``pushes``, ``dropped`` (pushes an
        owner did not count), ``retrained`` (rounds trained again after a retry), ``local_resets``
        (1 when this worker's own optimizer state was found nowhere), bytes pushed and pulled)."""
        spec = self.spec
        self.replica = replica_for(spec.task)
        self.data = data
        if spec.fresh_optimizer:  # the slices hold the optimizer state the replicas start with
            self.fresh = [np.asarray(a) for a in self.replica.initial_optimizer]
            weights = [(s, d) for s, d in zip(self.layout.shapes[0], self.layout.dtypes[0], strict=True)]
            self.layout = SliceLayout(weights, [(np.shape(a), a.dtype) for a in self.fresh], self.owners)
        reply = self.start_server()
        first = max(spec.first, reply["version"])
        retried = reply["registrations"] > 1
        if spec.keep_local_optimizer or spec.encoding in PIECEWISE:
            self._own_state(first)
        if self.eager is not None:
            self._run_overlapped(first, retried)
        else:
            self._run_blocking(first, retried)
        self.final = not self.stopped
        if not self.stopped:
            self.wait_open(spec.last)  # the driver reads the final slices, then stops
        return self.counts

    def _slots(self) -> set[int]:
        rounds = self.plan.rounds_per_epoch
        return {g for g in range(self.spec.first, self.spec.last)
                if self.plan.row_range(self.partition, g % rounds)[1] > self.plan.row_range(self.partition, g % rounds)[0]}

    def _own_state(self, first: int) -> None:
        """What this worker keeps of its own as of its last round before ``first`` (this Python
        worker or this executor's disk): its optimizer state (``keepLocalOptimizer``) and its
        quantization residual (:data:`~sparkdl.core.piece_codec.PIECEWISE`); fresh (counted) when it trained before and it is lost."""
        before = [g for g in range(first) if self.plan.row_range(self.partition, g % self.plan.rounds_per_epoch)[1]
                  > self.plan.row_range(self.partition, g % self.plan.rounds_per_epoch)[0]]
        if not before:
            return
        local = worker_state.load(self.spec.task.fit_id, self.partition, before[-1])
        lost = local is None
        if self.spec.keep_local_optimizer:
            lost = lost or local.optimizer is None
            if not lost:
                self.own_optimizer = local.optimizer
        if self.spec.encoding in PIECEWISE:
            lost = lost or local.residual is None
            if not lost:
                self.residual = _unflatten(local.residual)
        if lost:
            self.counts["local_resets"] = 1

    def _pull_start(self, g: int) -> ModelState:
        """Round ``g``'s start, assembled from every owner's slice (in parallel) into new arrays: the
        caller drops them once the replica holds them (one state less at the round's peak)."""
        whole = self.layout.empty()
        has_optimizer = self.layout.has_optimizer

        def one(owner: int) -> int:
            if owner == self.partition:
                piece = self.server.start_of(g, 60.0)
                if piece is None:
                    raise SliceLost(f"slice {owner} (this worker's own) does not hold round {g}'s start")
                nbytes = 0
            else:
                version = self._patiently(lambda: self.client(owner).fetch(f"start:{g}", has_optimizer), owner,
                                          f"pull round {g}'s start of slice {owner}")
                piece = version.master
                nbytes = sum(a.nbytes for a in [*piece.weights, *(piece.optimizer or [])])
            self.layout.put(whole, owner, piece)
            return nbytes

        pulled = sum(self.pool.map(one, range(self.owners)))
        with self._counts_lock:
            self.counts["bytes_pulled"] += pulled
        return whole

    def _patiently(self, call, owner: int, what: str):
        """``call()`` until it answers, asking again (the slice map read anew each time) while owner
        ``owner`` is unavailable (lost, cut off, being restored), at most :data:`PATIENCE_S`;
        says at INFO what it waits for after a few seconds.

        Raises:
            RoundTimeoutError: ``owner`` unavailable for :data:`PATIENCE_S` (the driver's
                ``workerTimeout`` or ``roundTimeout`` ends the stage first, as a rule).
            whatever ``call()`` raises that is not "unavailable, ask again".
        """
        last: list[str] = []

        def attempt():
            try:
                return (call(),)
            except Exception as exc:  # noqa: BLE001 - an owner lost or being restored: ask again (bounded)
                if not unavailable(exc):
                    raise
                last[:] = [f"{type(exc).__name__}: {str(exc)[:200]}"]
                return None

        def describe() -> str:
            registration = self.registrations[owner]
            serving = "nobody registered" if registration is None else f"task attempt {registration['attempt']} at {registration['location']}"
            return f"slice {owner}: {serving}; the last answer: {last[0] if last else 'none'}"

        def check() -> None:
            self._check()
            self._refresh_map(skip=owner)

        found = recovery.wait_bounded(attempt, f"worker {self.partition}: {what}", PATIENCE_S, 0.5, describe, check=check)
        if found is None:
            raise RoundTimeoutError(f"a slice owner must answer within {PATIENCE_S:g} s. Received: {what}: {describe()}")
        return found[0]

    def _put(self, owner: int, piece: ModelState, meta: dict) -> None:
        """Put this worker's piece of the open round to owner ``owner`` (its own slice: in process)."""
        if owner == self.partition:
            answer, nbytes = self.server.contribute(meta, piece), 0
        else:
            answer = self._patiently(lambda: self.client(owner).put_contribution(
                piece, round_=meta["round"], worker=self.partition, attempt=self.attempt, rows=meta["rows"], encoding=meta["encoding"]),
                owner, f"put round {meta['round']}'s piece to slice {owner}")
            nbytes = sum(a.nbytes for a in [*piece.weights, *(piece.optimizer or [])])
        with self._counts_lock:
            self.counts["bytes_pushed"] += nbytes
            self.counts["pushes"] += 1
            if not answer.get("applied"):
                self.counts["dropped"] += 1

    def _run_blocking(self, first: int, retried: bool) -> None:
        """Each round once the driver opened it: pull its start, train, put, report (:meth:`_train_round`)."""
        slots = self._slots()
        for g in range(first, self.spec.last):
            waited = time.perf_counter()
            answer = self.wait_open(g)
            self._waited(waited)
            if answer["stop"]:
                self.stopped = True
                return
            if answer["late"]:
                continue
            self.pending = {}
            if g in slots:
                if retried and g == first:
                    self.counts["retrained"] += 1
                self._train_round(g, answer)

    def _waited(self, since: float) -> None:
        """Count the seconds since ``since`` (``time.perf_counter``) as training held up by the exchange."""
        self.counts["wait_ms"] += int(1000 * (time.perf_counter() - since))

    def _train_round(self, g: int, answer: dict) -> None:
        """A blocking round: pull round ``g``'s start, train τ steps, put the pieces and report."""
        waited = time.perf_counter()
        start = self._pull_start(g)
        self._waited(waited)
        base = start if self.spec.encoding is not None else None  # what the encoded differences are taken from
        state, rows, steps, metrics = self._train(g, start, answer.get("learning_rate"))
        del start  # the replica holds its copy: the pulled arrays are not kept through training and the puts
        waited = time.perf_counter()
        self._contribute(g, state, base, rows, steps, metrics, self.own_optimizer)
        self._waited(waited)

    def _train(self, g: int, start: ModelState, learning_rate: float | None) -> tuple[ModelState, int, int, list]:
        """Train round ``g``'s τ steps from ``start``; returns ``(state, rows, steps, metric sums)``,
        ``state`` the weights alone with ``keepLocalOptimizer`` (whose state the worker keeps)."""
        spec = self.spec
        if spec.keep_local_optimizer:
            self.replica.set_state(ModelState(start.weights, self.own_optimizer))
        else:
            self.replica.set_state(start)
        if learning_rate is not None:
            self.replica.set_learning_rate(learning_rate)
        started = time.perf_counter()
        metrics, rows, steps = train_slot(spec.task, self.replica, self.data, self.partition, g, self.attempt_number)
        state = self.replica.get_state()
        self.counts["train_ms"] += int(1000 * (time.perf_counter() - started))
        if spec.keep_local_optimizer:
            self.own_optimizer = list(state.optimizer)
            state = ModelState(state.weights, None)
        return state, rows, steps, metrics

    def _run_overlapped(self, first: int, retried: bool) -> None:
        """``overlap`` (:mod:`sparkdl.core.modes.overlap`): a round that follows this worker's round
        before trains from that round's contribution, carried onto its start, as soon as the sender
        (:meth:`_send`) carried it; the sender then puts it and pulls the next start while this
        worker trains. At a sync point (or when the kept start is lost) the worker waits for the
        round to open and pulls its start. At most one round in flight; raises what the sender raised."""
        spec, eager, task = self.spec, self.eager, self.spec.task
        slots = self._slots()
        sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sparkdl-send-{self.partition}")
        in_flight: tuple[Future, Future] | None = None  # (the sender's job of the round before, its carried start)
        try:
            for g in range(first, spec.last):
                if g not in slots:
                    continue
                waited = time.perf_counter()
                follows = not eager.synchronous(g) and g - 1 in slots
                start = rate = None
                if follows and in_flight is not None:
                    carried = in_flight[1].result()
                    if carried is not None:
                        start, rate = carried
                elif follows and g == first:  # a retried attempt: what its previous attempt kept (recovery.start_order)
                    for source in recovery.start_order(follows=True, keeps_carried=self.keeps_carried, owners=self.owners):
                        if source == recovery.DISK:
                            start = worker_state.load_start(task.fit_id, self.partition, g - 1)
                        elif source == recovery.OWNERS:
                            start = self._rebuilt_start(g - 1)
                        if start is not None:
                            break
                    if start is None:
                        self.counts["local_resets"] = 1
                        log.warning("sparkdl: worker %d (task attempt %d) found no start of round %d on this executor or with the "
                                    "owners: it trains from the round's own start", self.partition, self.attempt, g)
                    else:
                        rate = self.wait_open(g - 1).get("learning_rate")
                if start is None:  # a sync point: the exchange before it drains
                    if in_flight is not None:
                        in_flight[0].result()
                        in_flight = None
                    answer = self.wait_open(g)
                    if answer["stop"]:
                        self.stopped = True
                        break
                    if answer["late"]:
                        continue
                    start, rate = self._start(g), answer.get("learning_rate")
                if self.stopped:
                    break
                self._waited(waited)
                if retried and g == first:
                    self.counts["retrained"] += 1
                state, rows, steps, metrics = self._train(g, start, rate)
                waited = time.perf_counter()
                if in_flight is not None:
                    in_flight[0].result()
                self._waited(waited)
                if self.stopped:
                    break
                carried = Future() if g + 1 in slots and not eager.synchronous(g + 1) else None
                job = sender.submit(self._send, g, start, state, rows, steps, metrics, self.own_optimizer, carried)
                in_flight = (job, carried if carried is not None else job)
                del start, state
            if in_flight is not None:
                waited = time.perf_counter()
                in_flight[0].result()
                self._waited(waited)
        finally:
            self._ending.set()
            sender.shutdown(wait=False, cancel_futures=True)
            with self._starts_lock:
                self.starts.clear()

    def _start(self, g: int) -> ModelState:
        """Round ``g``'s start: as the sender pulled it ahead, else pulled now (one pull at a time);
        the starts of earlier rounds are forgotten."""
        with self._starts_lock:
            for old in [r for r in list(self.starts) if r < g]:
                del self.starts[old]
            if g not in self.starts:
                self.starts[g] = self._pull_start(g)
            return self.starts[g]

    def _send(self, g: int, base: ModelState, state: ModelState, rows: int, steps: int, metrics, own_optimizer,
              carried: Future | None) -> None:
        """The sender of an overlapped round ``g``, trained from ``base``: once the driver opened
        round g, carry the state onto round g's start (:meth:`EagerOverlap.carry`), keep it on this
        executor and hand it to ``carried`` (with round g's learning rate): the start of this
        worker's next round; then put its pieces and report (unless round g closed already: a
        retried attempt's round), and pull round g + 1's start ahead when this worker trains it."""
        try:
            if self._ending.is_set():
                return
            answer = self.wait_open(g)
            if answer["stop"]:
                self.stopped = True
                return
            start = self._start(g)
            if start is not base:
                state = EagerOverlap.carry(state, base, start)
            if carried is not None:
                worker_state.save_start(self.spec.task.fit_id, self.partition, g, state)
                carried.set_result((state, answer.get("learning_rate")))
            if self.keeps_carried:
                self.carried_starts[g] = state
                for old in [r for r in list(self.carried_starts) if r < g - 1]:
                    self.carried_starts.pop(old, None)
            if not answer["late"]:
                self.pending = {}
                self._contribute(g, state, start if self.spec.encoding is not None else None, rows, steps, metrics, own_optimizer)
            del start, state
            if g + 1 < self.spec.last and g + 1 in self._slots() and not self._ending.is_set():
                ahead = self.wait_open(g + 1)
                if ahead["stop"]:
                    self.stopped = True
                    return
                self._start(g + 1)
        finally:
            if carried is not None and not carried.done():  # the worker waits on it: never leave it unresolved
                carried.set_result(None)

    def _contribute(self, g: int, state: ModelState, base: ModelState | None, rows: int, steps: int, metrics,
                    own_optimizer: list[np.ndarray] | None) -> None:
        """Put round ``g``'s pieces of ``state`` to their owners (differences from ``base`` with an
        encoding), keep what the worker keeps of its own, and report the round to the coordinator."""
        spec, task = self.spec, self.spec.task
        meta = {"round": g, "worker": self.partition, "attempt": self.attempt, "rows": rows, "encoding": spec.encoding}
        if spec.encoding in PIECEWISE:  # each piece quantized against its own start, with its own residual
            starts = self.layout.split(base if state.optimizer is not None else ModelState(base.weights, None))
            pieces = []
            for j, (piece, piece_start) in enumerate(zip(self.layout.split(state), starts, strict=True)):
                exact = [not t for t in self.layout.per_piece(list(spec.trainable), j)]  # non-trainable weights travel exactly
                wire, self.residual[j] = piece_codec.encode(piece, piece_start, self.residual.get(j), spec.encoding, task.threshold,
                                                            exact=exact)
                pieces.append(wire)
            del starts
        else:
            pieces = self.layout.split(encode_update(state, base, "fp16") if spec.encoding == "fp16" else state)
        del base
        if spec.keep_local_optimizer or spec.encoding in PIECEWISE:  # kept for a retried task on this executor
            residual = _flatten(self.residual) if spec.encoding in PIECEWISE else None
            worker_state.save(task.fit_id, self.partition, WorkerLocal(g, residual, own_optimizer))
        self.pending = {j: (pieces[j], meta) for j in range(self.owners)}
        jobs = [functools.partial(self._put, j, pieces[j], meta) for j in range(self.owners)]
        holder = holder_of(self.partition, self.owners)
        if self.keeps_carried and holder is not None:  # this worker's own piece lives beside its slice: a copy at the holder
            jobs.append(functools.partial(self._put_carried, holder, pieces[self.partition], g))
        list(self.pool.map(lambda job: job(), jobs))
        nbytes = sum(a.nbytes for p in pieces for a in [*p.weights, *(p.optimizer or [])])
        self.coordinator.report(self.partition, self.attempt, g, rows, encode_metric_sums(metrics), nbytes)
        self.counts["rows"] += rows
        self.counts["steps"] += steps

    def _put_carried(self, holder: int, piece: ModelState, g: int) -> None:
        """Put slice ``self.partition`` of this worker's contribution to round ``g`` to its backup
        holder, which keeps it for a retry of this worker on another executor (:meth:`_rebuilt_start`)."""
        self._patiently(lambda: self.client(holder).put_carried(piece, worker=self.partition, round_=g, slice_index=self.partition,
                                                                attempt=self.attempt), holder,
                        f"put round {g}'s own piece to its backup holder {holder}")
        with self._counts_lock:
            self.counts["bytes_pushed"] += sum(a.nbytes for a in [*piece.weights, *(piece.optimizer or [])])

    def _rebuilt_start(self, g: int) -> ModelState | None:
        """``overlap``, a retried attempt on another executor than its previous one: this worker's
        carried start after round ``g`` (its contribution to round g), assembled from the slices
        the owners keep (:class:`SliceServer` ``keep_carried``), this server's own included; the
        superseded attempts of a resubmitted stage hand theirs over as they end, so this waits for
        them at most :data:`HANDOFF_S`. None (and a warning) when a slice is found nowhere in that
        time."""
        whole, found = self.layout.empty(), set()
        looked: list[str] = []

        def look() -> bool | None:
            self._check()
            try:
                self._take_map(self.coordinator.slice_map())
            except Exception as exc:  # noqa: BLE001 - the driver busy: ask again (bounded)
                looked[:] = [f"the slice map: {type(exc).__name__}: {str(exc)[:160]}"]
            for k in self.server.carried_slices(self.partition, g):
                piece = self.server.carried_piece(self.partition, g, k)
                if k not in found and piece is not None:
                    self.layout.put(whole, k, piece)
                    found.add(k)
            with self._clients_lock:
                registrations = list(self.registrations)
            for j, registration in enumerate(registrations):
                if len(found) == self.owners:
                    break
                if j == self.partition or registration is None:
                    continue
                try:  # a short call: a registration of an owner gone costs seconds, not PEER_CALL_S a look
                    pin = TLSPin(registration["cert"].encode(), registration["fingerprint"])
                    with SliceClient(registration["location"], self.spec.token, tls=pin, timeout_s=min(5.0, self.spec.call_timeout_s),
                                     retries=0) as client:
                        for k in client.carried(self.partition, g):
                            if k not in found:  # straight into the whole state; the deadline grows with the piece's bytes
                                client.fetch_into(f"carried:{self.partition}:{g}:{k}", self.layout.views(whole, k))
                                found.add(k)
                except Exception as exc:  # noqa: BLE001 - an owner starting or gone: ask again
                    looked[:] = [f"worker {j}: {type(exc).__name__}: {str(exc)[:160]}"]
            return True if len(found) == self.owners else None

        done = recovery.wait_bounded(look, f"worker {self.partition} (task attempt {self.attempt}) assembles its start of round {g + 1}",
                                     HANDOFF_S, 0.5, lambda: f"slices found {sorted(found)}; {looked[0] if looked else 'no error'}")
        if done is None:
            log.warning("sparkdl: worker %d (task attempt %d) found slices %s of its start of round %d, not all of them, within %g s",
                        self.partition, self.attempt, sorted(found), g + 1, HANDOFF_S)
            return None
        self.counts["starts_rebuilt"] += 1
        log.info("sparkdl: worker %d (task attempt %d) assembled its start of round %d from the owners", self.partition, self.attempt, g + 1)
        return whole

    def _hand_carried(self) -> None:
        """A superseded attempt, before it ends: put the contribution pieces its server keeps and
        this worker's own carried starts (sliced) to owners of the newer stage attempt, where a
        retried worker on another executor finds them (:meth:`_rebuilt_start`), each to the first
        of :func:`recovery.carried_hand_order` that takes it. Best effort: at most :data:`HANDOFF_S` in
        all (a put may run past it by its own call timeout); never raises."""
        parcels = self.server.carried_pieces()
        for g, state in list(self.carried_starts.items()):
            for k, piece in enumerate(self.layout.split(state)):
                parcels.setdefault((self.partition, g, k), (self.attempt, piece))
        if not parcels:
            return
        deadline = time.monotonic() + HANDOFF_S

        def attempt() -> bool | None:
            try:
                self._take_map(self.coordinator.slice_map())
            except Exception:  # noqa: BLE001 - the driver busy or gone: ask again (bounded)
                return None
            with self._clients_lock:
                newer = {j for j in range(self.owners) if self.registrations[j] is not None and self.registrations[j].get("stage") is not None
                         and self.stage is not None and tuple(self.registrations[j]["stage"]) > self.stage}
            if self.replaced():
                newer.add(self.partition)
            for key in sorted(parcels):
                w, g, k = key
                contributor, piece = parcels[key]
                for j in recovery.carried_hand_order(w, k, newer):
                    if time.monotonic() >= deadline:
                        return None
                    try:
                        self.client(j).put_carried(piece, worker=w, round_=g, slice_index=k, attempt=contributor)
                    except Exception as exc:  # noqa: BLE001 - that owner is starting or gone: the next one, or ask again
                        log.info("sparkdl: superseded worker %d could not hand piece %s to worker %d: %s", self.partition, key, j, exc)
                        continue
                    del parcels[key]
                    break
            return True if not parcels else None

        handed = recovery.wait_bounded(attempt, f"superseded worker {self.partition} hands its contribution pieces", HANDOFF_S, 0.5,
                                       lambda: f"{len(parcels)} pieces not handed yet")
        if handed is None:
            log.warning("sparkdl: superseded worker %d (task attempt %d) ends with %d contribution pieces not handed over",
                        self.partition, self.attempt, len(parcels))
        else:
            log.info("sparkdl: superseded worker %d (task attempt %d) handed its contribution pieces over", self.partition, self.attempt)

    def replaced(self) -> bool:
        """Whether the slice map shows a later attempt of this worker serving its slice."""
        with self._clients_lock:
            own = self.registrations[self.partition]
        return own is not None and own["attempt"] > self.attempt

    def end_superseded(self) -> None:
        """This attempt was superseded (:func:`recovery.supersession`). First its copies (its slice
        and the backups it keeps) reach this executor's disk, where the next owner started here
        finds them. Then: a later attempt of this worker registered: serve it the slice and the
        backups until it took them (at most :data:`HANDOFF_S`). Only a newer stage attempt: put its
        copies (its own slice's and its neighbour's) to owners of that stage attempt first
        (:meth:`_hand_copies`: no new owner may ever start on this executor); when they could not
        be handed and this server holds the only live copy of its neighbour's slice, serve that
        copy until the neighbour's new owner (or this worker's replacement) took it, at most
        :data:`HANDOFF_S` (a single lost executor leaves at most one such holder, so the wait never
        holds the slot every other new owner needs); then end."""
        if self.server is None:
            return
        if not self.server.flush_disk(FLUSH_S):
            log.warning("sparkdl: slice %d: its copies did not reach this executor's disk within %g s", self.partition, FLUSH_S)
        later = self.heartbeat.superseded.is_set() or self.replaced()
        handed = self._hand_copies() if not later and self.newer_stage is not None else None
        if self.keeps_carried:  # after the slice's copies (no slice may be lost), before any wait for a taker
            try:
                self._hand_carried()
            except Exception as exc:  # noqa: BLE001 - best effort: a retry that finds no start starts afresh (counted)
                log.warning("sparkdl: superseded worker %d could not hand its contribution pieces: %s", self.partition, exc)
        later = later or handed == "replaced"
        decision = recovery.supersession(later_attempt=later, newer_stage=self.newer_stage is not None,
                                         only_copy=not later and handed != "sent" and self._only_copy())
        if decision == recovery.HAND_OFF and self.server.committed is not None:
            self.server.released.wait(HANDOFF_S)
        elif decision == recovery.SERVE_BACKUP:
            taken = recovery.wait_bounded(
                lambda: True if self.server.backup_taken.is_set() or self.server.released.is_set() else None,
                f"superseded slice server {self.partition} (task attempt {self.attempt}) serves the only copy of slice "
                f"{self._backed()} until its new owner takes it", HANDOFF_S, 0.5, lambda: f"backups held {sorted(self.server.backups)}")
            log.info("sparkdl: slice server %d (task attempt %d) ends: slice %s's copy %s", self.partition, self.attempt,
                     self._backed(), "taken" if taken else f"not taken within {HANDOFF_S:g} s")

    def _hand_copies(self) -> str | None:
        """Before this superseded attempt ends, put the copies it holds to owners of the newer stage
        attempt: its own slice's committed version and candidate (to its backup holder when that one
        registered, else the next owner round the ring) and the versions it backs up for its
        neighbour (to any owner but the neighbour's and its own). The other copy of either may have
        gone with a lost executor, and Spark may run the resubmitted tasks on a replacement executor,
        so that no new owner ever reads this executor's disk. A new owner looks at every owner
        (:data:`recovery.PEERS`); one forgets such a copy once it commits a newer version. Asks every
        0.5 s for at most :data:`HANDOFF_S` (one more put may run past it, bounded by its own call
        timeout).

        Returns:
            ``"sent"``, ``"partly"`` (with two owners the neighbour's backup has nobody to go to but
            this worker's replacement: the rest was sent), ``"replaced"`` (this worker's own later
            attempt registered meanwhile, or took the slice: it takes the copies from this server),
            or None (not every copy was taken in time: a warning; they stay on this executor's disk).
        """
        p, n = self.partition, self.owners
        parcels = {p: [v for v in (self.server.committed, self.server.candidate) if v is not None]}
        backed = self._backed()
        if backed is not None:
            kept = dict(self.server.backups.get(backed, {}))
            parcels[backed] = [kept[v] for v in sorted(kept)]
        # a copy only this attempt's own replacement could take (two owners: the neighbour's backup) is not waited for
        skipped = [k for k, versions in parcels.items() if versions and not recovery.hand_order(k, list(range(n)), p, n)]
        parcels = {k: versions for k, versions in parcels.items() if versions and k not in skipped}
        deadline = time.monotonic() + HANDOFF_S
        told: list[str] = []

        def attempt() -> str | None:
            if self.server.released.is_set():
                return "replaced"
            try:
                self._take_map(self.coordinator.slice_map())
            except Exception as exc:  # noqa: BLE001 - the driver is busy or gone: ask again (bounded)
                told[:] = [f"the slice map could not be read: {exc}"[:200]]
                return None
            if self.replaced():
                return "replaced"
            with self._clients_lock:
                newer = [j for j in range(n) if self.registrations[j] is not None and self.registrations[j].get("stage") is not None
                         and tuple(self.registrations[j]["stage"]) > self.stage]
            for k in sorted(parcels):
                for j in recovery.hand_order(k, newer, p, n):
                    if time.monotonic() >= deadline:
                        return None
                    try:
                        for version in parcels[k]:
                            self.client(j).put_backup(k, version, self.attempt)
                    except Exception as exc:  # noqa: BLE001 - that owner is starting or gone: the next one, or ask again
                        told[:] = [f"slice {k} to worker {j}: {type(exc).__name__}: {str(exc)[:200]}"]
                        continue
                    log.info("sparkdl: superseded slice server %d (task attempt %d) put slice %d's versions %s to worker %d of "
                             "the newer stage attempt", p, self.attempt, k, [v.version for v in parcels.pop(k)], j)
                    break
            return None if parcels else "partly" if skipped else "sent"

        found = recovery.wait_bounded(attempt, f"superseded slice server {p} (task attempt {self.attempt}) puts its copies to owners "
                                      "of the newer stage attempt", HANDOFF_S, 0.5,
                                      lambda: f"slices {sorted(parcels)} not handed yet; " + (told[0] if told else
                                                                                            "no owner of the newer stage attempt registered yet"))
        if found is None:
            log.warning("sparkdl: superseded slice server %d (task attempt %d) ends before owners of the newer stage attempt took "
                        "slices %s (%s): they stay on this executor's disk", p, self.attempt, sorted(parcels),
                        told[0] if told else "none registered")
        return found

    def _backed(self) -> int | None:
        """The slice whose backup this worker keeps (None with a single owner)."""
        return next((k for k in range(self.owners) if k != self.partition and holder_of(k, self.owners) == self.partition), None)

    def _only_copy(self) -> bool:
        """Whether this server may hold the only live copy of the slice it backs up: it holds its
        versions, and that slice's owner as this attempt last knew it does not answer."""
        k = self._backed()
        if k is None or not self.server.backups.get(k):
            return False
        with self._clients_lock:
            registration = self.registrations[k]
        return registration is None or not self._answers_for(registration, k)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self._clients_lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
        if self.server is not None:
            self.server.shutdown()
