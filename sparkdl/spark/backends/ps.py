"""Backend ``ps``: one long-lived barrier stage whose tasks talk to a parameter server on the driver.

The driver starts a :class:`sparkdl.server.ParameterServer` (Arrow Flight, bearer token) holding
the master weights and optimizer state, then runs ONE ``mapInArrow(..., barrier=True)`` job over
the cached training data (one partition per worker). Each task keeps its partition and its Keras
replica for the whole fit and walks the fit's schedule of slots (epoch, round), the same rows and
seeds as backend ``rounds`` (:class:`~sparkdl.core.schedule.RoundPlan`, ``epoch_order``,
``Replica.seed_round``):

* the round modes (``sync``, ``bmuf``, ``easgd``, ``gossip``): in each slot the worker waits until
  the server's :class:`~sparkdl.core.ps_rules.SyncRoundRule` closed the previous round, pulls its
  start state for the round (ticket ``state:<partition>``: the master, BMUF's W + η·Δ, or its own
  model in easgd and gossip, routed by the server), trains its τ steps and pushes its whole state
  (or its fp16 / 1bit / threshold update, the residual and, for 1bit/threshold, the optimizer
  state kept by the worker), its rows and its metric sums; the rule applies the mode's policy
  when the round closes. Workers with no rows in a slot push ``rows=0``. The result equals
  backend ``rounds`` (same seed, same partitions). With ``minWorkersPerRound`` the server closes
  a round once the minimum pushed and ``roundDeadline`` passed; a later push is answered
  ``dropped="late"`` (its residual and optimizer state roll back) and its worker skips to the
  open round; the rows it missed are counted and checked.
* ``async`` (Downpour), ``hogwild``, ``staleness_aware``, ``ssp``: in each slot where it has rows
  the worker pulls the master weights (keeping its own optimizer state), trains τ steps and
  pushes Δ = new − pulled weights; the mode's rule (:mod:`sparkdl.core.async_rules`) applies it
  as it arrives. ``ssp`` first waits until the worker is at most ``staleness`` clocks (slots)
  ahead of the slowest worker still training. The last push also carries the worker's optimizer
  state; the fitted model gets their row-weighted mean. With ``compression`` every push but the
  last is float16 or quantized (the residual kept by the worker); the last is in full precision,
  with the residual added.

Every push carries (worker = partition, attempt, seq = the slot's index + 1): the server drops a
repeated seq or a push of a superseded attempt, and a retried task first asks the server which
seq it applied last and skips those slots, so a Spark retry never applies an update twice.

Liveness: the server records each worker's last contact (push, pull wait, heartbeat); the driver
cancels the job and raises :class:`~sparkdl.errors.WorkerError` naming the partition when one is
silent longer than ``workerTimeout`` seconds. Before any job the driver checks that the cluster
has a task slot per worker and that dynamic allocation is off (Spark refuses barrier stages with
it, after a wait of minutes). Each task returns one small Arrow row; the driver checks that every
partition finished and that each epoch trained every counted row once.

Spark Connect: the server runs in the Connect client's process, so the executors must reach this
machine. With a Connect server on this machine (``remote("local[...]")``, or a loopback URL and a
``local`` master) it binds 127.0.0.1; with a remote Connect server it binds the address set in
``spark.sparkdl.ps.host`` (:data:`PS_HOST_CONF`), and without one the fit is refused before any
job. The task slots are counted from the settings (a ``local`` master's threads,
``local-cluster``, or executor instances × cores); when they do not tell, Spark's own barrier
check applies.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkdl.core.compression import QUANTIZED, encode_update, quantize_update
from sparkdl.core.metrics import append_epoch
from sparkdl.core.modes import ModePolicy
from sparkdl.core.ps_rules import EpochRecorder, SyncRoundRule, encode_metric_sums
from sparkdl.core.schedule import epoch_order
from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError, FitCancelledError, InvariantError, RoundTimeoutError, ServerError, WorkerError
from sparkdl.serialization.arrow_codec import decode_arrays
from sparkdl.spark.backends.base import FitResult, TrainJob
from sparkdl.spark.backends.rounds import TEST_DELAY_PROPERTY, TaskSpec, _check_finite, validate_epoch
from sparkdl.spark.partitions import load_partition, release, spill_dir
from sparkdl.spark.jobs import run_job
from sparkdl.spark.session import cancel_tag, cluster_cores, conf_get, describe, is_connect, is_local_server

RESULT_DDL = "partition int, attempt bigint, rows bigint, steps bigint, pushes bigint, dropped bigint, skipped bigint, late bigint, local_resets bigint"
ROUND_MODES = ("sync", "bmuf", "easgd", "gossip")
WAIT_CHUNK_S = 5.0  # a waiting worker re-asks (and so shows it is alive) at least this often
PS_HOST_CONF = "spark.sparkdl.ps.host"  # where the parameter server binds, when set (needed on a remote Connect server)


@dataclass(frozen=True)
class PSTaskSpec:
    """What travels to the ps tasks: the fit's plain settings, the server address and token
    (no weights), the mode and its settings, and the clients' timeouts (seconds)."""

    task: TaskSpec
    mode: str
    epochs: int
    workers: int
    location: str
    token: str
    staleness: int
    call_timeout_s: float = 60.0
    retries: int = 3


