"""Model states cut into pieces, averaged piece by piece and assembled (sparkdl.core.pieces), and
where a round's updates are combined (C27: limits checked before any job)."""

import numpy as np
import pytest

from sparkdl.core.pieces import PieceMean, assemble, split_state
from sparkdl.core.state import ModelState
from sparkdl.errors import ConfigError
from sparkdl.spark.backends.rounds.reduce import plan_reduction


def test_c27_a_state_over_2_gib_travels_in_pieces_without_touching_its_memory():
    huge = np.zeros(600_000_000, np.float32)  # 2.4 GB of untouched (lazily allocated) pages
    pieces = list(split_state(ModelState([huge, np.zeros((), np.float32)], [np.array(3, np.int64)])))
    assert max(p.values.nbytes for p in pieces) == 16 * 2**20
    assert len(pieces) == -(-huge.nbytes // (16 * 2**20)) + 2
    assert sum(p.values.nbytes for p in pieces[:-2]) == huge.nbytes
    assert [p.key for p in pieces[-2:]] == [(0, 1, 0), (1, 0, 0)]


def test_pieces_of_two_workers_average_by_rows_and_assemble():
    a = ModelState([np.arange(10, dtype=np.float32).reshape(2, 5), np.array(1.0, np.float32)], [np.array(4, np.int64)])
    b = ModelState([np.full((2, 5), 10.0, np.float32), np.array(3.0, np.float32)], [np.array(6, np.int64)])
    mean = PieceMean()
    for state, rows in ((a, 3), (b, 1)):
        for piece in split_state(state, max_piece_bytes=12):  # 3 floats a piece: the kernel in 4 pieces
            mean.add(piece, rows)
    out = assemble(piece for piece, _ in mean.results())
    np.testing.assert_allclose(out.weights[0], (3 * a.weights[0] + 10.0) / 4)
    assert out.weights[1] == pytest.approx(1.5) and out.weights[0].dtype == np.float32
    assert out.optimizer[0] == 4 and out.optimizer[0].dtype == np.int64  # rint(4.5) is 4: round half to even


def test_assemble_refuses_a_gap_or_an_overlap():
    pieces = list(split_state(ModelState([np.arange(6, dtype=np.float32)]), max_piece_bytes=8))
    with pytest.raises(ValueError, match="covered by its pieces exactly once"):
        assemble(pieces[:1] + pieces[2:])
    with pytest.raises(ValueError, match="covered by its pieces exactly once"):
        assemble(pieces + pieces[:1])


def test_plan_reduction_names_the_size_and_the_value_to_set():
    limit = 10 * 2**20  # spark.driver.maxResultSize=10m
    assert plan_reduction(limit, 4 * 2**20, 2) is False  # 8 MiB fit on the driver
    assert plan_reduction(limit, 4 * 2**20, 3) is True  # 12 MiB do not; one combined update does
    assert plan_reduction(0, 2**30, 2) is False  # 0: no limit
    with pytest.raises(ConfigError, match=r"\(11534336 bytes of weights.*spark.driver.maxResultSize \(10485760 bytes\).*=75m"):
        plan_reduction(limit, 11 * 2**20, 3)
