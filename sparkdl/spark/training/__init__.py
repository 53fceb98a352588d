"""A fit's training: the driver loop, the executors' tasks, and what they exchange.

- :mod:`~sparkdl.spark.training.loop`: the driver loop (epochs, rounds, callbacks, invariants);
- :mod:`~sparkdl.spark.training.job`: the fit's plain values shared by the loop and transports;
- :mod:`~sparkdl.spark.training.tasks`: executor code of backend ``rounds`` (train a round,
  evaluate a partition); :mod:`~sparkdl.spark.backends.ps.task`: executor code of backend ``ps``;
- :mod:`~sparkdl.spark.backends.rounds.results`: the rows a round's tasks return;
  :mod:`~sparkdl.spark.backends.rounds.reduce`: their combination on the executors;
- :mod:`~sparkdl.spark.training.validation`: validation between epochs;
- :mod:`~sparkdl.spark.training.checkpoint`: snapshots of the fit's state and resuming;
- :mod:`~sparkdl.spark.training.worker_state`: what a worker keeps of its own between rounds;
- :mod:`~sparkdl.spark.training.faults`: fault-injection hooks for tests and the chaos benchmark.
"""
