"""``KerasModel.evaluate``: the compiled loss and metrics over a DataFrame, computed on the executors.

The data path is the fit's validation path, reused: :func:`~sparkdl.spark.data.request_columns`
maps and checks the columns without a job; :func:`~sparkdl.spark.data.prepare_training_data`
casts them, caches them in the input's own partitions (no shuffle) and runs one check job
(nulls, NaN, lengths, label ranges, weights >= 0, rows per partition); then one job runs
:func:`sparkdl.spark.training.tasks.evaluate_partition` on every partition: ``test_on_batch``
over its rows in batches, returning the Keras metric variables (sums and counts) of its rows.
The driver adds them up (:class:`~sparkdl.core.metrics.MetricSums`) and reads them with the
metric objects Keras uses (:class:`~sparkdl.keras.metrics.MetricReader`), so each value is the
one over all rows, never a mean of per-partition means.

Keras' loss tracker weights each batch's loss by the batch's rows, and a built-in loss of a batch
is Σ w·l / rows (``sum_over_batch_size``), so ``loss`` is Σ w·l / N over all N rows whatever the
batch split: ``keras.Model.evaluate`` on the collected rows gives the same value up to float32
rounding. Streaming metrics (AUC's confusion buckets, Precision's counts, Mean-based metrics such as
accuracy and MAE) are sums too. A multi-output model's per-output losses (``<output>_loss``) are
Keras' means of batch means (its per-output trackers are not weighted by rows): they depend on how
rows fall into batches and partitions, in Keras too, and equal Keras' values only for the same batches.
A loss that divides a batch by something other than its rows (``ignore_class``, masks) depends on
the batch split as well, in Keras too.
"""

from __future__ import annotations

import uuid

from pyspark.sql import DataFrame

from sparkdl.errors import ConfigError, SchemaError


def evaluate(
    df: DataFrame,
    spec,
    compile_spec,
    features_col: str,
    features_cols,
    label_col: str,
    label_cols,
    weight_col: str | None,
    decoders: dict | None,
    batch_size: int,
    timeout_s: float | None = None,
    pad_value: float = 0.0,
) -> dict[str, float]:
    """The compiled loss and metrics of ``spec``'s weights over every row of ``df``.

    Args:
        df: the DataFrame to evaluate; each of its partitions is evaluated as it is (no shuffle).
        spec: the model (:class:`~sparkdl.keras.spec.ModelSpec`, weights included).
        compile_spec: its compile arguments (:class:`~sparkdl.keras.spec.CompileSpec`), loss required.
        features_col, features_cols, decoders: the model inputs' columns, as in ``fit``.
        label_col, label_cols: the label column(s), one per model output, as in ``fit``.
        weight_col: the sample-weight column (Keras' ``sample_weight``), or None.
        batch_size: rows per ``test_on_batch`` call (> 0).
        timeout_s: seconds the evaluation job may run before it is cancelled; None: no limit.
        pad_value: the value that pads sequence inputs' rows (``padValue``), each batch to its longest row.

    Returns:
        ``{name: value}`` with the keys and values of ``keras.Model.evaluate(..., return_dict=True)``,
        sorted by name, python floats: ``"loss"``, each compiled metric (``"accuracy"``, ``"auc"``,
        ``"mae"``), and for a model with several outputs each ``"<output>_loss"``.

    Raises:
        SchemaError: a missing or mistyped feature, label or weight column (before any job); nulls,
            NaN, wrong lengths, labels out of the loss's range or negative weights (the check job,
            before the evaluation job); no rows.
        ConfigError: a batch size that is not a positive integer, or a loss or metric that does not
            fit the model's outputs and these labels (before any job).
        WorkerError, RoundTimeoutError: the evaluation job failed or ran past ``timeout_s``.
    """
    from sparkdl.core.schedule import RoundPlan
    from sparkdl.keras.custom_objects import registered
    from sparkdl.keras.metrics import MetricReader
    from sparkdl.spark.training.tasks import TaskSpec
    from sparkdl.spark.training.validation import evaluation_job, summed_evaluation
    from sparkdl.spark.data import prepare_training_data, request_columns
    from sparkdl.spark.daemon import check_executors_python
    from sparkdl.spark.jobs import run_job
    from sparkdl.spark.partitions import task_budget
    from sparkdl.spark.session import check_inline

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"evaluate's batchSize must be a positive integer (rows per batch). Received: {batch_size!r}")
    output_names = [name for name, _ in spec.output_specs]
    compile_spec.check_outputs(output_names)
    loss = compile_spec.output_losses(output_names)  # one LossInfo per output
    request = request_columns(df, spec, loss, features_col, features_cols, label_col, label_cols, weight_col, None, decoders,
                              pad_value=pad_value)
    label_specs = request.label_specs(df, loss)  # (request_columns checked the label shapes the schema tells, as fit does)
    # The loss and metrics on one dummy row on the driver: compile arguments that cannot read these labels fail here.
    reader = MetricReader(
        spec, compile_spec, [s for _, s, _, _ in request.inputs], [d for _, _, d, _ in request.inputs],
        [s for s, _ in label_specs], [d for _, d in label_specs], weighted=request.weight is not None,
    )
    spark = df.sparkSession
    check_executors_python(spark)  # a local master's workers without sparkdl: said before any job
    check_inline(spark, len(spec.weights), "the model's weights to evaluate")  # Spark Connect: before any job
    evaluation_id = uuid.uuid4().hex
    tag = f"sparkdl-evaluate-{evaluation_id}"

    def check_job(action, description):
        return run_job(spark, action, description, tag, timeout_s)

    data = prepare_training_data(df, request, loss, 1, keep_partitioning=True, run_job=check_job, role="evaluation")
    try:
        if data.total_rows == 0:
            raise SchemaError(f"evaluate needs at least one row. Received: 0 rows in column {request.inputs[0][3][0]!r}")
        rows = data.partition_rows
        task = TaskSpec(
            fit_id=evaluation_id, spec=spec.architecture_only(), compile_spec=compile_spec, columns=data.columns,
            plan=RoundPlan(rows, batch_size), batch_size=batch_size, seed=0, shuffle=False, custom_objects=registered(),
            idle_s=3600.0, canonical_order=False, budget_bytes=task_budget(spark, None), validation=data.columns,
        )
        description = f"sparkdl evaluate {evaluation_id[:8]}: {data.total_rows} rows in {len(rows)} partitions"
        table = evaluation_job(spark, data, task, spec.weights, True, description, tag, timeout_s)
    finally:
        data.df.unpersist()
    return summed_evaluation(table, len(rows), data.total_rows, reader, "evaluate")
