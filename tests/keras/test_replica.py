"""Replica metrics and randomness against plain Keras, without Spark (issue 5, items 1 and 3).

Epoch metrics: the summed metric variables of any split of an epoch (workers, rounds) read
through :class:`MetricReader` equal ``keras.Model.fit``'s History for the same batches.
Dropout: seed state comes from (seed, epoch, round, partition), not from the process.
"""

import numpy as np
import pytest

from sparkdl.core.metrics import MetricSums
from sparkdl.core.state import ModelState
from sparkdl.errors import CodecError, ConfigError, SchemaError
from sparkdl.keras.metrics import MetricReader
from sparkdl.keras.replica import Replica
from sparkdl.keras.spec import CompileSpec, ModelSpec

import keras  # noqa: E402

ROWS, BATCH = 64, 8


@pytest.fixture(scope="module")
def binary():
    """64 rows of a noisy binary task, a small classifier's spec, compile args with accuracy and AUC."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    y = ((x @ np.array([1.0, -1.0, 0.5, 0.0]) + rng.normal(scale=1.0, size=ROWS)) > 0).astype(np.float32)
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1, activation="sigmoid")])
    spec = ModelSpec.from_model(model)
    # Named: older Keras numbers unnamed metrics per process ("auc_2"), so History's key would vary.
    compile_spec = CompileSpec.create(keras.optimizers.Adam(0.05), "binary_crossentropy", ["accuracy", keras.metrics.AUC(name="auc")])
    reader = MetricReader(spec, compile_spec, (4,), "float32", (), "float32")
    return x, y, spec, compile_spec, reader


def _plain_fit(spec, compile_spec, x, y, epochs):
    plain = compile_spec.compile(spec.build())
    return plain.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0).history, plain.get_weights()


def _assert_close(got, want):
    assert list(got) == list(want)
    for name in want:
        assert got[name] == pytest.approx(want[name], abs=1e-6), name


def test_one_worker_epoch_metrics_equal_keras_fit(binary):
    x, y, spec, compile_spec, reader = binary
    replica = Replica(spec, compile_spec, seed=0)
    replica.set_state(ModelState(spec.weight_arrays(), None))
    variables = replica.train(x, y, BATCH)
    assert [v.shape for v in variables] == [(), (), (), (), (200,), (200,), (200,), (200,)]
    assert variables[1] == ROWS  # loss/count: rows, from 8 steps each reset before it
    history, _ = _plain_fit(spec, compile_spec, x, y, epochs=1)
    assert set(history) == {"loss", "accuracy", "auc"}
    _assert_close(reader.results(variables), {name: values[0] for name, values in history.items()})


@pytest.mark.slow  # the default run's 25-minute budget: test_one_worker_epoch_metrics_equal_keras_fit and tests/unit/test_metric_sums.py run its kind
def test_two_workers_merge_exactly_as_keras_metrics_over_both_halves(binary):
    x, y, spec, compile_spec, reader = binary
    start = ModelState(spec.weight_arrays(), None)
    halves = (slice(0, 40), slice(40, ROWS))  # unequal: 5 and 3 steps
    sums, per_worker = MetricSums(), []
    for rows in halves:
        replica = Replica(spec, compile_spec, seed=0)
        replica.set_state(start)
        variables = replica.train(x[rows], y[rows], BATCH)
        sums.add(variables)
        per_worker.append(reader.results(variables))
    got = reader.results(sums.total())

    # The same steps in plain Keras, feeding each step's training-mode predictions to fresh metric objects.
    loss, accuracy, auc = keras.metrics.Mean(), keras.metrics.BinaryAccuracy(), keras.metrics.AUC()
    for rows in halves:
        plain = compile_spec.compile(spec.build())
        xs, ys = x[rows], y[rows]
        for s in range(0, len(xs), BATCH):
            xb, yb = xs[s : s + BATCH], ys[s : s + BATCH]
            pred = plain(xb, training=True)
            loss.update_state(keras.losses.BinaryCrossentropy()(yb, pred), sample_weight=len(xb))
            accuracy.update_state(yb, pred)
            auc.update_state(yb, pred)
            plain.train_on_batch(xb, yb)
    want = {"accuracy": float(accuracy.result()), "auc": float(auc.result()), "loss": float(loss.result())}
    _assert_close(got, want)
    # Not an average of the workers' values: AUC does not decompose that way.
    mean_auc = np.mean([w["auc"] for w in per_worker])
    row_weighted_auc = (40 * per_worker[0]["auc"] + 24 * per_worker[1]["auc"]) / ROWS
    assert abs(mean_auc - want["auc"]) > 1e-3 and abs(row_weighted_auc - want["auc"]) > 1e-3


@pytest.mark.slow  # the default run's 25-minute budget: tests/keras/test_spec.py::test_replica_rounds_equal_plain_keras_fit runs its kind
def test_two_rounds_per_epoch_over_two_epochs_equal_keras_fit_history(binary):
    x, y, spec, compile_spec, reader = binary
    replica = Replica(spec, compile_spec, seed=0)
    state = ModelState(spec.weight_arrays(), None)
    history = {}
    for epoch in range(2):
        sums = MetricSums()
        for rows in (slice(0, 32), slice(32, ROWS)):
            replica.set_state(state)
            sums.add(replica.train(x[rows], y[rows], BATCH))
            state = replica.get_state()
        for name, value in reader.results(sums.total()).items():
            history.setdefault(name, []).append(value)
    want, weights = _plain_fit(spec, compile_spec, x, y, epochs=2)
    assert list(history) == list(want)
    for name in want:
        np.testing.assert_allclose(history[name], want[name], atol=1e-6, err_msg=name)
    assert history["loss"][1] < history["loss"][0]
    for got, plain in zip(state.weights, weights, strict=True):
        np.testing.assert_allclose(got, plain, atol=1e-6)


def test_reader_and_replica_refuse_what_they_cannot_read(binary):
    x, y, spec, compile_spec, reader = binary
    with pytest.raises(CodecError, match=r"must match the model's 8 \(loss/total, .*Received: 2 arrays"):
        reader.results([np.zeros(()), np.zeros(())])
    bad = [np.zeros(()) for _ in range(4)] + [np.zeros((100,)) for _ in range(4)]
    with pytest.raises(CodecError, match=r"must have shape \(200,\)\. Received: shape \(100,\)"):
        reader.results(bad)
    with pytest.raises(SchemaError, match=r"at least one row\. Received: x of shape \(0, 4\)"):
        Replica(spec, compile_spec, seed=0).train(x[:0], y[:0], BATCH)


# ---- Dropout randomness ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dropout():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 16)).astype(np.float32)
    y = rng.normal(size=(32,)).astype(np.float32)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dropout(0.5), keras.layers.Dense(1)])
    spec = ModelSpec.from_model(model)
    return x, y, spec, CompileSpec.create("sgd", "mse", None)


def _round(replica, spec, x, y, seed, epoch, round_in_epoch, partition):
    replica.set_state(ModelState(spec.weight_arrays(), None))
    replica.seed_round(seed, epoch, round_in_epoch, partition)
    replica.train(x, y, BATCH)
    return replica.get_state().weights


def test_dropout_masks_differ_by_partition_and_round_and_repeat_under_retry(dropout):
    x, y, spec, compile_spec = dropout
    first = Replica(spec, compile_spec, seed=0)
    assert [v.path.split("/")[-1] for v in first.seed_states] == ["seed_generator_state"]
    p0 = _round(first, spec, x, y, -5, 0, 0, 0)
    other = Replica(spec, compile_spec, seed=0)
    p1 = _round(other, spec, x, y, -5, 0, 0, 1)
    assert not np.array_equal(p0[0], p1[0])  # workers draw different masks
    # A retry elsewhere: a fresh replica built under another seed, and a used one whose generator advanced.
    retry = Replica(spec, compile_spec, seed=99)
    for replica in (retry, other):
        again = _round(replica, spec, x, y, -5, 0, 0, 0)
        for a, b in zip(again, p0, strict=True):
            np.testing.assert_array_equal(a, b)
    round_2 = _round(first, spec, x, y, -5, 0, 1, 0)
    epoch_2 = _round(first, spec, x, y, -5, 1, 0, 0)
    assert not np.array_equal(round_2[0], p0[0]) and not np.array_equal(epoch_2[0], p0[0])
    assert not np.array_equal(round_2[0], epoch_2[0])
    with pytest.raises(ConfigError, match=r"non-negative .*Received: \{'partition': -1\}"):
        first.seed_round(0, 0, 0, -1)


def test_seed_round_draws_keras_dropout_masks(dropout):
    """The seeded round equals plain Keras stepping with the same seed state: masks come from the generator only."""
    x, y, spec, compile_spec = dropout
    replica = Replica(spec, compile_spec, seed=0)
    weights = _round(replica, spec, x, y, 3, 2, 1, 0)
    seed_state = replica.seed_states[0].numpy()  # after 4 steps: the seeded value + (0, 4)
    plain = compile_spec.compile(spec.build())
    plain.layers[0].seed_generator.state.assign(seed_state - np.array([0, 4], dtype=seed_state.dtype))
    plain.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(weights, plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert not np.allclose(weights[0], spec.weight_arrays()[0])


def test_sequence_batches_are_cut_to_their_longest_row():
    from sparkdl.keras.replica import trim_padding

    batch = np.zeros((2, 5, 2), np.float32)
    batch[0, :2], batch[1, :3] = 1.0, 2.0
    assert trim_padding(batch).shape == (2, 3, 2)
    np.testing.assert_array_equal(trim_padding(batch), batch[:, :3])
    assert trim_padding(np.zeros((2, 4, 1), np.float32)).shape == (2, 1, 1)  # all padding: one step kept


@pytest.mark.slow  # the default run's 25-minute budget: tests/spark/test_data_inputs.py::test_c06_sequences_are_padded_to_the_longest_row runs its kind
def test_sequence_input_trained_per_batch_equals_plain_keras_on_batches_padded_alone():
    """Rows padded to the longest row of the data, trained with batch size 1, equal plain Keras fed
    each row unpadded (Masking makes padding irrelevant; the replica cuts each batch to its rows)."""
    rng = np.random.default_rng(2)
    seqs = [rng.uniform(0.1, 1.0, size=(n, 2)).astype(np.float32) for n in (1, 4, 2)]
    y = np.array([0.5, -1.0, 2.0], np.float32)

    def build():
        keras.utils.set_random_seed(7)
        return keras.Sequential([keras.Input((None, 2)), keras.layers.Masking(), keras.layers.SimpleRNN(2), keras.layers.Dense(1)])

    spec, compile_spec = ModelSpec.from_model(build()), CompileSpec.create(keras.optimizers.SGD(0.1), "mse", None)
    replica = Replica(spec, compile_spec, seed=0)
    replica.set_state(ModelState(spec.weight_arrays(), None))
    padded = np.zeros((3, 4, 2), np.float32)
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
    replica.train(padded, y, batch_size=1)
    plain = compile_spec.compile(build())
    for s, target in zip(seqs, y, strict=True):
        plain.train_on_batch(s[None], target[None])
    for a, b in zip(replica.get_state().weights, plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_warm_step_traces_without_changing_what_a_replica_trains(binary):
    """A replica whose train step was traced on zeros (the workers' warm-up) trains the next round
    bit-equal to a fresh one: weights, optimizer state and metric sums; its optimizer state is back
    at build time."""
    x, y, spec, compile_spec, reader = binary
    fresh = Replica(spec, compile_spec, seed=0)
    warmed = Replica(spec, compile_spec, seed=0)
    assert reader.row_specs == ([((4,), "float32")], [((), "float32")], False)
    warmed.warm_step(reader.row_specs, BATCH)
    assert warmed.model.train_function is not None and fresh.model.train_function is None  # traced by the warm-up
    assert all(np.array_equal(a, b) for a, b in zip(warmed.get_state().optimizer, fresh.initial_optimizer, strict=True))
    start = ModelState(spec.weight_arrays(), None)
    results = []
    for replica in (fresh, warmed):
        replica.set_state(start)
        replica.seed_round(0, 0, 0, 0)
        results.append((replica.train(x, y, BATCH), replica.get_state()))
    (metrics_a, state_a), (metrics_b, state_b) = results
    assert all(np.array_equal(a, b) for a, b in zip(metrics_a, metrics_b, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(state_a.weights, state_b.weights, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(state_a.optimizer, state_b.optimizer, strict=True))
    assert not np.array_equal(state_b.weights[0], start.weights[0])  # it trained

