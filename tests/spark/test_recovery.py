"""Recovery's owner on the worker side (``sparkdl.spark.training.recovery``): every decision over
every case, the copies on an executor's disk (a neighbour's backup too), the bounded wait that says
what it waits for, and a SliceLost that reaches the driver's coordinator over real Flight. The
faults end to end through Spark are in tests/integration/test_sharded_faults.py."""

import logging

import numpy as np
import pytest

from sparkdl.core.board import SliceBoard
from sparkdl.core.modes import get_policy
from sparkdl.core.slices import SliceLayout
from sparkdl.core.state import ModelState
from sparkdl.server import ParameterServerClient
from sparkdl.server.coordinator import Coordinator, CoordinatorClient
from sparkdl.server.slices import SliceServer, SliceVersion
from sparkdl.spark.training import recovery
from sparkdl.spark.training.recovery import (
    CHECKPOINT,
    DISK,
    END_NOW,
    FIT_START,
    GO_ON,
    HAND_OFF,
    HOLDER,
    PEERS,
    PREVIOUS,
    DiskCopies,
    restore_order,
    supersession,
    wait_bounded,
)


@pytest.mark.parametrize(("later_attempt", "newer_stage", "only_copy", "decision"), [
    (False, False, False, GO_ON),
    (False, False, True, GO_ON),
    (True, False, False, HAND_OFF),  # its own replacement registered: serve it the slice (and the backups), then end
    (True, True, True, HAND_OFF),  # both: the replacement takes the slice and the neighbour's copy from this server first
    (False, True, False, END_NOW),  # a resubmitted stage, no replacement of its own yet: free the slot now
    # ... unless this server holds the only live copy of its neighbour's slice (the neighbour's executor was lost): the
    # spare-executor run that lost slice 1 when its holder ended at once and no new task ran on the holder's executor
    (False, True, True, recovery.SERVE_BACKUP),
])
def test_supersession_over_every_case(later_attempt, newer_stage, only_copy, decision):
    assert supersession(later_attempt=later_attempt, newer_stage=newer_stage, only_copy=only_copy) == decision


@pytest.mark.parametrize(("facts", "order"), [
    (dict(follows=False, keeps_carried=True, owners=3), (recovery.ROUND_START,)),  # a sync point: the round's own start
    (dict(follows=True, keeps_carried=True, owners=3), (DISK, recovery.OWNERS, recovery.ROUND_START)),
    (dict(follows=True, keeps_carried=False, owners=3), (DISK, recovery.ROUND_START)),  # int8, keepLocalOptimizer, diloco
    (dict(follows=True, keeps_carried=True, owners=1), (DISK, recovery.ROUND_START)),  # its one piece went with its executor
])
def test_where_a_retried_overlapped_worker_takes_its_start_over_every_case(facts, order):
    assert recovery.start_order(**facts) == order


def test_a_superseded_attempt_offers_each_contribution_piece_to_its_workers_replacement_then_its_slices_owner():
    assert recovery.carried_hand_order(1, 2, {0, 1, 2, 3}) == [1, 2, 0, 3]
    assert recovery.carried_hand_order(1, 2, [0, 3]) == [0, 3]  # neither registered yet: any other
    assert recovery.carried_hand_order(2, 2, {2, 0}) == [2, 0]
    assert recovery.carried_hand_order(1, 2, set()) == []


@pytest.mark.parametrize(("facts", "verdict"), [
    (dict(kills=0, max_kills=2, killed=True, kill_refused_by_spark=True, seen_gone=False), recovery.KILLED),
    (dict(kills=2, max_kills=2, killed=False, kill_refused_by_spark=True, seen_gone=False), recovery.FAIL),  # killed twice
    # a SIGKILLed Python worker or a lost executor: Spark runs no such attempt; its retry (after a resubmitted stage,
    # perhaps) is given the start's grace once (the chaos soak failed the fit here before)
    (dict(kills=0, max_kills=2, killed=False, kill_refused_by_spark=True, seen_gone=False), recovery.RETRYING),
    (dict(kills=0, max_kills=2, killed=False, kill_refused_by_spark=True, seen_gone=True), recovery.FAIL),  # no retry came
    (dict(kills=0, max_kills=2, killed=False, kill_refused_by_spark=False, seen_gone=False), recovery.FAIL),  # Spark Connect
])
def test_the_drivers_verdict_on_a_silent_worker_over_every_case(facts, verdict):
    assert recovery.silence_verdict(**facts) == verdict


