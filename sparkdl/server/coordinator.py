"""The driver's coordinator of backend ``sharded``: the rounds, the slice map, the workers' reports
and the slices' readiness, over Arrow Flight. No weights pass through it during training: it
serves each slice's initial state once (``DoGet init:<j>``), and the workers' reports are a few
hundred bytes.

Protocol (Arrow Flight; TLS with the driver's per-fit certificate, the fit's bearer token on every
call; JSON action bodies and answers):

* ``register`` ``{"worker": j, "attempt", "location", "cert", "fingerprint", "layout"}``: the task of
  slice j serves it at ``location`` (its certificate, for the others to pin); ``layout``: how it cuts
  the state (:meth:`~sparkdl.core.slices.SliceLayout.to_json`), which every owner must share. Answered with the
  registration it replaces (``previous``, None for the first), how many registrations slice j had,
  the slice map, the round the driver opened (``opened``, ``closed``), ``version``: the version of
  the state the driver has accepted (the start of the open round, or of the next one between
  rounds), and the worker's last reported round (``reported``).
* ``slice_map``: ``{"version", "owners": [registration or null, ...]}``.
* ``wait_round`` ``{"round", "timeout_s", "worker", "map_version"}``: waits until the driver opened
  that round, stopped, or the slice map changed: ``{"open", "late", "stop", "learning_rate",
  "collect", "map_version", "round"}``.
* ``report`` ``{"worker", "attempt", "round", "rows", "extra": {"metrics"}, "nbytes"}``: a worker's
  round, counted once per (worker, round) (:class:`~sparkdl.core.ledger.ApplyLedger`).
* ``ready`` ``{"worker": j, "attempt", "version", "problem"}``: slice j holds ``version``; a
  ``problem`` names a non-finite candidate.
* ``lost`` ``{"worker": j, "attempt", "message"}``: slice j's owner found its slice nowhere
  (:class:`~sparkdl.server.slices.SliceLost`): the driver fails the fit at once, as no retry mends it.
* ``heartbeat`` (as the parameter server's), answered with ``superseded``, the driver's orders and
  ``map_version``; ``progress`` ``{"worker"}``: its highest attempt and last reported round + 1.
* ``DoGet`` ``init:<j>``: slice j of the state the fit starts from (the master, its mode state).

Nothing here imports Spark, TensorFlow or Keras.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow.flight as flight

from sparkdl.core.board import LatePush, SliceBoard
from sparkdl.core.ledger import ApplyLedger
from sparkdl.server.service import FlightEndpoint, json_result
from sparkdl.server.slices import SliceVersion
from sparkdl.server.tls import TLSIdentity
from sparkdl.server.wire import array_stream


class Coordinator(FlightEndpoint):
    """See the module docstring.

    Args:
        board: the fit's :class:`~sparkdl.core.board.SliceBoard`.
        initial: ``initial(j)``: slice j of the state the fit starts from (a :class:`SliceVersion`).
        token, host, advertise, port, tls: as :class:`~sparkdl.server.service.FlightEndpoint`'s.
    """

    PORT_SETTING = "serverPort"
    ACTIONS = (
        ("register", "body {\"worker\": int, \"attempt\": int, \"location\": str, \"cert\": str, \"fingerprint\": str, "
                     "\"stage_id\": int}"),
        ("slice_map", "the slices' locations, JSON"),
        ("wait_round", "body {\"round\": int, \"timeout_s\": float, \"worker\": str, \"map_version\": int}"),
        ("report", "body {\"worker\": str, \"attempt\": int, \"round\": int, \"rows\": int, \"extra\": {...}, \"nbytes\": int}"),
        ("ready", "body {\"worker\": int, \"attempt\": int, \"version\": int, \"problem\": str | null}"),
        ("heartbeat", "body {\"worker\": str, \"attempt\": int, \"state\": \"alive\"|\"done\"|\"error\", \"message\": str}"),
        ("progress", "body {\"worker\": str}: the worker's highest attempt and last reported round + 1"),
        ("lost", "body {\"worker\": int, \"attempt\": int, \"message\": str}: the owner found its slice nowhere"),
    )

    def __init__(self, board: SliceBoard, initial: Callable[[int], SliceVersion], *, token: str | None = None,
                 host: str = "127.0.0.1", advertise: str | None = None, port: int = 0, tls: TLSIdentity | None = None,
                 stage_attempt: Callable[[int], int | None] | None = None) -> None:
        super().__init__(token=token, host=host, advertise=advertise, port=port, tls=tls, what="coordinator")
        self.board, self.initial, self.stage_attempt = board, initial, stage_attempt
        self.start_version = board.opened + 1  # the version the fit starts from (served by ``init:<j>``)
        self._reports = ApplyLedger()
        self._counts = {"rejected": 0, "reports": 0, "duplicates_dropped": 0, "late_dropped": 0, "inits": 0, "bytes_out": 0}
        self.learning_rate: float | None = None
        self.layout: dict | None = None  # the slice layout the first owner registered (JSON)

    def _on_shutdown(self) -> None:
        self.board.stop()

    def accepted_version(self) -> int:
        """The version of the state the driver accepted: the open round's start, or, between rounds,
        the next round's."""
        opened, closed = self.board.position()
        return opened + (1 if closed else 0)

    def stats(self) -> dict:
        with self._lock:
            return {**self._counts, "unauthenticated": self.refused}

    # ---- handlers -------------------------------------------------------------------------------

    def _handle_get(self, ticket: flight.Ticket):
        raw = bytes(ticket.ticket).decode("utf-8", "replace")
        kind, _, rest = raw.partition(":")
        if kind != "init" or not rest.isdigit() or int(rest) >= self.board.owners:
            raise flight.FlightServerError(f"ticket must be init:<slice>. Received: {raw[:40]!r}")
        version = self.initial(int(rest))
        specs, arrays = version.arrays()
        stream, nbytes = array_stream(specs, arrays, {"sparkdl.version": str(version.version)})
        self._count("inits")
        self._count("bytes_out", nbytes)
        return stream

    def _handle_action(self, kind: str, body: bytes):
        board = self.board
        if kind == "register":
            req = self._json_body(kind, body, ["worker", "attempt"])
            owner = int(req["worker"])
            info = {k: req.get(k) for k in ("location", "cert", "fingerprint")}
            if owner >= board.owners or not all(isinstance(v, str) and v for v in info.values()):
                raise self._reject(f"register needs a slice below {board.owners}, a location, cert and fingerprint. Received: {req!r:.200}")
            stage_id = req.get("stage_id")
            if stage_id is not None:
                if not (isinstance(stage_id, int) and stage_id >= 0):
                    raise self._reject(f"register's stage_id must be an integer >= 0. Received: {stage_id!r:.100}")
                attempt = self.stage_attempt(stage_id) if self.stage_attempt is not None else None
                if attempt is not None:
                    info["stage"] = [stage_id, attempt]
            layout = req.get("layout")
            with self._lock:
                if self.layout is None and isinstance(layout, dict):
                    self.layout = layout
                same = layout == self.layout
            if not same:
                raise self._reject(f"every slice owner must cut the state alike. Received: slice {owner}'s layout differs from the "
                                   "first owner's (the replicas' optimizer state differs: another optimizer or Keras version on "
                                   "this executor?)")
            try:
                previous = board.register(owner, req["attempt"], info)
            except ValueError as exc:
                raise self._reject(str(exc)) from None
            self.liveness.touch(str(owner), attempt=req["attempt"])
            _, reported = self._progress(str(owner))
            opened, closed = board.position()
            return json_result({"previous": previous, "registrations": board.registrations(owner), "map": board.slice_map(),
                                "stage": info.get("stage"),
                                "opened": opened, "closed": closed, "version": self.accepted_version(), "reported": reported,
                                "start": self.start_version})
        if kind == "slice_map":
            return json_result(board.slice_map())
        if kind == "wait_round":
            req = self._json_body(kind, body, ["round", "map_version"])
            if "worker" in req:
                self.liveness.touch(req["worker"])
            return json_result(board.wait_open_or_map(req["round"], req["map_version"], req["timeout_s"]))
        if kind == "report":
            req = self._json_body(kind, body, ["worker", "attempt", "round", "rows"])
            return json_result(self._report(req))
        if kind == "ready":
            req = self._json_body(kind, body, ["worker", "attempt", "version"])
            problem = req.get("problem")
            marked = board.mark_ready(int(req["worker"]), req["attempt"], req["version"], None if problem is None else str(problem)[:500])
            return json_result({"marked": marked})
        if kind == "lost":
            req = self._json_body(kind, body, ["worker", "attempt"])
            board.mark_lost(int(req["worker"]), req["attempt"], str(req.get("message", ""))[:2000])
            return json_result({"marked": True})
        if kind == "heartbeat":
            req, superseded, _ = self._heartbeat(body)
            return json_result({"superseded": superseded, "stop": board.stopped, "learning_rate": self.learning_rate,
                                "map_version": board.map_version})
        if kind == "progress":
            req = self._json_body(kind, body, ["worker"])
            attempt, seq = self._progress(req["worker"])
            return json_result({"attempt": attempt, "seq": seq})
        raise self._reject(f"action must be one of {[a for a, _ in self.ACTIONS]}. Received: {kind[:64]!r}")

    def _progress(self, worker: str):
        with self._lock:
            return self._reports.progress(worker)

    def _report(self, req: dict) -> dict:
        worker, attempt, g = req["worker"], req["attempt"], req["round"]
        self.liveness.touch(worker, attempt=attempt)
        with self._lock:
            dropped = self._reports.verdict(worker, attempt, g + 1)
            if dropped is not None:
                self._counts["duplicates_dropped"] += 1
                return {"applied": False, "dropped": dropped}
            previous = self._reports.reserve(worker, attempt, g + 1)
        meta = {"worker": worker, "seq": g + 1, "rows": req["rows"], "nbytes": int(req.get("nbytes", 0)),
                "extra": req.get("extra") if isinstance(req.get("extra"), dict) else {}}
        try:
            self.board.record(meta)
        except LatePush:
            with self._lock:
                self._counts["late_dropped"] += 1
            return {"applied": False, "dropped": "late"}
        except (ValueError, TypeError) as exc:
            with self._lock:
                self._reports.release(worker, attempt, g + 1, previous)
            raise self._reject(f"report must carry the worker's rows and metric sums of the open round. Received: {exc}") from None
        self._count("reports")
        return {"applied": True, "dropped": None}


