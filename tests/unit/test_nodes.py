"""The rule and the words of a node lost for good (sparkdl.spark.training.nodes); the rule on real
daemons: tests/integration/test_node_loss.py."""

from sparkdl.spark.training.nodes import NodeLoss, executors_text, node_wait_s


def test_a_stage_waits_a_minute_for_lost_slots_or_half_of_a_shorter_worker_timeout():
    assert node_wait_s(600.0) == 60.0
    assert node_wait_s(40.0) == 20.0  # decided before any waiting worker could be called silent


def test_a_node_loss_names_the_executor_its_reason_and_what_is_left():
    loss = NodeLoss(slots=1, needed=2, waited_s=60.4,
                    lost=({"id": "3", "host_port": "10.0.0.7:43239", "remove_reason": "worker lost: 10.0.0.7:7078 got disassociated"},))
    assert loss.describe("ps workers") == ("executor 3 (10.0.0.7:43239: worker lost: 10.0.0.7:7078 got disassociated) lost, and no "
                                           "replacement came within 60 s: 1 task slot left for 2 ps workers, which run at once")
    assert loss.info() == {"executors": [dict(loss.lost[0])], "slots": 1, "workers": 2, "waited_s": 60.4}
    assert NodeLoss(0, 3, (), 20.0).describe("sharded workers").endswith("0 task slots left for 3 sharded workers, which run at once")
    assert executors_text(()) == "an executor (Spark named none removed)"


class _Cluster:
    """What a SlotWatch reads, set by the test: the task slots and the executors removed since the fit started."""

    def __init__(self, slots, lost=()):
        self.slots, self.lost, self.lines = slots, lost, []


def _watch(cluster, wait_s=0.3, decides=True):
    from sparkdl.spark.training import nodes

    return nodes.SlotWatch(lambda: cluster.slots, lambda: cluster.lost, wait_s, "ps workers", cluster.lines.append, decides, every_s=0.0)


def _look_for(watch, needed, seconds):
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = watch.look(needed)
        if found is not None:
            return found
        time.sleep(0.02)
    return None


EXECUTOR = {"id": "1", "host_port": "10.0.0.7:43239", "remove_reason": "worker lost"}


def test_short_slots_with_a_removed_executor_are_told_at_once_and_a_loss_after_the_wait():
    cluster = _Cluster(1, (EXECUTOR,))
    watch = _watch(cluster)
    assert watch.look(2) is None and watch.short
    assert cluster.lines == ["sparkdl: executor 1 (10.0.0.7:43239: worker lost) lost: 1 task slot left for 2 ps workers, which run "
                             "at once; waiting up to 0 s for a replacement"]
    loss = _look_for(watch, 2, 2.0)
    assert loss is not None and loss.slots == 1 and loss.needed == 2 and loss.lost == (EXECUTOR,) and loss.waited_s >= 0.3


def test_a_replacement_within_the_wait_or_workers_that_ended_end_the_shortage():
    cluster = _Cluster(1, (EXECUTOR,))
    watch = _watch(cluster, wait_s=30.0)
    assert watch.look(2) is None and watch.short
    cluster.slots = 2  # the cluster manager brought an executor
    assert _look_for(watch, 2, 0.2) is None and not watch.short
    assert cluster.lines[-1] == "sparkdl: 2 task slots now for the 2 ps workers still to run; the fit goes on"
    cluster.slots = 1
    assert watch.look(2) is None and watch.short
    assert _look_for(watch, 1, 0.2) is None and not watch.short  # one worker ended: one slot is enough


def test_no_removed_executor_no_shortage_and_workers_that_never_wait_are_only_told():
    growing = _Cluster(1, ())  # fewer slots than workers and nothing removed: not a lost node
    watch = _watch(growing, wait_s=0.0)
    assert _look_for(watch, 2, 0.2) is None and not watch.short and growing.lines == []
    told = _Cluster(1, (EXECUTOR,))
    watch = _watch(told, wait_s=0.0, decides=False)
    assert _look_for(watch, 2, 0.3) is None and watch.short
    assert told.lines[0].endswith("the waiting worker's task runs on the slot another frees when its slots are done")


def test_a_heartbeat_received_after_its_tasks_done_leaves_the_worker_done():
    """A beat sent before the task ended and received after: the worker needs no task slot any more (else a
    finished worker would count as waiting for one). A new attempt's beat is heard."""
    from sparkdl.core.liveness import Contacts

    contacts = Contacts(workers=2)
    assert contacts.touch("1", "done", attempt=7)
    assert contacts.touch("1", "alive", attempt=7)
    assert contacts.snapshot()["1"]["state"] == "done"
    assert contacts.touch("1", "alive", attempt=9) and contacts.snapshot()["1"]["state"] == "alive"