@pytest.mark.parametrize(("facts", "order"), [
    (dict(first_registration=True, at_fit_start=True, checkpoint=False, on_disk=False, previous_answers=False), (FIT_START,)),
    (dict(first_registration=True, at_fit_start=False, checkpoint=True, on_disk=False, previous_answers=False), (CHECKPOINT,)),
    # a task retried before any round closed: the fit's start again, from the driver
    (dict(first_registration=False, at_fit_start=True, checkpoint=False, on_disk=True, previous_answers=True), (FIT_START,)),
    # a previous owner that answers holds the candidate and its neighbour's backups: first
    (dict(first_registration=False, at_fit_start=False, checkpoint=False, on_disk=True, previous_answers=True),
     (PREVIOUS, DISK, HOLDER, PEERS)),
    (dict(first_registration=False, at_fit_start=False, checkpoint=False, on_disk=True, previous_answers=False),
     (DISK, HOLDER, PEERS, PREVIOUS)),
    (dict(first_registration=False, at_fit_start=False, checkpoint=False, on_disk=False, previous_answers=False),
     (HOLDER, PEERS, PREVIOUS)),
    (dict(first_registration=False, at_fit_start=False, checkpoint=True, on_disk=False, previous_answers=False),
     (HOLDER, PEERS, PREVIOUS)),
])
def test_restore_order_over_every_case(facts, order):
    assert restore_order(**facts) == order


def _version(v: int, value: float, optimizer: bool = True) -> SliceVersion:
    weights = [np.full((3, 2), value, np.float32), np.arange(4, dtype=np.float32) + value]
    return SliceVersion(v, ModelState(weights, [np.array([v], np.int64), np.full((3, 2), -value, np.float32)] if optimizer else None))


def _same(a: SliceVersion, b: SliceVersion) -> bool:
    pairs = list(zip([*a.master.weights, *(a.master.optimizer or [])], [*b.master.weights, *(b.master.optimizer or [])],
                     strict=True))
    return a.version == b.version and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in pairs)


def test_disk_copies_keep_the_last_two_versions_of_every_slice_and_skip_a_copy_cut_short(tmp_path):
    disk = DiskCopies(str(tmp_path / "fit"), has_optimizer=True)
    for v in range(4):
        disk.write(1, _version(v, float(v)))  # this worker's own slice
        disk.write(0, _version(v, 10.0 + v))  # the backup it keeps of its neighbour's
    assert disk.versions(1) == [2, 3] and disk.versions(0) == [2, 3] and disk.versions(2) == []
    assert _same(disk.read(1, 3), _version(3, 3.0)) and disk.read(1, 1) is None
    # another Python worker on this executor later (the first gone with its task) finds both slices
    again = DiskCopies(str(tmp_path / "fit"), has_optimizer=True).everything()
    assert sorted(again) == [0, 1] and sorted(again[0]) == [2, 3]
    assert _same(again[0][3], _version(3, 13.0))
    (tmp_path / "fit" / "slice-0-v3.arrow").write_bytes(b"cut short")
    assert disk.read(0, 3) is None and sorted(disk.everything()[0]) == [2]
    assert DiskCopies(str(tmp_path / "none"), True).everything() == {}


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_a_bounded_wait_says_what_it_waits_for_returns_what_it_found_or_none_at_its_bound(caplog):
    clock = _Clock()
    answers = iter([None] * 5 + ["found"])
    with caplog.at_level(logging.INFO, logger="sparkdl"):
        got = wait_bounded(lambda: next(answers), "slice 2 looks for version 7", 60.0, 3.0, lambda: "its holder holds [5, 6]",
                           clock=clock, sleep=clock.sleep)
    assert got == "found" and clock.now == 15.0
    said = [r.getMessage() for r in caplog.records]
    assert any("slice 2 looks for version 7: still waiting after 6 s (of 60 s): its holder holds [5, 6]" in m for m in said), said
    clock = _Clock()
    assert wait_bounded(lambda: None, "never", 10.0, 3.0, lambda: "-", clock=clock, sleep=clock.sleep) is None
    assert clock.now == 10.0  # the last pause ends at the bound, not past it

    def superseded():
        raise RuntimeError("superseded")

    with pytest.raises(RuntimeError, match="superseded"):
        wait_bounded(lambda: None, "w", 10.0, 1.0, lambda: "-", check=superseded, clock=_Clock(), sleep=lambda s: None)


