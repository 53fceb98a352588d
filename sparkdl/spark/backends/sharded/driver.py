"""Transport ``sharded``: the fit's state in N slices owned and served by the workers themselves;
the driver only coordinates.

The driver starts a :class:`~sparkdl.server.coordinator.Coordinator` (Arrow Flight, TLS with a
per-fit certificate, a per-fit token) and runs the workers as one Spark stage of ordinary,
retryable tasks (:func:`~sparkdl.spark.backends.sharded.task.sharded_partition`, one per partition
of the cached training data). Each task trains its partition and owns one slice of the state
(:class:`~sparkdl.core.slices.SliceLayout`: 1/N of the weights, of the optimizer state and of the
mode's state), which it serves from its executor (:class:`~sparkdl.server.slices.SliceServer`). A
round: the driver opens it; every worker pulls the round's start from every owner, trains τ steps
and puts slice j of its state to owner j (a reduce-scatter), reporting its rows and metric sums
to the driver; each owner applies the mode's policy to its slice (``sync``, ``bmuf``, ``diloco``:
elementwise, pure numpy) and reports the new version ready; once every slice is ready and every
worker reported, the driver closes the round, runs the callbacks and opens the next, whose pulls
are the all-gather. Per round a worker sends and receives (N−1)/N·S of its pieces, S_f/N (its
slice's new version to its backup holder) and (N−1)/N·S_f of the start it pulls: (2N−1)/N·S_f each
way in full precision, as the emulated cluster's links measure (S_f: the float32 state, 12 bytes a
parameter with Adam's, 4 with ``keepLocalOptimizer``; S: what it puts, S_f or, per value, 2 bytes
with ``fp16``, 1.02 with ``int8``, 0.52 with ``int4``); the driver moves a few hundred bytes per worker. With ``overlap`` the same bytes move while the
workers train the next round (:mod:`sparkdl.core.modes.overlap`), and without an encoding each
worker's own slice's piece to its backup holder too (S/N: what a retry on another executor
assembles its start from); the driver's loop is unchanged.

The driver never holds the whole state while the fit trains: it serves each slice's start once,
fetches the weights at an epoch's end only when a callback needs the model, and assembles the
fitted model once, at the end (one copy, streamed slice by slice).

**Failures.** Spark retries a failed task (a killed Python worker, a lost executor) on its own
while the others wait at the round. Each owner sends every new version of its slice to the next
owner (its backup holder) before reporting it ready, so the retried task serves its slice again
from that copy; the other workers put their pieces of the open round to it again (each piece is
counted once per round: duplicates are dropped), and the round completes with the model an
undisturbed fit makes. A slice found nowhere (its owner and its holder lost together) fails the
fit naming it; a worker silent for ``workerTimeout`` fails the fit naming its partition.

**Not sliced**: what the registry (:mod:`sparkdl.spark.backends`) does not declare for this
backend is refused before any job, naming what to use instead: the asynchronous modes (their rule
runs push by push on one server: backend ``ps``), ``easgd`` and ``gossip`` (a model per worker),
straggler-tolerant rounds and validation data.
"""

from __future__ import annotations

import logging
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from sparkdl.core.piece_codec import PIECEWISE
from sparkdl.core.board import SliceBoard
from sparkdl.core.slices import SliceLayout, mode_slice
from sparkdl.core.state import FitState, ModelState, RoundUpdates
from sparkdl.errors import ConfigError, InvariantError, RoundTimeoutError, ServerError, WorkerError
from sparkdl.server.coordinator import Coordinator
from sparkdl.server.slices import SliceClient, SliceVersion
from sparkdl.server.tls import TLSPin, tls_identity
from sparkdl.spark.backends import backend, running
from sparkdl.spark.backends.sharded.task import RESULT_SPARK_SCHEMA, ShardedTaskSpec, sharded_partition
from sparkdl.spark.partitions import spill_dir
from sparkdl.spark.training.contract import RoundOrders, RoundReport, SlicedMaster, TransportOptions
from sparkdl.spark.training.job import TrainJob
from sparkdl.spark.training.nodes import SlotWatch
from sparkdl.spark.training.membership import Membership, stage_attempt
from sparkdl.spark.training.stage import StageWatch

