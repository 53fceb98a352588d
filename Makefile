# sparkdl: two commands on a fresh clone (Python 3.11 and Java 17 needed):
#   make train   create .venv, install, train conf/mnist_cnn.yaml on local[*]
#   make test    create .venv, install, run the default test suite, then the `backends` subset under JAX
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
CONFIG ?= conf/mnist_cnn.yaml

export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)
export KERAS_BACKEND := tensorflow
export TF_CPP_MIN_LOG_LEVEL := 2
export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: install train test test-jax test-torch test-all test-min bench docs clean

$(VENV)/.installed: setup.cfg pyproject.toml
	@scripts/check_java.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[cpu,test,jax,plot,docs]'
	touch $@

install: $(VENV)/.installed

train: install
	$(VENV)/bin/spark-submit --master 'local[*]' \
	  --driver-java-options '-Dlog4j2.configurationFile=conf/log4j2.properties' \
	  jobs/train.py --config $(CONFIG)

test: install
	$(PY) -m pytest
	$(MAKE) test-jax

# The core tests (`backends` marker: fit equal to plain Keras, ps, transform, save/load, the backend's
# selection on the executors) on the other Keras 3 backends: the driver's KERAS_BACKEND is the executors'.
# `make test` runs those of the default run; `make test-all` the slow ones too.
BACKENDS_MARK ?= backends and not slow
test-jax: install
	KERAS_BACKEND=jax $(PY) -m pytest -m '$(BACKENDS_MARK)'

# torch's CPU wheels (its own index); where that index cannot be reached, the default index's wheel.
test-torch: install
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install --quiet --retries 0 --timeout 20 torch --index-url https://download.pytorch.org/whl/cpu \
	  || $(PY) -m pip install --quiet torch
	KERAS_BACKEND=torch $(PY) -m pytest -m '$(BACKENDS_MARK)'

test-all: install
	$(PY) -m pytest -m ''
	$(MAKE) test-jax BACKENDS_MARK=backends
	$(MAKE) test-torch BACKENDS_MARK=backends
	$(MAKE) test-min

# The core tests (tests/unit, tests/keras), plus the Spark tests that exercise version-sensitive
# pyspark APIs (job tags, InheritableThread, VectorUDT from mapInArrow, Hadoop-FS persistence, the private
# attributes of sparkdl/spark/internals.py), on the lowest versions setup.cfg allows, pinned in constraints-min.txt, in a separate venv.
MIN_SPARK_TESTS := tests/spark/test_jobs.py tests/spark/test_partitioning.py tests/spark/test_outputs.py \
  tests/spark/test_fit.py tests/spark/test_persistence.py tests/spark/test_internals.py
MIN_SPARK_SELECT := cancel or killed or repeats or spread or c6 or one_worker or hadoop or internals or run_on_partitions
VENV_MIN ?= .venv-min
PY_MIN := $(abspath $(VENV_MIN))/bin/python

$(VENV_MIN)/.installed: setup.cfg pyproject.toml constraints-min.txt
	@scripts/check_java.sh
	$(PYTHON) -m venv $(VENV_MIN)
	$(PY_MIN) -m pip install --quiet --upgrade pip
	$(PY_MIN) -m pip install --quiet -c constraints-min.txt -e '.[cpu,test]'
	touch $@

test-min: $(VENV_MIN)/.installed
	PYSPARK_PYTHON=$(PY_MIN) PYSPARK_DRIVER_PYTHON=$(PY_MIN) $(PY_MIN) -m pytest tests/unit tests/keras
	PYSPARK_PYTHON=$(PY_MIN) PYSPARK_DRIVER_PYTHON=$(PY_MIN) $(PY_MIN) -m pytest $(MIN_SPARK_TESTS) -k '$(MIN_SPARK_SELECT)'

bench: install
	$(PY) benchmarks/fit_throughput.py

# the documentation site into site/ (`$(PY) -m mkdocs serve` to browse it while editing)
docs: install
	KERAS_BACKEND=numpy $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .venv-min runs .pytest_cache spark-warehouse site
