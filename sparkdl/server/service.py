"""What every Flight server of a fit shares: the bearer token checked by middleware, TLS, binding a
port, a bounded shutdown, JSON action bodies, and the workers' liveness.

Three servers build on :class:`FlightEndpoint`: the driver's parameter server of backend ``ps``
(:class:`~sparkdl.server.flight.ParameterServer`), the driver's coordinator of backend ``sharded``
(:class:`~sparkdl.server.coordinator.Coordinator`) and the slice servers its workers run in the
executors (:class:`~sparkdl.server.slices.SliceServer`). A subclass implements ``_handle_get``,
``_handle_put`` and ``_handle_action``; the endpoint routes Flight's calls to them.

Nothing here imports Spark, TensorFlow or Keras.
"""

from __future__ import annotations

import ipaddress
import json
import math
import threading
import warnings
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.flight as flight

from sparkdl.core.liveness import Contacts
from sparkdl.errors import CodecError, ConfigError, ServerError
from sparkdl.server.auth import BearerTokenMiddlewareFactory, new_token
from sparkdl.server.tls import TLSIdentity
from sparkdl.server.wire import int_field

MAX_WAIT_S = 3600.0  # the longest server-side wait a call may ask for (seconds)
SHUTDOWN_TIMEOUT_S = 30.0  # seconds shutdown waits for calls in progress


def json_result(obj) -> list[flight.Result]:
    """A ``DoAction`` answer: one result holding ``obj`` as JSON."""
    return [flight.Result(json.dumps(obj).encode())]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only (``127.0.0.1``, ``::1``,
    ``localhost``); ``0.0.0.0`` binds every interface, a host name may resolve anywhere."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def netloc(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}"


class _FlightService(flight.FlightServerBase):
    def __init__(self, owner: FlightEndpoint, location, **kwargs) -> None:
        super().__init__(location, **kwargs)
        self._owner = owner

    def do_get(self, context, ticket):
        return self._owner._handle_get(ticket)

    def do_put(self, context, descriptor, reader, writer):
        self._owner._handle_put(descriptor, reader, writer)

    def do_action(self, context, action):
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""
        return self._owner._handle_action(kind, body)

    def list_actions(self, context):
        return list(self._owner.ACTIONS)