log = logging.getLogger("sparkdl")


class RemoteState(SlicedMaster):
    """The master as the slices hold it at ``version``: its arrays are fetched from the owners when
    read (:attr:`weights`, :attr:`optimizer`), once, and never while nobody reads them."""

    def __init__(self, transport: ShardedTransport, version: int) -> None:
        self._transport, self.version = transport, version
        self._state: ModelState | None = None

    def _fetch(self) -> ModelState:
        if self._state is None:
            self._state = self._transport.fetch_master(self.version)
        return self._state

    @property
    def weights(self) -> list[np.ndarray]:
        return self._fetch().weights

    @property
    def optimizer(self) -> list[np.ndarray] | None:
        return self._fetch().optimizer

    def write_slices(self, folder: str, name: str) -> dict:
        """Have every owner write its slice of this version next to a snapshot (``folder``: a URI
        the executors reach through ``pyarrow.fs``); returns the manifest."""
        return self._transport.write_slices(self.version, folder, name)


class OwnersMaster:
    """The master in the slice owners' hands (:class:`~sparkdl.spark.training.contract.MasterHandle`):
    they apply the mode's policy where the state lives and check it finite; the loop holds a
    :class:`RemoteState` of each version, read from the slices only when used."""

    def __init__(self, transport: ShardedTransport) -> None:
        self.transport = transport

    def starts(self, fit: FitState) -> None:
        return None  # each owner serves its slice's start

    def advance(self, fit: FitState, report: RoundReport, description: str) -> None:
        fit.master = self.transport.master(fit.rounds + 1)  # the owners checked their slices finite (the round raised otherwise)
        return None

    def adopt(self, fit: FitState, state: ModelState) -> None:
        self.transport.adopt(state)

    def final(self, fit: FitState) -> None:
        fit.master = self.transport.final  # read from the slices once, at the end


