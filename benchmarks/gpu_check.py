"""GPU check of the executor-side replica, without Spark: the mnist CNN on GPU and CPU, float32 and mixed precision.

Trains ``conf/mnist_cnn.yaml``'s CNN (``sparkdl.keras.zoo:mnist_cnn``) on the bundled mnist10k digits
with :class:`sparkdl.keras.replica.Replica` (what each Spark task runs: ``train_on_batch`` steps, the master weights
loaded with ``set_state`` and read back with ``get_state``, which refuses anything but float32) for ``--epochs``
epochs on each device found, for each precision: ``float32``, ``mixed_bfloat16`` and (GPU only) ``mixed_float16``
(Keras wraps the optimizer in a ``LossScaleOptimizer``). Prints the devices found, a table of samples/s (rows per
second of the epochs after the first, which also traces and compiles the step; the first epoch's own figure when
there is only one) and test accuracy, then one JSON line with every run.

Needs the repository's files, numpy, keras and ONE Keras backend: ``KERAS_BACKEND`` if set, else the first of jax,
torch, tensorflow that imports. No pyspark, no pyarrow (the digits come from ``data/mnist10k/mnist10k.npz``, or from
the Parquet files when pyarrow is there and the npz is not). With no GPU it says so and runs on CPU only.

Usage (from the repository root)::

    python benchmarks/gpu_check.py                       # 2 epochs, all 8,000 training rows
    python benchmarks/gpu_check.py --epochs 1 --rows 2000 --precisions float32,mixed_bfloat16 --devices cpu

Exit status: 0 when every run finished with float32 weights, 1 when one failed (its error is in the table and
the JSON line), 2 when no backend could be imported.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data", "mnist10k")
BACKENDS = ("jax", "torch", "tensorflow")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


def pick_backend() -> str:
    """``KERAS_BACKEND`` if set, else the first importable of jax, torch, tensorflow; sets the variable
    before keras is imported. Exits with status 2 when none imports."""
    chosen = os.environ.get("KERAS_BACKEND")
    if chosen:
        return chosen
    for name in BACKENDS:
        try:
            importlib.import_module(name)
        except Exception:  # ImportError, or a broken install (a CUDA library missing)
            continue
        os.environ["KERAS_BACKEND"] = name
        return name
    print("gpu_check: no Keras backend imports (tried jax, torch, tensorflow); install one", file=sys.stderr)
    sys.exit(2)


def find_gpus(backend: str) -> list[str]:
    """Names of the GPUs the backend sees (``[]`` when none, or when asking fails)."""
    try:
        if backend == "tensorflow":
            import tensorflow as tf

            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
            return [d.name for d in tf.config.list_physical_devices("GPU")]
        if backend == "jax":
            import jax

            return [f"{d.platform}:{d.id} {getattr(d, 'device_kind', '')}".strip() for d in jax.devices() if d.platform in ("gpu", "cuda", "rocm")]
        if backend == "torch":
            import torch

            return [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    except Exception as exc:
        print(f"gpu_check: could not list GPUs with {backend}: {type(exc).__name__}: {exc}")
    return []


def load_digits(rows: int | None):
    """``(x_train, y_train, x_test, y_test)``: float32 grey levels ``(n, 784)`` 0..255 and int32 labels;
    the first ``rows`` training rows when given (all 2,000 test rows)."""
    import numpy as np

    npz = os.path.join(DATA, "mnist10k.npz")
    if os.path.exists(npz):
        with np.load(npz) as data:
            arrays = [data[k] for k in ("x_train", "y_train", "x_test", "y_test")]
    else:  # pyarrow needed here
        import pyarrow.parquet as pq

        arrays = []
        for part in ("train", "test"):
            table = pq.read_table(os.path.join(DATA, f"{part}.parquet"))
            arrays += [np.stack(table.column("pixels").to_numpy(zero_copy_only=False)), table.column("label").to_numpy()]
    x_train, y_train, x_test, y_test = arrays
    if rows is not None:
        x_train, y_train = x_train[:rows], y_train[:rows]
    return x_train.astype(np.float32), y_train.astype(np.int32), x_test.astype(np.float32), y_test.astype(np.int32)


class _Spec:
    """What :class:`~sparkdl.keras.replica.Replica` reads of a ``sparkdl.keras.spec.ModelSpec`` (whose Arrow
    weights need pyarrow): the architecture JSON, the initial weights, the inputs."""

    def __init__(self, model) -> None:
        import keras

        self._keras = keras
        self.architecture = model.to_json()
        self._weights = [w.copy() for w in model.get_weights()]
        self.weights = b"weights"  # truthy: build() assigns weight_arrays()
        self.input_specs = (("pixels", (784,), "float32"),)

    def weight_arrays(self):
        return self._weights

    def build(self):
        model = self._keras.models.model_from_json(self.architecture)
        model.set_weights(self._weights)
        return model


class _Compile:
    """``conf/mnist_cnn.yaml``'s compile arguments (``CompileSpec.compile``'s role)."""

    def __init__(self, learning_rate: float) -> None:
        self.learning_rate = learning_rate

    def compile(self, model):
        import keras

        model.compile(optimizer=keras.optimizers.Adam(self.learning_rate), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model


def run_one(device: str, precision: str, data, epochs: int, batch_size: int, learning_rate: float, seed: int) -> dict:
    """Train a fresh replica on ``device`` (``"cpu:0"``/``"gpu:0"``) in ``precision``; returns the run's figures."""
    import keras
    import numpy as np

    from sparkdl.core.state import ModelState
    from sparkdl.keras.replica import Replica

    x_train, y_train, x_test, y_test = data
    mixed = None if precision == "float32" else precision
    result = {"device": device, "precision": precision, "epochs": epochs, "rows": len(x_train), "batch_size": batch_size}
    scope = keras.device(device) if device.startswith("gpu") else contextlib.nullcontext()  # CPU: the GPUs are hidden
    with scope:
        started = time.perf_counter()
        from sparkdl.keras.zoo import mnist_cnn  # keras only

        spec = _Spec(mnist_cnn(seed=1))
        replica = Replica(spec, _Compile(learning_rate), seed=seed, mixed_precision=mixed)
        replica.set_state(ModelState(spec.weight_arrays(), None))  # the master weights, float32, as a round starts
        result["build_s"] = round(time.perf_counter() - started, 3)
        rng = np.random.default_rng(seed)
        epoch_s, losses = [], []
        for _ in range(epochs):
            order = rng.permutation(len(x_train))
            started = time.perf_counter()
            sums = replica.train(x_train, y_train, batch_size, rows=order)
            epoch_s.append(time.perf_counter() - started)
            losses.append(float(sums[0] / sums[1]))  # Keras' loss/total over loss/count: the epoch's mean loss
        state = replica.get_state()  # raises InvariantError unless the weights are the master's float32
        predicted = replica.model.predict(x_test, batch_size=512, verbose=0)
    timed = epoch_s[1:] or epoch_s
    result.update(
        samples_per_s=round(len(x_train) * len(timed) / sum(timed), 1),
        first_epoch_s=round(epoch_s[0], 3),
        epoch_s=[round(s, 3) for s in epoch_s],
        loss=[round(v, 4) for v in losses],
        test_accuracy=round(float(np.mean(np.argmax(np.asarray(predicted), axis=1) == y_test)), 4),
        weights_dtype=sorted({str(a.dtype) for a in state.weights}),
        compute_dtype=replica.model.layers[2].compute_dtype,  # the first Conv2D
        optimizer=type(replica.model.optimizer).__name__,
    )
    return result