# ---- executor side ---------------------------------------------------------------------------


def _wait(step, client, partition) -> None:
    """Repeat ``step(timeout_s)`` (a server-side wait) until it returns True, with a heartbeat between tries."""
    while not step(WAIT_CHUNK_S):
        client.heartbeat(partition)


def _nbytes(state: ModelState) -> int:
    return sum(a.nbytes for a in state.weights) + sum(a.nbytes for a in state.optimizer or [])


def _assign_weights(replica, weights: list[np.ndarray]) -> None:
    for variable, array in zip(replica.model.weights, weights, strict=True):
        variable.assign(array)


def _wait_round(client, round_: int, partition) -> int:
    """Wait until the server's round rule closed ``round_`` rounds (heartbeats between tries);
    returns the rounds closed (more than ``round_`` when this worker is late)."""
    while True:
        reached, current = client.wait_round(round_, WAIT_CHUNK_S)
        if reached:
            return current
        client.heartbeat(partition)


def _round_update(spec: PSTaskSpec, state: ModelState, start: ModelState, residual, exact):
    """What a round-mode worker pushes: ``(update, names, encoding, new residual)``: its state, its
    fp16 update, or its quantized weight update (the residual kept here, the optimizer state too)."""
    compression = spec.task.compression
    if compression is None:
        return state, None, None, residual
    if compression == "fp16":
        return encode_update(state, start, "fp16"), None, "fp16", residual
    payload, residual = quantize_update(state.weights, start.weights, residual, compression, spec.task.threshold, exact=exact)
    return ModelState([np.frombuffer(payload, np.uint8)]), ["payload"], compression, residual


def _async_update(spec: PSTaskSpec, state: ModelState, master: ModelState, residual, final: bool, exact):
    """What an asynchronous worker pushes: ``(update, names, encoding, new residual)``: Δ = its
    weights − the pulled ones, as they are, as float16 (fp16), or quantized with the residual kept
    here (1bit, threshold). The last push goes in full precision with the residual added (nothing
    of the worker's updates is left behind) and the worker's optimizer state."""
    deltas = [np.subtract(w, b, dtype=w.dtype) if w.dtype.kind == "f" else w for w, b in zip(state.weights, master.weights, strict=True)]
    compression = spec.task.compression
    if final or compression is None:
        if residual is not None:
            # (arrays sent exactly, and non-float ones, keep an empty residual)
            deltas = [(d + r).astype(d.dtype) if d.dtype.kind == "f" and r.size == d.size else d
                      for d, r in zip(deltas, residual, strict=True)]
        return ModelState(deltas, state.optimizer if final else None), None, None, None
    if compression == "fp16":
        return encode_update(ModelState(state.weights), ModelState(master.weights), "fp16"), None, "fp16", residual
    payload, residual = quantize_update(state.weights, master.weights, residual, compression, spec.task.threshold, exact=exact)
    return ModelState([np.frombuffer(payload, np.uint8)]), ["payload"], compression, residual


