"""GPU pinning of Spark tasks (issue 11, item 1; case C38): the pure plan and the reuse rule."""

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from sparkdl.core.gpu import CPU, GpuPlan, check_reuse, gpu_conf_warnings, plan_gpus
from sparkdl.errors import ConfigError


def test_c38_addresses_without_inherited_variable_are_the_visible_devices():
    plan = plan_gpus(["1", "3"], None, required=True)
    assert plan.visible_devices == "1,3"
    assert plan.ordinals == (0, 1)  # in-process ordinals start at 0, whatever the physical numbers
    assert plan.addresses == ("1", "3")


def test_c38_addresses_are_positions_in_an_inherited_list():
    plan = plan_gpus(["1", "3"], "4,5,6,7", required=True)
    assert (plan.visible_devices, plan.ordinals) == ("5,7", (0, 1))


def test_c38_an_address_that_is_an_inherited_device_id_is_kept_and_gets_ordinal_0():
    plan = plan_gpus(["3"], "2,3", required=True)
    assert plan.visible_devices == "3"
    assert plan.ordinals == (0,)  # never ordinal 3: the process sees one device


def test_an_address_that_is_an_id_and_another_devices_position_is_refused_not_guessed():
    # "1" is both an id in "1,2" and position 1 (device "2"); "0" can only be a position (device "1"):
    # guessing per task would put a task given "0" and one given "1" on the same device
    assert plan_gpus(["0"], "1,2", required=True).visible_devices == "1"
    with pytest.raises(ConfigError, match="share a GPU"):
        plan_gpus(["1"], "1,2", required=True)
    assert plan_gpus(["1"], "1,2", required=True, mode="ids").visible_devices == "1"
    assert plan_gpus(["1"], "1,2", required=True, mode="positions").visible_devices == "2"


@pytest.mark.parametrize("addresses", [[""], [], None])
def test_c38_no_usable_address_with_gpus_required_names_the_conf_and_the_discovery_script(addresses):
    with pytest.raises(ConfigError) as info:
        plan_gpus(addresses, None, required=True)
    message = str(info.value)
    assert "spark.task.resource.gpu.amount" in message
    assert "spark.executor.resource.gpu.discoveryScript" in message
    assert "Received:" in message


def test_c38_an_empty_address_fails_even_when_not_flagged_required():
    with pytest.raises(ConfigError, match="discoveryScript"):
        plan_gpus([""], None, required=False)


@pytest.mark.parametrize("addresses", [[], None])
def test_c38_no_address_without_gpus_required_is_a_cpu_task(addresses):
    plan = plan_gpus(addresses, "0,1", required=False)
    assert plan == CPU
    assert plan.visible_devices is None and plan.ordinals == () and not plan.on_gpu


def test_c38_leading_zeros_are_normalised():
    plan = plan_gpus(["01"], None, required=True)
    assert plan.visible_devices == "1" and plan.addresses == ("1",)
    assert plan_gpus(["00", "02"], "4,5,6", required=True).visible_devices == "4,6"


def test_an_address_beyond_the_inherited_list_names_both():
    with pytest.raises(ConfigError) as info:
        plan_gpus(["5"], "0,1", required=True)
    message = str(info.value)
    assert "['5']" in message and "CUDA_VISIBLE_DEVICES='0,1'" in message


def test_an_inherited_empty_variable_leaves_no_device_to_pin():
    with pytest.raises(ConfigError, match="positions 0..-1"):
        plan_gpus(["0"], "", required=True)


@pytest.mark.parametrize("address", ["-1", "gpu0", "1.5"])
def test_an_address_that_is_no_device_is_refused(address):
    with pytest.raises(ConfigError, match="non-negative integer"):
        plan_gpus([address], None, required=True)


def test_uuid_addresses_are_absolute():
    uuid = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
    assert plan_gpus([uuid], None, required=True).visible_devices == uuid
    assert plan_gpus([uuid], f"GPU-aaa,{uuid}", required=True).visible_devices == uuid
    # positions into a list of UUIDs pick them
    assert plan_gpus(["1"], f"GPU-aaa,{uuid}", required=True).visible_devices == uuid


def test_the_same_device_twice_is_refused():
    with pytest.raises(ConfigError, match="distinct"):
        plan_gpus(["1", "01"], None, required=True)


def test_reuse_pins_a_fresh_worker_and_keeps_the_same_devices():
    wanted = plan_gpus(["1"], None, required=True)
    assert check_reuse(None, wanted, backend_started=False) is True
    assert check_reuse(wanted, plan_gpus(["1"], None, required=True), backend_started=True) is False
    # a CPU task never pins, in a fresh worker or one pinned earlier
    assert check_reuse(None, CPU, backend_started=True) is False
    assert check_reuse(wanted, CPU, backend_started=True) is False


def test_reuse_may_repin_other_devices_before_the_backend_started():
    assert check_reuse(plan_gpus(["0"], None, True), plan_gpus(["1"], None, True), backend_started=False) is True


def test_c38_a_reused_worker_with_other_addresses_names_worker_reuse_and_both_lists():
    with pytest.raises(ConfigError) as info:
        check_reuse(plan_gpus(["0"], None, True), plan_gpus(["1", "2"], None, True), backend_started=True)
    message = str(info.value)
    assert "spark.python.worker.reuse" in message
    assert "['1', '2']" in message and "['0']" in message


def test_a_backend_started_before_any_pin_cannot_be_pinned():
    with pytest.raises(ConfigError, match="started unpinned"):
        check_reuse(None, plan_gpus(["1"], None, True), backend_started=True)


def test_gpu_plan_is_the_pair_of_visible_devices_and_ordinals():
    visible, ordinals, _ = plan_gpus(["2", "0"], None, required=True)
    assert (visible, ordinals) == ("2,0", (0, 1))  # Spark's order kept
    assert isinstance(plan_gpus(["2"], None, True), GpuPlan)


