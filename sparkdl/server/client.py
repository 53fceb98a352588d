"""Worker-side client of :class:`sparkdl.server.ParameterServer`.

Every call carries the fit's bearer token and a deadline: ``timeout_s`` seconds, plus the time
its bytes take at ``min_bytes_per_s`` for pulls and pushes (a 1 GB model is not held to a small
model's deadline). Calls that fail with ``UNAVAILABLE`` or a deadline are retried ``retries``
times with exponential backoff (``backoff_s``, then twice that, ...); pushes are safe to retry
because the server applies each ``(worker, attempt, seq)`` at most once. With ``tls`` (a
:class:`~sparkdl.server.tls.TLSPin`) the client trusts the one certificate pinned, and no
other. The client never goes through an HTTP proxy: gRPC honours ``http_proxy`` /
``https_proxy`` / ``grpc_proxy``, so the channel is created with the generic option
``grpc.enable_http_proxy = 0``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from sparkdl.core.state import ModelState, WorkerLocal
from sparkdl.errors import CodecError, ConfigError, ServerError
from sparkdl.server.auth import auth_headers
from sparkdl.server.tls import TLSPin
from sparkdl.server.wire import (
    DEFAULT_CHUNK_BYTES,
    LOCAL_PREFIX,
    STATE_TICKET,
    VALIDATION_PREFIX,
    WEIGHTS_TICKET,
    WORKER_STATE_PREFIX,
    ArraySpec,
    Assembler,
    iter_batches,
    specs_from_schema,
    split_arrays,
    wire_schema,
)

GENERIC_OPTIONS = [("grpc.enable_http_proxy", 0)]
MIN_BYTES_PER_S = 8 << 20  # the slowest link a pull or push is given time for (bytes per second)
_RETRYABLE = (flight.FlightUnavailableError, flight.FlightTimedOutError)


def _first_line(exc: BaseException) -> str:
    """The server's message without gRPC's debug context."""
    text = str(exc).strip()
    text = text.splitlines()[0] if text else type(exc).__name__
    for marker in (" Detail: ", ". gRPC client debug context"):
        text = text.split(marker)[0]
    return text


class ParameterServerClient:
    """Pulls the master state from, and pushes updates to, a parameter server.

    Args:
        location: the server's :attr:`ParameterServer.location`, e.g. ``"grpc+tcp://10.0.0.5:41233"``.
        token: the fit's bearer token (:attr:`ParameterServer.token`).
        timeout_s: deadline of each call attempt, in seconds (> 0).
        retries: extra attempts after an ``UNAVAILABLE`` / deadline failure (>= 0).
        backoff_s: sleep before the first retry, doubled for each further one (seconds).
        tls: the pinned certificate of a ``grpc+tls`` server (:class:`~sparkdl.server.tls.TLSPin`):
            the client trusts it alone and checks the server's name against it.
        chunk_bytes: bytes of values per record batch in pushes (default 8 MiB).
        min_bytes_per_s: pulls and pushes get ``timeout_s`` plus their bytes at this rate.

    Raises:
        ConfigError: on a location that is not ``grpc+tcp://`` / ``grpc+tls://``, a ``grpc+tls``
            location without a pin (or a pin whose certificate does not match its fingerprint),
            or an out of range timeout, retries or chunk size.
        ServerError: from every call, when the server refuses it (token, signature, size),
            answers with something that is not Flight, or cannot be reached in time; the
            message names the server address.
    """

    SERVER = "parameter server"  # the server in words, for messages

    def __init__(
        self,
        location: str,
        token: str,
        *,
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.1,
        tls: TLSPin | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        min_bytes_per_s: float = MIN_BYTES_PER_S,
    ) -> None:
        if not isinstance(location, str) or not location.startswith(("grpc+tcp://", "grpc+tls://", "grpc://")):
            raise ConfigError(f"location must be a grpc+tcp:// or grpc+tls:// URI. Received: {location!r}")
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0 seconds. Received: {timeout_s!r}")
        if not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"retries must be an integer >= 0. Received: {retries!r}")
        if not isinstance(chunk_bytes, int) or chunk_bytes < 1024:
            raise ConfigError(f"chunk_bytes must be an integer >= 1024 bytes. Received: {chunk_bytes!r}")
        self.location = location
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.backoff_s = float(backoff_s)
        self.chunk_bytes = chunk_bytes
        self.min_bytes_per_s = float(min_bytes_per_s)
        self._headers = auth_headers(token)
        self._options = flight.FlightCallOptions(timeout=self.timeout_s, headers=self._headers)
        kwargs = {"generic_options": GENERIC_OPTIONS}
        if location.startswith("grpc+tls://"):
            if tls is None:
                raise ConfigError(f"a grpc+tls:// server needs its pinned certificate (tls=TLSPin). Received: {location!r} and no pin")
            tls.check()
            kwargs["tls_root_certs"] = tls.cert_pem
            kwargs["override_hostname"] = tls.server_name
        try:
            self._client = flight.FlightClient(location, **kwargs)
        except (pa.ArrowException, ValueError) as exc:
            raise ConfigError(f"location must be a reachable Flight URI. Received: {location!r} ({_first_line(exc)})") from exc
        self._signature: list[ArraySpec] | None = None
        self.control: dict = {}  # the driver's orders read with the last pull

    # ------------------------------------------------------------------ plumbing
    def _sized(self, nbytes: int) -> flight.FlightCallOptions:
        """Call options whose deadline also gives ``nbytes`` their time at ``min_bytes_per_s``."""
        return flight.FlightCallOptions(timeout=self.timeout_s + nbytes / self.min_bytes_per_s, headers=self._headers)

    def _call(self, what: str, fn):
        last = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return fn()
            except _RETRYABLE as exc:
                last = exc
            except flight.FlightUnauthenticatedError as exc:
                raise ServerError(f"{self.SERVER} at {self.location} must accept this fit's token for a {what}. "
                                  f"Received: unauthenticated ({_first_line(exc)})") from exc
            except flight.FlightError as exc:
                raise ServerError(f"{self.SERVER} at {self.location} refused the {what}. Received: {_first_line(exc)}") from exc
            except CodecError as exc:
                raise ServerError(f"{self.SERVER} at {self.location} must answer a {what} with sparkdl Arrow arrays. "
                                  f"Received: {exc}") from exc
            except pa.ArrowException as exc:
                raise ServerError(f"{self.SERVER} at {self.location} must speak Arrow Flight for a {what}. "
                                  f"Received: {_first_line(exc)}") from exc
        raise ServerError(
            f"{self.SERVER} at {self.location} must answer a {what} within {self.timeout_s:g} s. Received: no answer "
            f"after {self.retries + 1} attempts (is a Flight server listening there, not e.g. an HTTP server?): {_first_line(last)}"
        ) from last

    def _action(self, kind: str, body: bytes = b"") -> dict:
        def once():
            results = list(self._client.do_action(flight.Action(kind, body), options=self._options))
            if len(results) != 1:
                raise CodecError(f"action {kind!r} must return one result. Received: {len(results)}")
            try:
                return json.loads(results[0].body.to_pybytes().decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise CodecError(f"action {kind!r} must return JSON. Received: {exc}") from exc

        return self._call(f"{kind} action", once)

    # ------------------------------------------------------------------ API
    def _get(self, ticket: bytes, nbytes: int, out=None):
        def once():
            reader = self._client.do_get(flight.Ticket(ticket), options=self._sized(nbytes))
            schema = reader.schema
            specs = specs_from_schema(schema)
            try:
                version = int((schema.metadata or {})[b"sparkdl.version"])
            except (KeyError, ValueError) as exc:
                raise CodecError("state schema must carry sparkdl.version metadata. Received: none") from exc
            assembler = Assembler(specs, out)
            while True:
                try:
                    batch = reader.read_chunk().data
                except StopIteration:
                    break
                if batch is not None:
                    assembler.add(batch)
            return version, specs, assembler.finish(), schema.metadata or {}

        return self._call("pull", once)

    def pull(self, weights_only: bool = False, worker: str | int | None = None) -> tuple[int, ModelState]:
        """Returns ``(version, state)``: the master weights (and optimizer arrays when the
        server holds them, unless ``weights_only``) as new writable numpy arrays, and the version
        they belong to; with ``worker`` (a round mode's server), the state that worker starts
        its round from. The driver's orders of the pull are in :attr:`control` after it."""
        ticket = WEIGHTS_TICKET if weights_only else STATE_TICKET
        if worker is not None:
            ticket = WORKER_STATE_PREFIX + str(worker).encode()
        expected = sum(s.nbytes for s in self._signature) if self._signature else 0
        version, specs, arrays, metadata = self._get(ticket, expected)
        if not weights_only and worker is None:
            self._signature = specs
        raw = metadata.get(b"sparkdl.control")
        self.control = json.loads(raw) if raw else {}
        return version, split_arrays(specs, arrays)

    def pull_local(self, worker: str | int) -> WorkerLocal | None:
        """The own state (residual, optimizer) the server holds for ``worker``: the one it put last,
        or the one a resumed fit restored; None when there is none."""
        version, specs, arrays, metadata = self._get(LOCAL_PREFIX + str(worker).encode(), 0)
        if version < 0:
            return None
        has = json.loads(metadata.get(b"sparkdl.groups", b"[true, true]"))
        groups = {role: [a for s, a in zip(specs, arrays, strict=True) if s.role == role] for role in ("residual", "optimizer")}
        return WorkerLocal(version, groups["residual"] if has[0] else None, groups["optimizer"] if has[1] else None)

    def push_local(self, local: WorkerLocal, *, worker: str | int, attempt: int, seq: int) -> dict:
        """Sends this worker's own state after slot ``seq`` (its residual and optimizer state), for a
        snapshot of the fit and for its own retries. Returns ``{"applied": bool, "dropped": ...}``."""
        specs, arrays = [], []
        for role, values in (("residual", local.residual), ("optimizer", local.optimizer)):
            for i, array in enumerate(values or []):
                array = np.asarray(array, order="C")
                specs.append(ArraySpec(f"{role}/{i}", tuple(array.shape), array.dtype, role))
                arrays.append(array)
        return self._put({"kind": "local", "worker": str(worker), "attempt": attempt, "seq": seq}, specs, arrays, "local state push")

    def signature(self) -> list[ArraySpec]:
        """Names, shapes, dtypes and roles of the server's arrays (cached after the first call or pull)."""
        if self._signature is None:
            reply = self._action("signature")
            self._signature = [ArraySpec(a["name"], tuple(a["shape"]), np.dtype(a["dtype"]), a["role"]) for a in reply["arrays"]]
        return list(self._signature)

    def push(
        self,
        update: ModelState | Sequence[np.ndarray],
        *,
        worker: str | int,
        attempt: int,
        seq: int,
        base_version: int,
        rows: int,
        names: Sequence[str] | None = None,
        extra: dict | None = None,
        encoding: str | None = None,
    ) -> dict:
        """Sends one update (with async rules: Δ = new weights − pulled weights per float array,
        the worker's value for non-float arrays; optionally the optimizer arrays too).

        Args:
            update: a :class:`ModelState` or a list of weight arrays.
            worker: stable id of the worker (e.g. the partition index).
            attempt: Spark task attempt number; a higher attempt supersedes lower ones.
            seq: per-attempt sequence number, increasing with each push.
            base_version: the version of the pull this update was computed from.
            rows: rows trained on since that pull.
            names: array names; default the server's (from :meth:`signature`).
            extra: a JSON object handed to the server's rule as ``meta["extra"]`` (small: the
                descriptor holds at most 64 KiB); ``extra["clock"]`` sets the worker's SSP clock.
            encoding: None, ``"fp16"`` (``update``'s float arrays are float16 differences) or
                ``"1bit"``/``"threshold"`` (``update`` is ``[payload as uint8]``, names ``["payload"]``).

        Returns:
            ``{"applied": bool, "dropped": None | "duplicate" | "superseded_attempt",
            "version": int, "staleness": int | None}``.
        """
        if isinstance(update, ModelState):
            weights, optimizer = list(update.weights), list(update.optimizer or [])
        else:
            weights, optimizer = list(update), []
        arrays = [np.asarray(a, order="C") for a in [*weights, *optimizer]]
        roles = ["weight"] * len(weights) + ["optimizer"] * len(optimizer)
        if names is None:
            known = {role: [s.name for s in self.signature() if s.role == role] for role in ("weight", "optimizer")}
            names = [*known["weight"][: len(weights)], *[f"weight/{i}" for i in range(len(known["weight"]), len(weights))],
                     *known["optimizer"][: len(optimizer)], *[f"optimizer/{i}" for i in range(len(known["optimizer"]), len(optimizer))]]
        if len(names) != len(arrays):
            raise ConfigError(f"names must be one per array. Received: {len(names)} names for {len(arrays)} arrays")
        specs = [ArraySpec(str(n), a.shape, a.dtype, r) for n, a, r in zip(names, arrays, roles, strict=True)]
        command = {"kind": "update", "worker": str(worker), "attempt": attempt, "seq": seq, "base_version": base_version,
                   "rows": rows, "encoding": encoding, **({"extra": extra} if extra is not None else {})}
        return self._put(command, specs, arrays, "push")

    def _put(self, command: dict, specs: Sequence[ArraySpec], arrays: Sequence[np.ndarray], what: str) -> dict:
        schema = wire_schema(specs)
        batches = list(iter_batches(schema, arrays, self.chunk_bytes))
        nbytes = sum(b.get_total_buffer_size() for b in batches)
        descriptor = flight.FlightDescriptor.for_command(json.dumps({**command, "nbytes": nbytes}).encode())

        def once():
            writer, metadata_reader = self._client.do_put(descriptor, schema, options=self._sized(nbytes))
            try:
                for batch in batches:
                    writer.write_batch(batch)
                writer.done_writing()
                reply = metadata_reader.read()
            except BaseException:
                try:
                    writer.close()  # surfaces the server's status, more telling than a broken stream
                except flight.FlightError as status:
                    raise status from None
                raise
            writer.close()
            if reply is None:
                raise CodecError(f"{what} must be answered with one JSON metadata message. Received: none")
            try:
                return json.loads(reply.to_pybytes().decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise CodecError(f"{what} answer must be JSON. Received: {exc}") from exc

        return self._call(what, once)

    def version(self) -> int:
        return int(self._action("version")["version"])

    def stats(self) -> dict:
        """The server's :meth:`ParameterServer.stats`."""
        return self._action("stats")

    def wait_version(self, version: int, timeout_s: float) -> bool:
        """Blocks (server side) until the version is >= ``version`` or ``timeout_s`` seconds
        pass; returns whether it was reached. ``timeout_s`` should stay below this client's
        ``timeout_s``."""
        return bool(self._action("wait_version", json.dumps({"version": version, "timeout_s": timeout_s}).encode())["reached"])

    def wait_round(self, round_: int, timeout_s: float, worker: str | int | None = None) -> dict:
        """Waits (server side, at most ``timeout_s`` seconds) until the driver opened round
        ``round_`` (round modes); returns :meth:`~sparkdl.core.board.RoundBoard.wait_open`'s answer
        (``open``, ``late``, ``stop``, ``learning_rate``, ``collect``)."""
        body = {"round": round_, "timeout_s": timeout_s, **({"worker": str(worker)} if worker is not None else {})}
        return self._action("wait_round", json.dumps(body).encode())

    def validation_weights(self, epoch: int) -> list[np.ndarray]:
        """The master weights the driver posted for ``epoch``'s validation in the workers' tasks."""
        expected = sum(s.nbytes for s in self._signature if s.role == "weight") if self._signature else 0
        _, specs, arrays, _ = self._get(VALIDATION_PREFIX + str(int(epoch)).encode(), expected)
        return list(arrays)

    def wait_validation(self, worker: str | int, epoch: int, timeout_s: float) -> dict:
        """Waits (server side, at most ``timeout_s`` seconds) until a validation is posted for this
        worker or the one of ``epoch`` is done; returns ``{"validate": epoch or None, "done": bool, "stop": bool}``."""
        body = json.dumps({"worker": str(worker), "epoch": epoch, "timeout_s": timeout_s}).encode()
        return self._action("wait_validation", body)

    def report_validation(self, worker: str | int, attempt: int, epoch: int, rows: int, metrics: list | None) -> bool:
        """Sends this worker's validation of ``epoch``: its rows and summed metric variables
        (:func:`~sparkdl.core.board.encode_metric_sums`). Returns whether the server recorded it."""
        body = json.dumps({"worker": str(worker), "attempt": attempt, "epoch": epoch, "rows": rows, "metrics": metrics}).encode()
        return bool(self._action("validation", body)["recorded"])

    def heartbeat(self, worker: str | int, state: str = "alive", message: str = "", attempt: int | None = None) -> dict:
        """Tells the server this worker (attempt) is alive (or ``"done"`` / ``"error"``); returns the
        server's version, ``superseded`` (a later attempt of this worker has been heard: this one is a
        zombie and should end) and the driver's orders (``stop``, ``learning_rate``)."""
        body = json.dumps({"worker": str(worker), "attempt": attempt, "state": state, "message": message[:2000]}).encode()
        return self._action("heartbeat", body)

    def progress(self, worker: str | int) -> tuple[int | None, int | None]:
        """``(highest attempt, last applied seq)`` the server holds for ``worker`` (``None`` when it never pushed)."""
        reply = self._action("progress", json.dumps({"worker": str(worker)}).encode())
        return reply["attempt"], reply["seq"]

    def wait_clock(self, worker: str | int, bound: int, timeout_s: float) -> dict:
        """Blocks (server side) until ``worker`` is at most ``bound`` clocks ahead of the slowest
        registered worker, ``timeout_s`` pass or the driver stops the fit; returns ``{"reached":
        bool, "stop": bool, "learning_rate": ...}``. Keep ``timeout_s`` below this client's."""
        body = json.dumps({"worker": str(worker), "bound": bound, "timeout_s": timeout_s}).encode()
        return self._action("wait_clock", body)

    def orders(self) -> dict:
        """The driver's orders now: ``{"stop": bool, "learning_rate": float | None}`` (also in
        :attr:`control` after each pull)."""
        return self._action("control")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ParameterServerClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