def run_worker(spec: PSTaskSpec, client, partition: int, attempt: int, x, y, sample_weight: np.ndarray | None = None,
               base: np.ndarray | None = None, delay_s: float = 0.0) -> dict:
    """One worker's whole fit against the parameter server (see the module docstring).

    Args:
        spec: the fit's settings.
        client: a :class:`~sparkdl.server.ParameterServerClient` of the fit's server.
        partition: this worker's partition (its id on the server).
        attempt: this task's attempt (higher supersedes lower).
        x, y: the partition's rows: an array, or a list of arrays (one per model input, output).
        sample_weight: per-row loss weights ``(rows,)``, or None.
        base: the permutation that puts the rows in canonical order (None: they are in it).
        delay_s: a test hook: seconds slept before each slot's local steps (a straggler).

    Returns:
        ``{"rows", "steps", "pushes", "dropped", "skipped", "late", "local_resets"}``: rows and
        steps this attempt trained, pushes sent, pushes the server dropped (duplicates, or late for
        their round), slots skipped because an earlier attempt's push was applied, round-mode slots
        this worker pushed late or skipped because their round had closed without it, and 1 when a
        retry resumed without the residual and optimizer state of 1bit/threshold (else 0).

    Raises:
        ServerError: the server refused a call or did not answer in time (after retries).
    """
    from sparkdl.keras.replica import Replica

    task, plan = spec.task, spec.task.plan
    rounds_mode, ssp = spec.mode in ROUND_MODES, spec.mode == "ssp"
    expected = len(x[0]) if isinstance(x, (list, tuple)) else len(x)
    replica = Replica(task.spec, task.compile_spec, task.seed, task.mixed_precision)
    exact = [not t for t in replica.trainable]  # quantized updates: the non-trainable weights travel exactly
    previous_attempt, last_seq = client.progress(partition)
    if previous_attempt is None or previous_attempt >= attempt:
        last_seq = 0  # a first attempt, or a zombie of an older one (its pushes are dropped anyway)
    slots = [(e, r) for e in range(spec.epochs) for r in range(plan.rounds_per_epoch)]
    ranges = [plan.row_range(partition, r) if expected else (0, 0) for _, r in slots]
    trained = [g for g, (start, stop) in enumerate(ranges) if stop > start]
    last_trained = trained[-1] if trained else -1
    # A retry of a task that had pushed starts without its residual and optimizer state (1bit/threshold): counted.
    resumed = task.compression in QUANTIZED and last_seq > 0
    counts = {"rows": 0, "steps": 0, "pushes": 0, "dropped": 0, "skipped": 0, "late": 0, "local_resets": int(resumed)}
    pulled, own_optimizer, version = 0, False, 0
    residual, local_optimizer = None, None  # 1bit/threshold: the error-feedback residual and this worker's optimizer state
    for g, (epoch, r) in enumerate(slots):
        seq = g + 1
        start, stop = ranges[g]
        if seq <= last_seq:
            counts["skipped"] += 1
            continue
        if not rounds_mode and stop <= start:
            continue  # nothing to push in this slot
        if rounds_mode and _wait_round(client, g, partition) > g:
            counts["late"] += 1  # the round closed without this worker (a straggler-tolerant round): its rows are dropped
            continue
        if ssp:
            _wait(lambda t: client.wait_clock(partition, spec.staleness, t), client, partition)
        extra = {"epoch": epoch, "clock": seq}
        names, encoding, kept = None, None, (residual, local_optimizer)
        if stop > start:
            if rounds_mode:
                version, begin = client.pull(worker=partition)  # this worker's start: the master, W + η·Δ, or its own model
                pulled += _nbytes(begin)
                optimizer = local_optimizer if local_optimizer is not None else begin.optimizer
                replica.set_state(ModelState(begin.weights, optimizer))
            else:
                version, master = client.pull(weights_only=own_optimizer)
                pulled += _nbytes(master)
                if not own_optimizer:
                    replica.set_state(master)  # async modes: the optimizer state stays the worker's after the first pull
                    own_optimizer = True
                else:
                    _assign_weights(replica, master.weights)
            replica.seed_round(task.seed, epoch, r, partition)
            order = epoch_order(expected, task.seed, epoch, partition, task.shuffle)[start:stop]
            if delay_s:
                time.sleep(delay_s)
            metrics = replica.train(x, y, task.batch_size, sample_weight=sample_weight, rows=order if base is None else base[order])
            state = replica.get_state()
            if rounds_mode:
                update, names, encoding, residual = _round_update(spec, state, begin, residual, exact)
                if task.compression in QUANTIZED:
                    local_optimizer = state.optimizer
            else:
                final = g == last_trained
                update, names, encoding, residual = _async_update(spec, state, master, residual, final, exact)
                extra.update(final=final, worker_rows=int(expected))
            extra.update(metrics=encode_metric_sums(metrics), pulled=pulled)
            rows = stop - start
        else:  # a round mode, no rows left in this slot: the round still needs this worker's (empty) push
            rows = 0
            update = ModelState(replica.get_state().weights)
        reply = client.push(update, worker=partition, attempt=attempt, seq=seq, base_version=version, rows=rows, extra=extra,
                            names=names, encoding=encoding)
        pulled = 0
        counts["pushes"] += 1
        if reply.get("dropped") == "late":  # dropped whole: the residual and optimizer state go back to before this slot
            residual, local_optimizer = kept
            counts["late"] += 1
        elif rows:
            counts["rows"] += rows
            counts["steps"] += -(-rows // task.batch_size)
        counts["dropped"] += 0 if reply.get("applied") else 1
    return counts


def ps_partition(spec: PSTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The barrier task of a ps fit: load the partition, run :func:`run_worker`, yield one result row.

    A failure is reported to the server (heartbeat ``"error"`` with the message) before it is raised.
    """
    from pyspark import BarrierTaskContext

    from sparkdl.server import ParameterServerClient

    context = BarrierTaskContext.get()
    partition = context.partitionId()
    attempt = context.taskAttemptId()  # unique in the application and rising: a retry (task or whole stage) supersedes
    client = ParameterServerClient(spec.location, spec.token, timeout_s=spec.call_timeout_s, retries=spec.retries)
    try:
        client.heartbeat(partition)
        from sparkdl.keras import runtime

        runtime.configure(context.cpus(), context.resources(), spec.task.keras_backend)
        from sparkdl.keras.custom_objects import register

        register(spec.task.custom_objects)
        plan = spec.task.plan
        expected = plan.partition_rows[partition] if partition < len(plan.partition_rows) else 0
        data = load_partition(spec.task.fit_id, "train", partition, spec.task.columns, batches, expected, spec.task.budget_bytes,
                              spec.task.canonical_order, share=False)
        if len(data) != expected:
            raise InvariantError(
                f"partition {partition} must hold the {expected} rows counted before training. Received: {len(data)} rows "
                "(the cached training data changed; is the input non-deterministic?)"
            )
        client.heartbeat(partition)
        arrays = data.arrays
        delay = context.getLocalProperty(TEST_DELAY_PROPERTY)  # a test hook: "partition:seconds" makes a straggler
        delay_s = float(delay.split(":")[1]) if delay and int(delay.split(":")[0]) == partition else 0.0
        counts = run_worker(spec, client, partition, attempt, arrays.x, arrays.y, arrays.w, data.base, delay_s)
        release(spec.task.fit_id, "train", partition)
        client.heartbeat(partition, "done")
    except BaseException as exc:
        try:
            client.heartbeat(partition, "error", f"{type(exc).__name__}: {exc}")
        except Exception:
            pass
        raise
    finally:
        client.close()
    yield pa.RecordBatch.from_pylist([{"partition": partition, "attempt": attempt, **counts}], schema=pa.schema([
        ("partition", pa.int32()), ("attempt", pa.int64()), ("rows", pa.int64()), ("steps", pa.int64()),
        ("pushes", pa.int64()), ("dropped", pa.int64()), ("skipped", pa.int64()), ("late", pa.int64()), ("local_resets", pa.int64()),
    ]))


# ---- driver side -----------------------------------------------------------------------------


def task_slots(spark) -> int | None:
    """Tasks the cluster can run at once. Classic: Spark's own count for barrier stages, with the
    default resource profile (``defaultParallelism // spark.task.cpus`` when that is unavailable).
    Spark Connect: the cores its settings tell (:func:`~sparkdl.spark.session.cluster_cores`)
    divided by ``spark.task.cpus``, or None when they do not tell."""
    cpus = max(1, int(conf_get(spark, "spark.task.cpus", "1")))
    if is_connect(spark):
        cores = cluster_cores(spark)
        return None if cores is None else cores // cpus
    sc = spark.sparkContext
    try:
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    except Exception:
        return max(0, sc.defaultParallelism // cpus)


def check_barrier_ready(spark, workers: int) -> None:
    """Fail at once, before any job, when a barrier stage of ``workers`` tasks cannot start, or
    (Spark Connect) when the executors could not reach the parameter server (:func:`server_host`).

    Raises:
        ConfigError: dynamic allocation is on (Spark refuses barrier stages with it), or the
            cluster has fewer task slots than workers (Spark would wait about 10 minutes before
            failing), naming both numbers; on Spark Connect, a remote server and no
            ``spark.sparkdl.ps.host``.
    """
    if conf_get(spark, "spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        raise ConfigError(
            "backend 'ps' runs one barrier stage, which Spark refuses under dynamic allocation: set "
            "spark.dynamicAllocation.enabled=false, or use backend='rounds' (mode 'sync'), which works with dynamic "
            "allocation. Received: spark.dynamicAllocation.enabled=true"
        )
    slots = task_slots(spark)
    if slots is not None and slots < workers:
        raise ConfigError(
            f"backend 'ps' needs one task slot per worker at once (a barrier stage): numWorkers={workers} workers, "
            f"but the cluster has {slots} free task slots. Lower numWorkers to {slots} or less, add executors or "
            f"cores, or use backend='rounds'. Received: numWorkers={workers}, task slots={slots}"
        )
    server_host(spark)  # on Spark Connect: the executors must be able to reach this client


def server_host(spark) -> str:
    """Where the parameter server binds (the address the executors connect to): ``spark.sparkdl.ps.host``
    when set; else, on a classic session, loopback for a local master and ``spark.driver.host``
    otherwise; on Spark Connect (the server runs in this client process) loopback when the Connect
    server runs on this machine.

    Raises:
        ConfigError: on Spark Connect with a remote server and no ``spark.sparkdl.ps.host``.
    """
    configured = conf_get(spark, PS_HOST_CONF)
    if configured is not None:
        return configured.strip()
    if is_connect(spark):
        if is_local_server(spark):
            return "127.0.0.1"
        raise ConfigError(
            "backend 'ps' on Spark Connect runs its parameter server in this client process, which the executors of a "
            f"remote Connect server must reach: set {PS_HOST_CONF} to an address of this machine they can connect to "
            f"(spark.conf.set({PS_HOST_CONF!r}, '10.0.0.5')), or use backend='rounds' (mode 'sync'), which needs no server. "
            f"Received: {describe(spark)} with master {conf_get(spark, 'spark.master', 'unknown')!r} and no {PS_HOST_CONF}"
        )
    sc = spark.sparkContext
    if sc.master.startswith("local"):
        return "127.0.0.1"
    return sc.getConf().get("spark.driver.host", "127.0.0.1") or "127.0.0.1"


class _Monitor(threading.Thread):
    """Watches a running ps fit: reports finished epochs and cancels the job when a worker is silent
    longer than ``worker_timeout_s``."""

    def __init__(self, backend, spark, server, tag: str, workers: int, worker_timeout_s: float) -> None:
        super().__init__(name=f"{tag}-monitor", daemon=True)
        self.backend, self.spark, self.server, self.tag = backend, spark, server, tag
        self.workers, self.worker_timeout_s = workers, worker_timeout_s
        self.stop = threading.Event()
        self.silent: tuple[int, float] | None = None
        self.error: BaseException | None = None
        self.started_at = time.monotonic()

    def run(self) -> None:
        try:
            while not self.stop.wait(0.25):
                self.backend._report_epochs()
                contacts = self.server.contacts()
                since_start = time.monotonic() - self.started_at
                for partition in range(self.workers):
                    contact = contacts.get(str(partition))
                    if contact is not None and contact["state"] != "alive":
                        continue
                    silent = contact["seconds"] if contact is not None else since_start
                    if silent > self.worker_timeout_s:
                        self.silent = (partition, silent)
                        cancel_tag(self.spark, self.tag)
                        return
        except BaseException as exc:  # handed to the driver's thread
            self.error = exc


class PSBackend:
    """A parameter server on the driver and one barrier stage; see the module docstring."""

    name = "ps"

    def run(self, job: TrainJob, policy: ModePolicy, state: ModelState, callbacks=None) -> FitResult:
        from sparkdl.keras.custom_objects import registered
        from sparkdl.keras.metrics import MetricReader
        from sparkdl.keras.replica import state_nbytes
        from sparkdl.server import ParameterServer

        config = job.config
        mode = config.mode
        reader = job.reader or MetricReader.for_columns(job.spec, job.compile_spec, job.data.columns)
        spark = job.data.df.sparkSession
        workers = len(job.plan.partition_rows)
        check_barrier_ready(spark, workers)
        state_nbytes(reader.model)  # builds the optimizer: its fresh variables are the server's initial optimizer state
        optimizer = state.optimizer if state.optimizer is not None else [np.asarray(v.numpy()) for v in reader.model.optimizer.variables]
        initial = ModelState(list(state.weights), list(optimizer))
        names = decode_arrays(job.spec.weights).names
        validating = job.validation is not None and job.validation.total_rows > 0
        rounds_mode = mode in ROUND_MODES
        if rounds_mode:
            rule = SyncRoundRule(workers, policy, min_workers=config.min_workers(workers), deadline_s=config.round_deadline_s,
                                 rounds_per_epoch=job.plan.rounds_per_epoch if validating else None)  # snapshots to validate
        else:
            rule = policy.rule()
        self._rule = rule if rounds_mode else None
        self.recorder = recorder = EpochRecorder(rule, config.epochs, snapshot_rows=job.data.total_rows if validating and not rounds_mode else None)
        task = TaskSpec(
            fit_id=job.fit_id, spec=job.spec.architecture_only(), compile_spec=job.compile_spec, columns=job.data.columns,
            plan=job.plan, batch_size=config.batch_size, seed=config.seed, shuffle=config.shuffle, custom_objects=registered(),
            idle_s=max(3600.0, 2 * config.round_timeout_s), canonical_order=not config.keep_partitioning,
            budget_bytes=job.budget_bytes,
            validation=job.validation.columns if job.validation is not None else None,
            compression=config.compression, threshold=config.compression_threshold,
            mixed_precision=config.mixed_precision,
        )
        rounds_per_epoch = job.plan.rounds_per_epoch
        total_slots = config.epochs * rounds_per_epoch
        self._job, self._reader, self._callbacks = job, reader, callbacks
        self._result = result = FitResult(state=state)
        self._reported, self._epoch_started = 0, time.perf_counter()
        self._report_lock = threading.Lock()
        server = ParameterServer(initial, recorder, names=names, host=server_host(spark), port=config.server_port)
        try:
            server.start()
        except ServerError as exc:
            raise ServerError(f"{exc} (serverPort={config.server_port})") from exc
        monitor = None
        try:
            if callbacks is not None:
                callbacks.train_begin(state)
            if mode == "ssp":
                server.register_clocks([str(p) for p in range(workers)])
            spec = PSTaskSpec(task=task, mode=mode, epochs=config.epochs, workers=workers, location=server.location,
                              token=server.token, staleness=config.staleness,
                              call_timeout_s=max(30.0, 2 * WAIT_CHUNK_S), retries=3)
            out = job.data.df.mapInArrow(lambda batches: ps_partition(spec, batches), RESULT_DDL, barrier=True)
            tag = f"sparkdl-{job.fit_id}-ps"
            description = f"sparkdl fit {job.fit_id[:8]}: {mode} on ps, {config.epochs} epochs x {rounds_per_epoch} rounds"
            monitor = _Monitor(self, spark, server, tag, workers, config.worker_timeout_s)
            monitor.start()
            try:
                table = run_job(spark, out.toArrow, description, tag, config.round_timeout_s * max(1, total_slots))
            except (WorkerError, RoundTimeoutError) as exc:
                monitor.stop.set()
                monitor.join()
                if monitor.silent is not None:
                    partition, silent = monitor.silent
                    raise WorkerError(
                        f"every ps worker must contact the parameter server at least every workerTimeout="
                        f"{config.worker_timeout_s:g} s. Received: partition {partition} silent for {silent:.1f} s; the fit's "
                        "job was cancelled (raise workerTimeout if τ local steps take longer)"
                    ) from exc
                if isinstance(exc, FitCancelledError):
                    raise
                message = self._worker_errors(server)
                if message and message not in str(exc):
                    raise type(exc)(f"{exc} | worker reports: {message}") from exc
                raise
            finally:
                monitor.stop.set()
                monitor.join()
            if monitor.error is not None:
                raise monitor.error
            version, final = server.state()
            stats = server.stats()
        finally:
            server.shutdown()
            # A failed task leaves its on-disk partition behind (local mode: all of them here);
            # Spark deletes other executors' copies with the application's directory.
            shutil.rmtree(spill_dir(job.fit_id), ignore_errors=True)
        dropped_rows = self._dropped_rows(job)
        self._check(table, job, workers, dropped_rows)
        self._report_epochs(final=True)
        if not rounds_mode and recorder.final_optimizer.total_weight > 0:
            final = ModelState(final.weights, [np.asarray(a) for a in recorder.final_optimizer.result()])
        _check_finite(final, names, f"the ps fit ({mode})")
        result.state = final
        result.rounds = total_slots
        summaries = recorder.summaries()
        if not rounds_mode:
            for epoch_summary in summaries:
                append_epoch(result.history, epoch_summary)
        if validating:  # the barrier stage held every slot: validate each epoch's snapshot now
            try:
                snapshots = rule.snapshots if rounds_mode else recorder.snapshots
                for epoch in range(config.epochs):
                    snapshot = snapshots.get(epoch)
                    if snapshot is None:
                        raise InvariantError(f"the ps fit must record the master weights at the end of epoch {epoch + 1}. Received: no snapshot")
                    values = validate_epoch(spark, job, task, reader, snapshot, epoch, epoch + 1 == config.epochs)
                    append_epoch(result.history, values)
                    if callbacks is not None:  # TensorBoard and MLflow get the val_* now
                        callbacks.late_validation(epoch, values)
            finally:  # validation partitions kept on disk (over the budget) go with the fit
                shutil.rmtree(spill_dir(job.fit_id), ignore_errors=True)
        rows = table.to_pydict()
        result.info.update(
            backend="ps",
            mode=mode,
            server_version=version,
            ps_epochs=summaries,
            updates_applied=stats["updates_applied"],
            duplicates_dropped=stats["duplicates_dropped"],
            staleness_mean=stats["staleness_mean"],
            staleness_max=stats["staleness_max"],
            bytes_pushed=stats["bytes_pushed"],
            bytes_pulled=stats["bytes_pulled"],
            worker_steps=[s for _, s in sorted(zip(rows["partition"], rows["steps"], strict=True))],
            worker_pushes=[s for _, s in sorted(zip(rows["partition"], rows["pushes"], strict=True))],
            **({"staleness": config.staleness} if mode == "ssp" else {}),
        )
        result.info.update(compression=config.compression, update_bytes=stats["bytes_pushed"],
                           update_bytes_per_epoch=[e["bytes_pushed"] for e in summaries])
        if config.compression in QUANTIZED:
            result.info["local_state_resets"] = int(sum(rows["local_resets"]))
        if rounds_mode and config.min_workers(workers) < workers:
            dropped = self._dropped_updates(job)
            result.info.update(
                min_workers_per_round=config.min_workers(workers), updates_dropped=sum(len(d) for d in dropped),
                rows_dropped=sum(dropped_rows), dropped_per_round=dropped,
                worker_late=[s for _, s in sorted(zip(rows["partition"], rows["late"], strict=True))],
            )
        if callbacks is not None:
            callbacks.train_end({name: values[-1] for name, values in result.history.items() if values})
        return result

    def _dropped_updates(self, job: TrainJob) -> list[list[int]]:
        """Per round, the workers with rows in it whose update the round closed without (a worker with
        none, whose push of no rows came after the close, lost nothing)."""
        plan, out = job.plan, []
        for g, missing in enumerate(self._rule.dropped if self._rule is not None else []):
            r = g % plan.rounds_per_epoch
            out.append([p for p in missing if plan.partition_rows[p] and plan.row_range(p, r)[1] > plan.row_range(p, r)[0]])
        return out

    def _dropped_rows(self, job: TrainJob) -> list[int]:
        """Per epoch, the rows of workers whose round closed without their update (straggler-tolerant rounds)."""
        out = [0] * job.config.epochs
        plan = job.plan
        for g, missing in enumerate(self._dropped_updates(job)):
            epoch, r = divmod(g, plan.rounds_per_epoch)
            for partition in missing:
                begin, stop = plan.row_range(partition, r)
                out[epoch] += int(stop) - int(begin)
        return out

    @staticmethod
    def _worker_errors(server) -> str:
        return "; ".join(f"partition {w}: {c['message']}" for w, c in sorted(server.contacts().items()) if c["state"] == "error")

    def _check(self, table: pa.Table, job: TrainJob, workers: int, dropped_rows: list[int]) -> None:
        partitions = sorted(table.column("partition").to_pylist())
        if partitions != list(range(workers)):
            raise InvariantError(f"the ps fit must return one result per partition 0..{workers - 1}. Received partitions {partitions}")
        for epoch in range(job.config.epochs):
            rows = self.recorder.rows(epoch)
            if rows + dropped_rows[epoch] != job.data.total_rows:
                raise InvariantError(
                    f"each epoch must train on every row once. Received: {rows} rows trained and {dropped_rows[epoch]} dropped "
                    f"(late workers) in epoch {epoch + 1}, {job.data.total_rows} rows counted in the input"
                )

    def _report_epochs(self, final: bool = False) -> None:
        """History and the per-epoch callback for each epoch whose rows have all been pushed
        (in order; with ``final``, every epoch not reported yet)."""
        with self._report_lock:
            job, total = self._job, self._job.data.total_rows
            while self._reported < job.config.epochs:
                epoch = self._reported
                if not final and self._rule is not None and self._rule.round < (epoch + 1) * job.plan.rounds_per_epoch:
                    return
                if not final and self._rule is None and self.recorder.rows(epoch) < total:
                    return
                sums = self.recorder.epochs[epoch].sums.total()
                metrics = self._reader.results(sums) if sums is not None else {}
                now = time.perf_counter()
                seconds = now - self._epoch_started
                self._epoch_started = now
                if self._callbacks is not None:  # observers only (progress, TensorBoard, MLflow): val_* come after the stage
                    metrics = self._callbacks.epoch_end(epoch, metrics, None)
                append_epoch(self._result.history, metrics)
                self._result.epoch_seconds.append(seconds)
                self._reported += 1