class CoordinatorClient:
    """A worker's calls to the :class:`Coordinator` (see the module docstring), over a
    :class:`~sparkdl.server.ParameterServerClient`'s plumbing (token, pinned certificate,
    deadlines, retries).

    Raises:
        ServerError: from every call the coordinator refuses or does not answer in time.
    """

    def __init__(self, client) -> None:
        self.client = client

    def _action(self, kind: str, body: dict) -> dict:
        import json

        return self.client._action(kind, json.dumps(body).encode())

    def register(self, owner: int, attempt: int, location: str, cert: str, fingerprint: str, layout: dict,
                 stage_id: int | None = None) -> dict:
        """``stage_id``: the task's Spark stage; the registration (and the reply's ``stage``) carries
        ``[stage id, the stage's current attempt]`` as the driver's Spark knows it. Owners of an older
        stage attempt end when one of a newer attempt registers (Spark resubmitted the stage)."""
        return self._action("register", {"worker": owner, "attempt": attempt, "location": location, "cert": cert,
                                         "fingerprint": fingerprint, "layout": layout,
                                         **({"stage_id": int(stage_id)} if stage_id is not None else {})})

    def slice_map(self) -> dict:
        return self._action("slice_map", {})

    def wait_round(self, round_: int, timeout_s: float, worker: int, map_version: int) -> dict:
        return self._action("wait_round", {"round": round_, "timeout_s": timeout_s, "worker": str(worker), "map_version": map_version})

    def report(self, worker: int, attempt: int, round_: int, rows: int, metrics, nbytes: int) -> dict:
        return self._action("report", {"worker": str(worker), "attempt": attempt, "round": round_, "rows": rows,
                                       "extra": {"metrics": metrics}, "nbytes": nbytes})

    def ready(self, owner: int, attempt: int, version: int, problem: str | None = None) -> dict:
        return self._action("ready", {"worker": owner, "attempt": attempt, "version": version, "problem": problem})

    def lost(self, owner: int, attempt: int, message: str) -> dict:
        """Slice ``owner``'s task attempt found the slice nowhere (``message``: the SliceLost's words)."""
        return self._action("lost", {"worker": owner, "attempt": attempt, "message": message})

    def initial(self, owner: int, has_optimizer: bool) -> SliceVersion:
        """Slice ``owner`` of the state the fit starts from."""
        version, specs, arrays, _ = self.client._get(f"init:{owner}".encode(), 0)
        return SliceVersion.from_arrays(version, specs, arrays, has_optimizer)

    def heartbeat(self, worker: int, state: str = "alive", message: str = "", attempt: int | None = None) -> dict:
        return self.client.heartbeat(worker, state, message, attempt)

    def close(self) -> None:
        self.client.close()
