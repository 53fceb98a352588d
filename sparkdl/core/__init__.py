"""Pure-numpy algorithms: aggregation, mode policies, round schedules, metric means.

Nothing under ``sparkdl.core`` imports Spark, TensorFlow or Keras.
"""
