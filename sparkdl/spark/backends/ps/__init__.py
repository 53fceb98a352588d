"""Backend ``ps``: its driver side (``driver.py``) and its executor side (``task.py``); see :mod:`sparkdl.spark.backends`."""