def table(results: list[dict]) -> str:
    lines = ["| device | precision | samples/s | first epoch s | test accuracy | compute dtype | weights | optimizer |",
             "|---|---|---:|---:|---:|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['device']} | {r['precision']} | failed: {r['error'][:80]} | | | | | |")
        else:
            lines.append(f"| {r['device']} | {r['precision']} | {r['samples_per_s']:.0f} | {r['first_epoch_s']:.1f} | "
                         f"{100 * r['test_accuracy']:.2f} % | {r['compute_dtype']} | {','.join(r['weights_dtype'])} | {r['optimizer']} |")
    return "\n".join(lines)


def _runs(device: str, precisions: list[str], args) -> list[dict]:
    """Every run of one device in this process, each failure reported as a result."""
    results = []
    data = load_digits(args.rows)
    print(f"gpu_check: [{device}] {len(data[0])} training rows, {len(data[2])} test rows, {args.epochs} epoch(s), "
          f"batch {args.batch_size}", flush=True)
    for precision in precisions:
        if precision == "mixed_float16" and device.startswith("cpu") and not args.cpu_float16:
            continue
        try:
            result = run_one(device, precision, data, args.epochs, args.batch_size, args.learning_rate, args.seed)
        except Exception as exc:  # report it and go on: one unsupported dtype must not hide the other runs
            traceback.print_exc()
            result = {"device": device, "precision": precision, "error": f"{type(exc).__name__}: {exc}"}
        results.append(result)
        shown = (f"{result['samples_per_s']:.0f} samples/s, test accuracy {100 * result['test_accuracy']:.2f} %"
                 if "error" not in result else f"failed: {result['error'][:200]}")
        print(f"gpu_check: {device} {precision}: {shown}", flush=True)
    return results