def test_a_backup_a_server_keeps_reaches_its_executors_disk_and_a_later_server_there_serves_it(tmp_path):
    """The defect this fixes: a holder's backup of its neighbour's slice lived in its memory alone,
    so when its Python worker ended (a resubmitted stage) the neighbour's only copy went with it."""
    weights = [np.zeros((3, 2), np.float32), np.zeros(4, np.float32)]
    layout = SliceLayout.of(ModelState(weights, [np.array(0, np.int64), np.zeros((3, 2), np.float32)]), 2)
    disk = DiskCopies(str(tmp_path / "fit"), layout.has_optimizer)
    neighbour = SliceVersion(5, layout.take(ModelState([w + 5 for w in weights], [np.array(5, np.int64),
                                                                                   np.full((3, 2), 5.0, np.float32)]), 0))

    def server():
        return SliceServer(1, layout, get_policy("sync"), lambda g: {0, 1}, names=["w0", "w1"], token="t", tls=None,
                           persist=disk.write)

    first = server()
    first.keep_backup(0, neighbour)
    assert first.flush_disk(30.0)
    first.shutdown()
    assert disk.versions(0) == [5]
    kept = disk.everything()[0][5]
    assert _same(kept, neighbour)
    later = server()  # the next owner started on this executor serves what the disk holds
    later.keep_backup(0, kept, to_disk=False)
    later.start()
    try:
        from sparkdl.server.slices import SliceClient

        with SliceClient(later.location, "t", timeout_s=10.0, retries=0) as client:
            assert client.held(0) == [5]
            assert _same(client.fetch("held:0:5", True), neighbour)
    finally:
        later.shutdown()


def test_a_slice_lost_reaches_the_coordinators_board_at_once():
    board = SliceBoard(2, 2)
    coordinator = Coordinator(board, initial=lambda owner: None)
    coordinator.start()
    client = CoordinatorClient(ParameterServerClient(coordinator.location, coordinator.token, timeout_s=10.0, retries=0))
    try:
        assert board.lost == []
        client.lost(1, 42, "slice 1 of the state (version 7) must be found after its owner was lost. Received: nowhere")
        assert board.lost == ["slice 1 (task attempt 42): slice 1 of the state (version 7) must be found after its owner was "
                              "lost. Received: nowhere"]
    finally:
        client.close()
        coordinator.shutdown()


def test_a_retried_owners_look_is_bounded_inside_round_timeout_and_speaks_long_before_its_bound():
    """A retried owner's look for its slice is bounded well inside the driver's default roundTimeout
    and says what it waits for long before its bound (a liveness interval, not the bound itself)."""
    from sparkdl.param_specs import PARAMS

    round_timeout = next(p.default for p in PARAMS if p.name == "roundTimeout")
    assert recovery.RESTORE_WAIT_S < round_timeout
    assert recovery.QUIET_S <= recovery.RESTORE_WAIT_S / 10 and recovery.RESTORE_PAUSE_S < recovery.QUIET_S


