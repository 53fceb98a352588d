"""Keras backends (issue 11, item 3): the pure rules of sparkdl.keras.runtime, and a process that
selects a backend before Keras is imported and refuses another one afterwards."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sparkdl.errors import ConfigError
from sparkdl.keras.runtime import check_backend, check_backend_reuse, jax_xla_flags

pytestmark = pytest.mark.backends


def test_a_reused_worker_refuses_another_backend_naming_both_and_worker_reuse():
    check_backend_reuse(None, "jax")        # Keras not imported yet: any backend
    check_backend_reuse("jax", "jax")       # the same backend again
    with pytest.raises(ConfigError) as info:
        check_backend_reuse("tensorflow", "jax")
    message = str(info.value)
    assert "spark.python.worker.reuse" in message
    assert "backend 'jax'" in message and "backend 'tensorflow'" in message
    assert "Received:" in message


def test_only_the_three_keras_backends_are_accepted():
    assert [check_backend(name) for name in ("tensorflow", "jax", "torch")] == ["tensorflow", "jax", "torch"]
    for bad in ("numpy", "TensorFlow", "", None):
        with pytest.raises(ConfigError, match="Received: " + repr(bad).replace("(", r"\(")):
            check_backend(bad)


def test_jax_threads_one_cpu_task_turns_off_multithreaded_eigen_and_keeps_other_flags():
    assert jax_xla_flags(None, 1) == "--xla_cpu_multi_thread_eigen=false"
    assert jax_xla_flags("--xla_dump_to=/tmp/x", 1) == "--xla_dump_to=/tmp/x --xla_cpu_multi_thread_eigen=false"
    assert jax_xla_flags("--xla_cpu_multi_thread_eigen=true", 1) == "--xla_cpu_multi_thread_eigen=true"  # the user's choice stays
    assert jax_xla_flags(None, 2) is None  # XLA's pool follows the CPU affinity: nothing to set
    assert jax_xla_flags("--xla_dump_to=/tmp/x", 4) == "--xla_dump_to=/tmp/x"


PROCESS = textwrap.dedent(
    """
    import json, os, sys
    from sparkdl.keras import runtime
    from sparkdl.errors import ConfigError
    backend = sys.argv[1]
    other = "tensorflow" if backend != "tensorflow" else "jax"
    seen = {"before": "keras" in sys.modules}
    runtime.configure(None, {}, backend)          # a task's first call: sets KERAS_BACKEND, imports nothing
    seen["env"] = os.environ["KERAS_BACKEND"]
    seen["imported"] = "keras" in sys.modules
    keras = runtime.keras_module()
    seen["keras"] = keras.backend.backend()
    seen["shipped"] = runtime.keras_backend()
    try:
        runtime.configure(None, {}, other)        # a task of a driver on another backend, in this reused worker
        seen["error"] = None
    except ConfigError as exc:
        seen["error"] = str(exc)
    seen["env_after"] = os.environ["KERAS_BACKEND"]
    print(json.dumps(seen))
    """
)


def test_configure_selects_the_tasks_backend_before_keras_and_refuses_another_after_it():
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    env = dict(os.environ, KERAS_BACKEND="numpy")  # the executor's own setting loses to the task's
    result = subprocess.run([sys.executable, "-c", PROCESS, backend], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["before"] is False and seen["imported"] is False
    assert seen["env"] == seen["keras"] == seen["shipped"] == backend
    assert seen["error"] is not None and "spark.python.worker.reuse" in seen["error"] and repr(backend) in seen["error"]
    assert seen["env_after"] == backend  # the refused task changed nothing