class FlightEndpoint:
    """A fit's Flight server: binds ``host:port`` (TLS when ``tls``), checks the bearer ``token`` on
    every call before a body is read, and keeps each worker's last contact (:attr:`liveness`).

    Args:
        token: the bearer token clients must send; default a fresh ``secrets.token_hex(32)``.
        host: the interface to bind (``"0.0.0.0"`` binds every one).
        advertise: the address clients dial (:attr:`location`), when it is not ``host``.
        port: TCP port; 0 picks a free one.
        tls: a :class:`~sparkdl.server.tls.TLSIdentity`: the server speaks ``grpc+tls``. Without
            it on an address other than loopback, :meth:`start` warns that the token and the
            bodies travel in clear.
        what: the server in words, for messages (``"parameter server"``).
        workers: the fit's worker count: a call naming another worker id than its partitions
            (``"0"`` ..), or a task attempt far ahead of those heard, is refused
            (:meth:`~sparkdl.core.liveness.Contacts.refusal`); None: any id.

    Raises:
        ConfigError: a port out of range, an empty host.
        ServerError: from :meth:`start`, when ``host:port`` cannot be bound.
    """

    ACTIONS: Sequence[tuple[str, str]] = ()
    PORT_SETTING = "port"  # the setting that chooses the port, for messages

    def __init__(self, *, token: str | None, host: str, advertise: str | None, port: int, tls: TLSIdentity | None,
                 what: str, workers: int | None = None) -> None:
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ConfigError(f"port must be an integer in [0, 65535] (0 picks a free port). Received: {port!r}")
        for name, value in (("host", host), ("advertise", advertise if advertise is not None else host)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty string. Received: {value!r}")
        self.what = what
        self.host, self.advertise = host, advertise if advertise is not None else host
        self.token = token if token is not None else new_token()
        self._tls = tls
        self._auth = BearerTokenMiddlewareFactory(self.token)
        self._requested_port = port
        self._port: int | None = None
        self._server: _FlightService | None = None
        self._closing = False
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.liveness = Contacts(workers)
        self._counts: dict[str, int] = {"rejected": 0}

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self):
        """Binds ``host:port`` and starts serving (idempotent). Returns self.

        Raises:
            ServerError: the port is taken or the host is not a local address.
        """
        if self._server is not None:
            return self
        location = f"grpc+{'tls' if self._tls else 'tcp'}://{netloc(self.host, self._requested_port)}"
        kwargs = {"middleware": {"auth": self._auth}}
        if self._tls:
            kwargs["tls_certificates"] = [flight.CertKeyPair(self._tls.cert_pem, self._tls.key_pem)]
        try:
            server = _FlightService(self, location, **kwargs)
        except (pa.ArrowException, OSError) as exc:
            raise ServerError(
                f"{self.what} must bind a free local address. Received: {self.host}:{self._requested_port} could not be "
                f"bound ({exc}); choose another {self.PORT_SETTING}, or 0 to pick a free port"
            ) from exc
        self._closing = False
        self._server = server
        self._port = server.port
        if self._tls is None and not is_loopback(self.host):
            warnings.warn(
                f"{self.what} listens on {netloc(self.host, self._port)} without TLS (serverTls=False): the fit's bearer "
                "token and the weights travel in clear, readable by anyone on that network, and the token lets its holder "
                "push updates; keep serverTls=True (the default) unless the network is private",
                stacklevel=2,
            )
        return self

    def _on_shutdown(self) -> None:
        """Wake what waits on the subclass's own conditions (called once, before the port is freed)."""

    def shutdown(self) -> None:
        """Stops serving: wakes waiting callers, waits for calls in progress, frees the port."""
        server, self._server = self._server, None
        if server is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._on_shutdown()
        # gRPC's shutdown waits for calls in progress, and a client stalled mid-stream (a dead host,
        # no FIN) would hold it forever: wait at most SHUTDOWN_TIMEOUT_S, then leave it to finish alone.
        stopper = threading.Thread(target=lambda: (server.shutdown(), server.wait()), name="sparkdl-server-shutdown", daemon=True)
        stopper.start()
        stopper.join(SHUTDOWN_TIMEOUT_S)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError(f"{self.what} must be started before its port is known. Received: a server not started")
        return self._port

    @property
    def location(self) -> str:
        """``grpc+tcp://advertise:port`` (``grpc+tls://`` with TLS), for the clients."""
        return f"grpc+{'tls' if self._tls else 'tcp'}://{netloc(self.advertise, self.port)}"

    @property
    def refused(self) -> int:
        """Calls refused for their token."""
        return self._auth.refused

    # ---- the subclass's handlers -----------------------------------------------------------------

    def _handle_get(self, ticket: flight.Ticket):
        raise flight.FlightServerError(f"{self.what} serves no DoGet")

    def _handle_put(self, descriptor, reader, writer) -> None:
        raise flight.FlightServerError(f"{self.what} takes no DoPut")

    def _handle_action(self, kind: str, body: bytes):
        raise flight.FlightServerError(f"{self.what} takes no action {kind[:64]!r}")

    # ---- helpers ---------------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def _reject(self, message: str) -> flight.FlightServerError:
        self._count("rejected")
        return flight.FlightServerError(message)

    def _json_body(self, kind: str, body: bytes, keys: Sequence[str]) -> dict:
        """An action's JSON body, with ``worker`` (a string of 1 to 256 characters), the integer
        ``keys`` (>= 0; ``attempt`` may be null) and a finite ``timeout_s`` (clamped to [0,
        :data:`MAX_WAIT_S`]) checked; a rejection naming the form otherwise."""
        try:
            req = json.loads(body.decode("utf-8"))
            if not isinstance(req, dict):
                raise ValueError(req)
            if "worker" in req:
                worker = req["worker"]
                worker = str(worker) if isinstance(worker, int) and not isinstance(worker, bool) else worker
                if not isinstance(worker, str) or not 0 < len(worker) <= 256:
                    raise ValueError(worker)
                req["worker"] = worker
            for key in keys:
                if key == "worker":
                    if "worker" not in req:
                        raise KeyError(key)
                    continue
                if key == "attempt" and req.get(key) is None:
                    continue
                req[key] = int_field(req, key)
            timeout_s = float(req.get("timeout_s", 0.0))
            if not math.isfinite(timeout_s):
                raise ValueError(timeout_s)
            req["timeout_s"] = min(max(0.0, timeout_s), MAX_WAIT_S)
        except (UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError, CodecError) as exc:
            raise self._reject(f"{kind} body must be a JSON object with {list(keys)} (see the protocol). "
                               f"Received: {len(body)} bytes starting {body[:16]!r} ({type(exc).__name__})") from None
        if "worker" in req:
            self._check_worker(kind, req["worker"], req.get("attempt"))
        return req

    def _check_worker(self, what: str, worker: str, attempt: int | None = None) -> None:
        """Refuse a call naming a worker that is not one of the fit's, or an attempt far ahead
        (:meth:`~sparkdl.core.liveness.Contacts.refusal`): nothing is recorded of it."""
        problem = self.liveness.refusal(worker, attempt)
        if problem is not None:
            raise self._reject(f"{what}: {problem}")

    def _heartbeat(self, body: bytes) -> tuple[dict, bool, bool]:
        """A ``heartbeat`` action's body recorded in :attr:`liveness`: returns ``(request, superseded,
        recorded)``: ``superseded`` when a later attempt of the worker was heard (the caller is a
        zombie), ``recorded`` False when the beat itself came from a superseded attempt.

        Raises (to the client): a rejection for a malformed body or state."""
        req = self._json_body("heartbeat", body, ["worker", "attempt"])
        state = req.get("state", "alive")
        if state not in ("alive", "done", "error"):
            raise self._reject(f"heartbeat state must be alive, done or error. Received: {str(state)[:32]!r}")
        recorded = self.liveness.touch(req["worker"], state, str(req.get("message", ""))[:2000], req.get("attempt"))
        return req, self.liveness.superseded(req["worker"], req.get("attempt")), recorded

    def contacts(self) -> dict[str, dict]:
        """Per worker: ``seconds`` since its last call or heartbeat, its ``state`` (``"alive"``,
        ``"done"``, ``"error"``), the ``message`` it sent with it and its ``attempt``."""
        return self.liveness.snapshot()

    def attempts(self) -> dict[str, int]:
        """Per worker, the task attempts heard from (more than 1: Spark retried it)."""
        return self.liveness.attempts()