class ShardedTransport:
    """The workers own the state's slices; the driver coordinates (see the module docstring)."""

    name = "sharded"
    rides_validation = False  # no validation data on sharded

    def __init__(self, job: TrainJob, policy, options: TransportOptions) -> None:

        self.job, self.policy, self.options = job, policy, options
        self.handle = OwnersMaster(self)  # the slice owners apply the mode's policy; the driver loop does not
        config = job.config
        self.rounds_per_epoch = job.plan.rounds_per_epoch
        self.total_slots = config.epochs * self.rounds_per_epoch
        # int8 / int4 / 1bit / threshold send the weights' update alone: the workers keep their optimizer state (Adam's second moment,
        # quantized against its start, can land below zero and the next step divides by its root)
        self.keep_local = config.keep_local_optimizer or policy.local_optimizer or config.compression in PIECEWISE
        self.bind, self.advertise = job.cluster.server_addresses()
        self.identity = tls_identity(config.server_cert_file, config.server_key_file, config.server_tls)
        self.coordinator: Coordinator | None = None
        self.stages: StageWatch | None = None
        self._layout: SliceLayout | None = None  # the driver's: the weights alone when the slices start a fresh optimizer
        self.results: list[pa.Table] = []
        self.final: ModelState | None = None
        self.fetched_bytes = 0

    # ---- the loop's calls ------------------------------------------------------------------------

    def start(self, fit: FitState) -> None:
        job, config = self.job, self.job.config
        master = fit.master
        manifest = getattr(master, "manifest", None)  # resumed from a snapshot the owners wrote: each reads its own slice
        self.checkpoint = None
        # a fit that starts a fresh optimizer (master.optimizer None): the owners take it from their replicas, so the
        # driver never builds it; the slices' whole layout comes with their registrations
        self.fresh_optimizer = manifest is None and master.optimizer is None and not self.keep_local
        if manifest is not None:
            self._layout = SliceLayout.from_json(manifest["layout"])
            if self._layout.owners != job.workers:
                raise InvariantError(f"a sharded snapshot must have one slice per worker. Received: {self._layout.owners} slices for "
                                     f"{job.workers} workers")
            self.checkpoint = {"uris": manifest["uris"], "sha256": manifest["sha256"], "version": fit.rounds}
        else:
            has_optimizer = master.optimizer is not None and not self.keep_local
            self._layout = SliceLayout.of(ModelState(master.weights, master.optimizer if has_optimizer else None), job.workers)
        layout, version, mode = self._layout, fit.rounds, dict(fit.mode)
        board = SliceBoard(job.workers, job.workers)
        board.opened = fit.rounds - 1  # closed: the next round to open is fit.rounds

        def initial(owner: int) -> SliceVersion:
            if manifest is not None:
                raise InvariantError("a resumed sharded fit's owners read their slices from the snapshot")
            state = ModelState(master.weights, master.optimizer if layout.has_optimizer else None)
            return SliceVersion(version, layout.take(state, owner), mode_slice(layout, mode, owner))

        self.coordinator = Coordinator(board, initial, host=self.bind, advertise=self.advertise, port=config.server_port,
                                       tls=self.identity, stage_attempt=lambda stage_id: stage_attempt(job.spark, stage_id))
        try:
            self.coordinator.start()
        except ServerError as exc:
            raise ServerError(f"{exc} (serverPort={config.server_port})") from exc
        self.board = board
        others = [b for b in running(config.mode) if b != "sharded" and not backend(b).long_lived]
        elsewhere = "" if self.keep_local or not others else f", or on backend {others[0]!r}"
        resume = (" With checkpointDir set, the fit run again resumes from the slices' last snapshot." if config.checkpoint_dir
                  else " Set checkpointDir for a fit run again to resume from its last snapshot.")
        members = Membership(job.spark, self.coordinator.contacts, self.coordinator.attempts, config.worker_timeout_s,
                             nodes=SlotWatch.for_job(job, "sharded workers"))
        self.stages = StageWatch(job.spark, members, config.round_timeout_s, "sharded worker",
                                 lost_advice="Every slice owner runs at once: run the fit again once the node is back, or with numWorkers at "
                                             f"most the task slots left{elsewhere}.{resume}")
        self.pool = ThreadPoolExecutor(max_workers=min(8, job.workers), thread_name_prefix="sparkdl-sharded-fetch")
        self._start_stage(fit.rounds)
        log.info("fit %s: backend sharded, %d slices of %.1f MB of weights (%s)", job.fit_id[:8], layout.owners, layout.nbytes() / layout.owners / 1e6,
                 "weights only: workers keep their optimizer state" if self.keep_local else "weights and optimizer state")

    def _start_stage(self, first: int) -> None:
        job, config = self.job, self.job.config
        spec = ShardedTaskSpec(
            task=job.task_spec(), mode=config.mode, mode_settings=self.policy.settings(), trainable=tuple(job.trainable),
            names=tuple(job.names), layout=self._layout.to_json(), location=self.coordinator.location, token=self.coordinator.token,
            tls=self.identity.pin() if self.identity is not None else None, first=first, last=self.total_slots,
            keep_local_optimizer=self.keep_local, fresh_optimizer=self.fresh_optimizer, encoding=config.compression,
            heartbeat_s=config.heartbeat_s,
            checkpoint=self.checkpoint, overlap=config.overlap, snapshots=self.options.snapshots,
            snapshot_every=config.checkpoint_every if config.checkpoint_dir else None,
        )
        out = job.data.df.mapInArrow(lambda batches: sharded_partition(spec, batches), RESULT_SPARK_SCHEMA)
        tag = f"sparkdl-{job.fit_id}-sharded-{first}"
        description = f"sparkdl fit {job.fit_id[:8]}: {config.mode} on sharded, rounds {first + 1}-{self.total_slots}"
        self.stages.run(out.toArrow, description, tag, config.round_timeout_s * max(1, self.total_slots - first), list(range(job.workers)))

    @property
    def layout(self) -> SliceLayout:
        """The slices' layout: as the owners registered it (with the optimizer state they took
        from their replicas), else the driver's."""
        registered = self.coordinator.layout if self.coordinator is not None else None
        if registered is not None and (self._registered is None or self._registered[0] is not registered):
            self._registered = (registered, SliceLayout.from_json(registered))
        return self._registered[1] if registered is not None else self._layout

    _registered = None

    def run_round(self, orders: RoundOrders) -> RoundReport:
        job, board, plan = self.job, self.board, self.job.plan
        r = orders.round_in_epoch
        g = orders.index
        self._wait(lambda: board.ready_version() >= g or bool(board.problems), f"every slice ready for {orders.description}")
        self._check_problems(orders)
        expected = {p for p in range(job.workers) if plan.row_range(p, r)[1] > plan.row_range(p, r)[0]}
        self.coordinator.learning_rate = orders.learning_rate
        board.learning_rate = orders.learning_rate
        board.open(g, None, expected, orders.learning_rate, orders.collect)

        def closable() -> bool:
            return bool(board.problems) or (expected <= board.pushed() and board.ready_version() >= g + 1)

        self._wait(closable, orders.description)
        self._check_problems(orders)
        collection = board.close()
        return RoundReport(updates=RoundUpdates(collection.rows), workers=collection.workers, metrics=collection.metrics,
                           nbytes=collection.nbytes, rows_expected=plan.round_rows(r))

    def _wait(self, ready, what: str) -> None:
        """:meth:`StageWatch.wait` for the board; a round that times out says where it stood.

        Raises:
            WorkerError: an owner found its slice nowhere (``SliceLost``): no retry mends that, so the
                fit fails at once, with the owner's words (the slice, its owner and its holder).
        """
        board = self.board
        try:
            self.stages.wait(lambda: bool(board.lost) or ready(), what, block=board.wait_change)
        except RoundTimeoutError as exc:
            raise RoundTimeoutError(f"{exc} ({board.describe()})") from None
        if board.lost:
            raise WorkerError(f"every slice of the state must be served again after a fault. Received: SliceLost: "
                              f"{'; '.join(board.lost)[:3000]}; the fit's job was cancelled")

    def _check_problems(self, orders: RoundOrders) -> None:
        if self.board.problems:
            raise InvariantError(f"the master weights must stay finite. Received: {'; '.join(self.board.problems)} "
                                 f"({orders.description}; the loss diverged: lower the learning rate, or check the inputs' scale)")

    def master(self, version: int) -> RemoteState:
        """The master at ``version`` (after that many rounds), read from the slices when needed."""
        return RemoteState(self, version)

    def adopt(self, state: ModelState) -> None:
        """A callback set the weights mid-fit: not taken by the slices (yet).

        Raises:
            ConfigError: always, naming the backends that take them.
        """
        raise ConfigError("a callback set the model's weights or optimizer variables during the fit; backend 'sharded' keeps "
                          "them in its workers' slices and does not take them back: use backend 'ps' or 'rounds' for such "
                          "callbacks (EarlyStopping(restore_best_weights=True) works: it applies after the fit)")

    def fetch_master(self, version: int, weights_only: bool = False) -> ModelState:
        """The master at ``version`` assembled from every owner's slice: one copy on the driver, each
        slice read straight into its place. The weights come first and are kept encoded (Arrow IPC,
        read through zero-copy views: :func:`~sparkdl.serialization.arrow_codec.encoded_views`, as
        the fitted model keeps them; their arrays are dropped before the encoded stream is copied
        into ``bytes``, so they cost at most 2·W at once, W their bytes), then the optimizer state:
        the driver's peak is the state once (W + the optimizer's bytes) plus what the reads hold in
        flight (a few MB per owner)."""
        from sparkdl.serialization.arrow_codec import encode_buffer, encoded_views

        layout = self.layout
        whole = layout.empty()  # uninitialized: the optimizer's arrays take memory only once read into
        self._read(f"weights:{version}", whole, (0,))
        stream = encode_buffer(whole.weights, list(self.job.names))
        whole = ModelState([], whole.optimizer)  # the weights' arrays are free now
        weights = encoded_views(bytes(stream))
        del stream
        if weights_only or not layout.has_optimizer:
            return ModelState(weights, None)
        self._read(f"optimizer:{version}", whole, (1,))
        return ModelState(weights, whole.optimizer)

    def _read(self, ticket: str, whole: ModelState, groups: tuple[int, ...]) -> None:
        """Read ``ticket`` from every owner into its pieces of ``whole`` (in parallel)."""
        layout = self.layout
        registrations = self.board.slice_map()["owners"]

        def one(owner: int) -> int:
            registration = registrations[owner]
            if registration is None:
                raise InvariantError(f"slice {owner} must be registered to be read. Received: no owner")
            pin = TLSPin(registration["cert"].encode(), registration["fingerprint"])
            with SliceClient(registration["location"], self.coordinator.token, tls=pin, timeout_s=60.0, retries=3) as client:
                return client.fetch_into(ticket, layout.views(whole, owner, groups))

        self.fetched_bytes += sum(self.pool.map(one, range(layout.owners)))

    def write_slices(self, version: int, folder: str, name: str) -> dict:
        """Every owner writes its slice of ``version`` to ``folder/name.slice-<j>-of-<N>.arrow``
        (through ``pyarrow.fs`` on its executor); returns the manifest (layout, files, SHA-256)."""
        layout = self.layout
        registrations = self.board.slice_map()["owners"]
        uris = [f"{folder.rstrip('/')}/{name}.slice-{j}-of-{layout.owners}.arrow" for j in range(layout.owners)]

        def one(owner: int) -> dict:
            registration = registrations[owner]
            pin = TLSPin(registration["cert"].encode(), registration["fingerprint"])
            with SliceClient(registration["location"], self.coordinator.token, tls=pin, timeout_s=600.0, retries=3) as client:
                return client.write(uris[owner], version)

        written = list(self.pool.map(one, range(layout.owners)))
        return {"version": version, "layout": layout.to_json(), "uris": uris, "sha256": [w["sha256"] for w in written],
                "bytes": [w["bytes"] for w in written]}

    def validate(self, weights: list, epoch: int, last: bool) -> None:
        return None  # a validation job evaluates

    def pause(self) -> None:
        """The stage holds the slices for the whole fit (validation is refused before any job)."""

    def finish(self, stopped: bool) -> None:
        if self.coordinator is None:
            return
        version = self.board.opened + 1
        self.final = self.fetch_master(version)
        self.board.stop()
        table = self.stages.end("the end of the sharded stage")
        if table is not None:
            partitions = sorted(table.column("partition").to_pylist())
            if partitions != list(range(self.job.workers)):
                raise InvariantError(f"the sharded stage must return one result per partition 0..{self.job.workers - 1}. "
                                     f"Received partitions {partitions}")
            self.results.append(table)
        if stopped:
            self.job.release_executors()

    def close(self) -> None:
        if self.stages is not None:
            self.stages.close()
        if self.coordinator is not None:
            self.coordinator.shutdown()
        if getattr(self, "pool", None) is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(spill_dir(self.job.fit_id), ignore_errors=True)

    def info(self) -> dict:
        if self.coordinator is None:
            return {}
        out = {"server_location": self.coordinator.location, "server_bind": self.bind, "server_tls": self.identity is not None,
               **self.stages.members.info(), "slices": self.layout.owners, "slice_bytes": self.layout.nbytes() // self.layout.owners,
               "keep_local_optimizer": self.keep_local, "driver_bytes_fetched": self.fetched_bytes,
               "overlap": self.job.config.overlap,
               "coordinator": self.coordinator.stats(), "slice_map_version": self.board.map_version}
        if self.results:
            rows = pa.concat_tables(self.results).to_pydict()
            for name in ("worker_rows", "worker_steps", "worker_pushes", "worker_dropped", "worker_retrained", "worker_starts_rebuilt",
                         "worker_bytes_pushed", "worker_bytes_pulled", "worker_train_ms", "worker_wait_ms"):
                per = {}
                for partition, value in zip(rows["partition"], rows[name.removeprefix("worker_")], strict=True):
                    per[partition] = per.get(partition, 0) + value
                out[name] = [per[p] for p in sorted(per)]
            out["local_state_resets"] = int(sum(rows["local_resets"]))
        return out


def transport(job: TrainJob, policy, options: TransportOptions) -> ShardedTransport:
    """The ``sharded`` transport of a fit (the registry's entry point)."""
    return ShardedTransport(job, policy, options)
