"""The sharded coordinator's registrations over real Flight: each carries the owner's Spark stage
and that stage's current attempt (as the driver's Spark tells it) into the slice map and the reply
(owners of an older stage attempt end when a newer one registers); a malformed stage id is refused."""

import pytest

from sparkdl.core.board import SliceBoard
from sparkdl.errors import ServerError
from sparkdl.server import ParameterServerClient
from sparkdl.server.coordinator import Coordinator, CoordinatorClient


def test_a_registration_carries_its_stage_attempt_into_the_slice_map_and_a_malformed_stage_id_is_refused():
    attempts = {13: 0}
    coordinator = Coordinator(SliceBoard(3, 3), initial=lambda owner: None, stage_attempt=attempts.get)
    coordinator.start()
    client = CoordinatorClient(ParameterServerClient(coordinator.location, coordinator.token, timeout_s=10.0, retries=0))
    try:
        layout = {"owners": 3}
        assert client.register(0, 21, "grpc+tcp://127.0.0.1:1", "cert", "fp", layout, stage_id=13)["stage"] == [13, 0]
        attempts[13] = 1  # Spark resubmitted stage 13
        reply = client.register(1, 27, "grpc+tcp://127.0.0.1:2", "cert", "fp", layout, stage_id=13)
        assert reply["stage"] == [13, 1]
        unknown = client.register(2, 28, "grpc+tcp://127.0.0.1:3", "cert", "fp", layout, stage_id=14)  # not tracked: no stage
        owners = unknown["map"]["owners"]
        assert unknown["stage"] is None and [o.get("stage") for o in owners] == [[13, 0], [13, 1], None]
        with pytest.raises(ServerError, match=r"stage_id must be an integer >= 0. Received: -1"):
            client.register(0, 30, "grpc+tcp://127.0.0.1:4", "cert", "fp", layout, stage_id=-1)
        assert client.slice_map()["owners"][0]["attempt"] == 21  # the refused call changed nothing
    finally:
        client.close()
        coordinator.shutdown()