def test_with_overlap_an_owner_keeps_the_version_before_the_committed_one_and_refuses_one_gone_for_good():
    """With ``overlap`` a retried worker's sender may carry its round onto a start the owners have
    moved past: the owner keeps the version before the committed one when the next commits (its
    backups one version more), and a start older than every version held is refused at once (asking
    again cannot help), not waited for."""
    from sparkdl.errors import ServerError
    from sparkdl.server.slices import SliceClient, unavailable

    weights = [np.zeros((3, 2), np.float32), np.zeros(4, np.float32)]
    layout = SliceLayout.of(ModelState(weights), 2)

    def version(v):
        return SliceVersion(v, layout.take(ModelState([w + v for w in weights]), 1))

    plain = SliceServer(1, layout, get_policy("sync"), lambda g: {0, 1}, names=["w0"], token="t", tls=None)
    kept = SliceServer(1, layout, get_policy("sync"), lambda g: {0, 1}, names=["w0"], token="t", tls=None, keep_previous=True)
    try:
        for server in (plain, kept):
            server.install(version(3), version(4))
            assert float(server.start_of(4, 5.0).weights[0].ravel()[0]) == 4.0  # the driver opened round 4: 4 commits
        assert plain.held(3) is None and plain.status()["previous"] is None
        assert kept.held(3) is not None and kept.status()["previous"] == 3
        assert float(kept.start_of(3, 5.0).weights[0].ravel()[0]) == 3.0  # served again, nothing committed back
        assert kept.status()["committed"] == 4
        with pytest.raises(ServerError, match="no longer holds round 2's start"):
            kept.start_of(2, 5.0)
        for v in range(6):
            kept.keep_backup(0, SliceVersion(v, layout.take(ModelState(weights), 0)), to_disk=False)
            plain.keep_backup(0, SliceVersion(v, layout.take(ModelState(weights), 0)), to_disk=False)
        assert sorted(kept.backups[0]) == [3, 4, 5] and sorted(plain.backups[0]) == [4, 5]
        kept.start()
        with SliceClient(kept.location, "t", timeout_s=10.0, retries=0) as client:
            assert float(client.fetch("start:3", False).master.weights[0].ravel()[0]) == 3.0
            with pytest.raises(ServerError) as gone:
                client.fetch("start:1", False)
            assert "no longer holds version 1" in str(gone.value) and not unavailable(gone.value)
    finally:
        plain.shutdown()
        kept.shutdown()


def test_a_copy_handed_by_a_superseded_owner_is_served_then_forgotten_once_a_newer_version_commits():
    """A superseded owner of an old stage attempt puts its copies to any owner of the new one (its
    holder may be the lost executor's): that owner serves them to the slice's new owner (without
    taking them for its neighbour's backup), and forgets them once it commits a newer version (no
    restore asks for them then); its neighbour's backup stays."""
    from sparkdl.server.slices import SliceClient

    weights = [np.zeros((3, 2), np.float32), np.zeros(4, np.float32)]
    layout = SliceLayout.of(ModelState(weights), 3)  # owner 1 backs up slice 0; slice 2 is not its neighbour's

    def version(v, owner):
        return SliceVersion(v, layout.take(ModelState([w + v for w in weights]), owner))

    server = SliceServer(1, layout, get_policy("sync"), lambda g: {0, 1, 2}, names=["w0", "w1"], token="t", tls=None)
    try:
        server.install(version(3, 1), version(4, 1))
        for v in (3, 4):
            server.keep_backup(0, version(v, 0), to_disk=False)  # its neighbour's backup
            server.keep_backup(2, version(v, 2), to_disk=False)  # handed by slice 2's superseded owner
        server.start()
        with SliceClient(server.location, "t", timeout_s=10.0, retries=0) as client:
            assert client.held(2) == [3, 4]
            assert _same(client.fetch("held:2:3", False), version(3, 2))
            assert not server.backup_taken.is_set()  # slice 2's copy served: not the neighbour's
            client.fetch("held:0:3", False)
            assert server.backup_taken.is_set()
        server.start_of(4, 5.0)  # the driver opened round 4: version 4 commits, and so may copies up to it
        assert sorted(server.backups) == [0, 2]  # slice 2's copy holds version 4: still the accepted one
        server.install(version(5, 1), version(6, 1))
        server.keep_backup(0, version(5, 0), to_disk=False)
        server.start_of(6, 5.0)  # version 6 commits: slice 2's copy (version 4) is no restore's any more
        assert sorted(server.backups) == [0] and sorted(server.backups[0]) == [4, 5]
    finally:
        server.shutdown()


def test_a_superseded_attempt_offers_each_copy_to_the_slices_holder_first_then_round_the_ring():
    # slice 1's own new owner and the attempt itself are never offered it; the holder (2) comes first
    assert recovery.hand_order(1, [0, 1, 2, 3], owner=1, owners=4) == [2, 3, 0]
    # the neighbour's backup (slice 0, held by owner 1, the attempt itself): owners 2 and 3, from slice 0's holder on
    assert recovery.hand_order(0, [3, 2, 0], owner=1, owners=4) == [2, 3]
    assert recovery.hand_order(0, [0], owner=1, owners=2) == []  # nobody but the slice's own owner registered yet
    assert recovery.hand_order(2, [], owner=2, owners=3) == []