def _child(kind: str, precisions: list[str], args) -> dict:
    """One device kind in this (child) process: ``"gpu"`` lists the GPUs and runs on the first, ``"cpu"`` runs
    with the GPUs hidden (``CUDA_VISIBLE_DEVICES=""``, ``JAX_PLATFORMS=cpu``, set by the parent)."""
    backend = pick_backend()
    import keras

    out = {"backend": backend, "backend_version": _version(backend), "keras": keras.__version__, "gpus": [], "results": []}
    if kind == "gpu":
        out["gpus"] = gpus = find_gpus(backend)
        if not gpus:
            print("gpu_check: no GPU found: running on CPU only", flush=True)
            return out
        print(f"gpu_check: {len(gpus)} GPU(s) found: {'; '.join(gpus)} (runs use the first, gpu:0)", flush=True)
        out["results"] = _runs("gpu:0", precisions, args)
    else:
        out["results"] = _runs("cpu:0", precisions, args)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    parser.add_argument("--rows", type=int, default=None, help="training rows, the first N of 8,000 (default all)")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per step (default 64, as conf/mnist_cnn.yaml)")
    parser.add_argument("--learning-rate", type=float, default=0.002, help="Adam's learning rate (default 0.002)")
    parser.add_argument("--devices", default="gpu,cpu", help="comma-separated: gpu, cpu (default both; gpu skipped when none)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help="comma-separated among float32, mixed_bfloat16, mixed_float16 (mixed_float16 runs on GPU only "
                             "unless --cpu-float16)")
    parser.add_argument("--cpu-float16", action="store_true", help="also run mixed_float16 on CPU (slow on most CPUs)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--child", choices=["gpu", "cpu"], help=argparse.SUPPRESS)  # internal: one device kind
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    unknown = sorted(set(precisions) - set(PRECISIONS))
    if unknown:
        parser.error(f"--precisions must be among {PRECISIONS}; received {unknown}")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.child:
        out = _child(args.child, precisions, args)
        with open(args.child_out, "w") as f:
            json.dump(out, f)
        return 0

    # Each device kind runs in its own process: the CPU runs with the GPUs hidden from the backend, as a Spark
    # task without a GPU resource on a CPU executor (keras.device("cpu:0") beside a visible GPU breaks the torch
    # backend's integer variables), and the GPU runs without this process holding GPU memory.
    backend = pick_backend()
    import numpy as np

    print(f"gpu_check: keras {_keras_version()}, backend {backend} {_version(backend)}, numpy {np.__version__}, "
          f"python {platform.python_version()}", flush=True)
    wanted = [d.strip() for d in args.devices.split(",") if d.strip()]
    merged = {"backend": backend, "backend_version": _version(backend), "keras": _keras_version(), "gpus": [], "results": []}
    failed_children = []
    for kind in ("gpu", "cpu"):
        if kind not in wanted:
            continue
        env = dict(os.environ, KERAS_BACKEND=backend)
        if kind == "cpu":
            env.update(CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "out.json")
            command = [sys.executable, os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:]),
                       "--child", kind, "--child-out", path]
            code = subprocess.call(command, env=env)
            if code != 0 or not os.path.exists(path):
                failed_children.append(kind)
                merged["results"].append({"device": f"{kind}:0", "precision": "all", "error": f"the {kind} process exited with {code}"})
                continue
            with open(path) as f:
                out = json.load(f)
        merged["gpus"] = merged["gpus"] or out["gpus"]
        merged["results"] += out["results"]
    print()
    print(table(merged["results"]))
    print()
    print(json.dumps(merged))
    return 1 if any("error" in r for r in merged["results"]) or not merged["results"] else 0


def _keras_version() -> str:
    try:
        from importlib.metadata import version

        return version("keras")
    except Exception:
        return "?"


def _version(backend: str) -> str:
    try:
        return importlib.import_module(backend).__version__
    except Exception:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
