"""The round modes on backend ps (issue 9): bmuf, easgd and gossip, with fp16 and 1bit updates, equal
backend rounds on the same seed; the server routes each worker's start state (W + η·Δ, its own model)."""

import numpy as np
import pytest

from tests.spark.test_ps_backend import _estimator, _unequal_df


@pytest.mark.parametrize("mode,extra", [
    ("bmuf", {}),
    pytest.param("easgd", {"elasticForce": 0.3, "compression": "fp16"}, marks=pytest.mark.slow),  # the same routing as bmuf
    pytest.param("gossip", {"compression": "1bit"}, marks=pytest.mark.slow),
])
def test_round_modes_on_ps_equal_backend_rounds(spark, mode, extra):
    # 48 and 30 rows, batch 10, τ = 2: 3 rounds per epoch, partition 1 has no rows in the third
    df = _unequal_df(spark)
    common = dict(numWorkers=2, epochs=2, localSteps=2, shuffle=True, seed=7, mode=mode, **extra)
    rounds = _estimator(backend="rounds", **common).fit(df)
    ps = _estimator(backend="ps", **common).fit(df)
    assert ps.fitInfo["backend"] == "ps" and ps.fitInfo["mode"] == mode and ps.fitInfo["rounds"] == rounds.fitInfo["rounds"] == 6
    for got, want in zip(ps.getKerasModel().get_weights(), rounds.getKerasModel().get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(ps.history["loss"], rounds.history["loss"], rtol=1e-4)
    if "compression" in extra:
        assert ps.fitInfo["compression"] == extra["compression"]
        assert 0 < ps.fitInfo["update_bytes"] == sum(ps.fitInfo["update_bytes_per_epoch"])