def test_with_overlap_an_owner_keeps_each_workers_last_two_contributions_and_serves_them_for_a_retried_worker():
    """``overlap`` without an encoding: a worker's contribution to round g is its carried start of
    round g + 1. The owner keeps the pieces it counted (its own worker's too), and pieces put to it
    (``carried``: a worker's own slice at its holder, a superseded attempt's hand-off), for each
    worker's last two rounds; a retried worker reads them back over Flight, values exact. An earlier
    attempt's piece (a superseded attempt's late hand-off) never replaces a later one's; a piece for
    another slice's layout, a slice out of range, a round beyond the newest version held, or any
    piece at a server that keeps none, is refused and nothing is kept."""
    from sparkdl.errors import ServerError
    from sparkdl.server.slices import SliceClient

    weights = [np.arange(6, dtype=np.float32).reshape(3, 2), np.arange(4, dtype=np.float32)]
    layout = SliceLayout.of(ModelState(weights), 2)

    def piece(value, owner):
        return layout.take(ModelState([w * 0 + value for w in weights]), owner)

    names = layout.names(["w0", "w1"], 1)
    plain = SliceServer(1, layout, get_policy("sync"), lambda g: {0, 1}, names=names, token="t", tls=None)
    server = SliceServer(1, layout, get_policy("sync"), lambda g: {0, 1}, names=names, token="t", tls=None, keep_carried=True)
    try:
        for owner in (plain, server):
            owner.install(SliceVersion(3, piece(0.0, 1)))
            for g in (3, 4, 5):
                for worker in (0, 1):
                    owner.contribute({"round": g, "worker": worker, "attempt": 7, "rows": 2, "encoding": None},
                                     piece(10 * g + worker, 1))
                owner.start_of(g + 1, 5.0)  # the round applied and the driver opened the next
        assert plain.carried_pieces() == {}
        assert sorted(server.carried_pieces()) == [(w, g, 1) for w in (0, 1) for g in (4, 5)]  # rounds 4 and 5: the last two
        server.start()
        plain.start()
        with SliceClient(plain.location, "t", timeout_s=10.0, retries=0) as client, pytest.raises(ServerError, match="keeps no contribution"):
            client.put_carried(piece(0.5, 0), worker=1, round_=5, slice_index=0, attempt=8)
        with SliceClient(server.location, "t", timeout_s=10.0, retries=0) as client:
            assert client.put_carried(piece(0.5, 0), worker=1, round_=5, slice_index=0, attempt=8)["applied"]  # worker 1's own piece at its holder
            late = client.put_carried(piece(9.0, 1), worker=1, round_=5, slice_index=1, attempt=6)  # an earlier attempt's hand-off
            assert late == {"applied": False, "dropped": "superseded_attempt"}
            with pytest.raises(ServerError, match="round must be at most 6"):
                client.put_carried(piece(0.5, 0), worker=1, round_=7, slice_index=0, attempt=8)
            assert client.carried(1, 5) == [0, 1] and client.carried(0, 5) == [1] and client.carried(0, 3) == []
            got = client.fetch("carried:1:5:1", False).master
            assert all(np.array_equal(a, b) for a, b in zip(got.weights, piece(51.0, 1).weights, strict=True))
            assert float(client.fetch("carried:1:5:0", False).master.weights[0].ravel()[0]) == 0.5
            with pytest.raises(ServerError, match="keeps no slice 1 of worker 0's contribution to round 3"):
                client.fetch("carried:0:3:1", False)
            with pytest.raises(ServerError, match="must hold"):
                client.put_carried(piece(0.5, 1), worker=1, round_=6, slice_index=0, attempt=8)  # slice 1's pieces as slice 0
            with pytest.raises(ServerError, match="must be below 2"):
                client.put_carried(piece(0.5, 1), worker=1, round_=6, slice_index=5, attempt=8)
            assert client.carried(1, 6) == []
        with SliceClient(server.location, "wrong", timeout_s=10.0, retries=0) as stranger, pytest.raises(ServerError):
            stranger.carried(1, 5)
    finally:
        plain.shutdown()
        server.shutdown()
