#!/usr/bin/env bash
# A GPU discovery script for tests on machines without GPUs (spark.worker.resource.gpu.discoveryScript,
# spark.executor.resource.gpu.discoveryScript): prints Spark's resource JSON for two fake GPUs, "0" and "1".
# With SPARKDL_FAKE_GPU_DIR set (a folder), each call claims one address not claimed before in that folder,
# so the workers of local-cluster[2,1,1024], which run this script in one JVM, get different GPUs, as two
# machines with one GPU each would; it fails once both are claimed.
set -eu
if [ -n "${SPARKDL_FAKE_GPU_DIR:-}" ]; then
  for address in 0 1; do
    if mkdir "$SPARKDL_FAKE_GPU_DIR/gpu$address" 2>/dev/null; then
      echo "{\"name\": \"gpu\", \"addresses\": [\"$address\"]}"
      exit 0
    fi
  done
  echo "fake_gpus.sh: both fake GPUs are already claimed in $SPARKDL_FAKE_GPU_DIR" >&2
  exit 1
fi
echo '{"name": "gpu", "addresses": ["0", "1"]}'
