"""The Spark layer: the only package that imports pyspark (Params, data, backends, estimator, model, persistence)."""