def test_gpu_conf_warnings_name_a_missing_task_amount_and_shared_executors():
    def conf(**values):
        keys = {"executor": "spark.executor.resource.gpu.amount", "task": "spark.task.resource.gpu.amount",
                "reuse": "spark.python.worker.reuse"}
        return {keys[k]: v for k, v in values.items()}.get

    assert gpu_conf_warnings(conf()) == []  # no GPUs
    assert gpu_conf_warnings(conf(executor="1", task="1")) == []  # one GPU task per executor: reuse is safe
    assert gpu_conf_warnings(conf(executor="4", task="1", reuse="false")) == []
    [missing] = gpu_conf_warnings(conf(executor="2"))
    assert "spark.task.resource.gpu.amount is not set" in missing
    [shared] = gpu_conf_warnings(conf(executor="4", task="1"))
    assert "spark.python.worker.reuse=false" in shared and "spark.executor.resource.gpu.amount=1" in shared
    assert gpu_conf_warnings(conf(executor="1", task="0.5")) == []  # two tasks share one GPU: the same address
    assert len(gpu_conf_warnings(conf(executor="2", task="0.5"))) == 1


PROCESS = textwrap.dedent(
    """
    import json, os, sys
    os.environ["CUDA_VISIBLE_DEVICES"] = "4,5,6,7"
    from sparkdl.keras import runtime
    from sparkdl.errors import ConfigError
    seen = []
    plan = runtime.pin_gpus({"gpu": ["1", "3"]})
    seen.append([os.environ["CUDA_VISIBLE_DEVICES"], list(plan.ordinals)])
    runtime.pin_gpus({"gpu": ["1", "3"]})                   # the same task's devices again: nothing changes
    seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    runtime.pin_gpus({"gpu": ["0"]})                        # no backend yet: re-pinned, mapped through 4,5,6,7 again
    seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    runtime.pin_gpus({})                                    # a CPU task keeps the worker's devices
    seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    runtime.configure(1, {"gpu": ["0"]})                    # starts TensorFlow on device 4
    try:
        runtime.configure(1, {"gpu": ["2"]})
        seen.append("no error")
    except ConfigError as exc:
        seen.append(str(exc))
    seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    seen.append(runtime.describe()["intra_op_threads"])
    json.dump(seen, sys.stdout)
    """
)


def test_runtime_pins_once_per_process_and_refuses_other_gpus_after_the_backend_started():
    result = subprocess.run([sys.executable, "-c", PROCESS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen[0] == ["5,7", [0, 1]]
    assert seen[1] == "5,7"
    assert seen[2] == "4"
    assert seen[3] == "4"
    assert "spark.python.worker.reuse" in seen[4] and "['2']" in seen[4] and "['0']" in seen[4]
    assert seen[5] == "4"  # unchanged by the refused task
    assert seen[6] == 1


CONF = pathlib.Path(__file__).resolve().parents[2] / "conf" / "gpu"


def _properties(path):
    pairs = [line.split(None, 1) for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return {key: value.strip() for key, value in pairs}


@pytest.mark.parametrize("name", ["standalone.conf", "yarn.conf", "kubernetes.conf"])
def test_gpu_conf_templates_give_each_task_one_gpu_of_its_own(name):
    conf = _properties(CONF / name)
    assert conf["spark.executor.resource.gpu.amount"] == "1" and conf["spark.task.resource.gpu.amount"] == "1"
    assert conf["spark.executor.resource.gpu.discoveryScript"].endswith("/examples/src/main/scripts/getGpusResources.sh")
    assert conf["spark.task.cpus"] == conf["spark.executor.cores"]
    assert not any(key.startswith(("spark.rapids", "spark.plugins")) for key in conf)
    assert gpu_conf_warnings(conf.get) == []
    if name == "kubernetes.conf":
        assert conf["spark.executor.resource.gpu.vendor"] == "nvidia.com"


def test_databricks_template_is_a_gpu_cluster_with_one_gpu_per_task():
    cluster = json.loads((CONF / "databricks.json").read_text())
    assert "-gpu-ml-" in cluster["spark_version"] and int(cluster["spark_version"].split(".")[0]) >= 17  # Spark 4
    assert cluster["spark_conf"]["spark.task.resource.gpu.amount"] == "1"
    assert not any(key.startswith("spark.rapids") for key in cluster["spark_conf"])


def test_addresses_that_read_two_ways_are_refused_unless_the_mode_is_set():
    """Review F2: under an inherited 1,2,3 a task given '1' and its sibling given '2' must not both
    read as ids while another reads '0' as a position (two tasks on device 1)."""
    from sparkdl.core.gpu import plan_gpus

    assert plan_gpus(["0"], "1,2,3", True).visible_devices == "1"  # not an id: a position, unambiguous
    for address in ("1", "2"):
        with pytest.raises(ConfigError, match="SPARKDL_GPU_ADDRESSES=ids"):
            plan_gpus([address], "1,2,3", True)
    assert [plan_gpus([a], "1,2,3", True, mode="positions").visible_devices for a in "012"] == ["1", "2", "3"]
    assert [plan_gpus([a], "1,2,3", True, mode="ids").visible_devices for a in "123"] == ["1", "2", "3"]
    with pytest.raises(ConfigError, match="not in it"):
        plan_gpus(["0"], "1,2,3", True, mode="ids")
    with pytest.raises(ConfigError, match="must be one of"):
        plan_gpus(["0"], "1,2,3", True, mode="both")
    assert plan_gpus(["3"], "2,3", True).visible_devices == "3" and plan_gpus(["1", "3"], "4,5,6,7", True).visible_devices == "5,7"
