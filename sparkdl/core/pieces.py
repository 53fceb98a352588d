"""A model state cut into pieces of bounded size, and the row-weighted mean of many workers' pieces.

A worker's update (weights, then optimizer state) travels as rows of one Arrow table, one row per
piece: a contiguous slice of one array's C-order elements, at most ``max_piece_bytes`` bytes, so
no single value nears Arrow's and the JVM's 2 GiB limit whatever the model's size. The same
pieces from every worker are combined piece by piece (on the executors, or on the driver when the
round is small) into their row-weighted mean, W = Σᵢ nᵢ·Wᵢ / Σᵢ nᵢ (:class:`WeightedMean`), and
:func:`assemble` rebuilds the arrays. Pure numpy: no Spark, no Keras.

A piece is a :class:`Piece`: ``group`` (0 weights, 1 optimizer state), ``array`` (index in the
group), ``offset`` (first element, in elements), the whole array's ``shape`` and ``dtype``
(numpy ``dtype.str``, little-endian on every supported platform) and ``values`` (the slice's raw
bytes). Its ``key`` ``(group, array, offset)`` is the same in every worker of a fit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from sparkdl.core.aggregation import WeightedMean
from sparkdl.core.state import ModelState

WEIGHTS, OPTIMIZER = 0, 1
_FLOAT16 = np.dtype(np.float16).str
DEFAULT_PIECE_BYTES = 16 * 2**20


@dataclass(frozen=True)
class Piece:
    """One slice of one array of a model state; see the module docstring."""

    group: int
    array: int
    offset: int
    shape: tuple
    dtype: str
    values: bytes | memoryview

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.group, self.array, self.offset)

    def to_numpy(self) -> np.ndarray:
        """The slice's elements, shape ``(elements,)``, in the array's dtype (read-only view)."""
        return np.frombuffer(self.values, dtype=np.dtype(self.dtype))

    @property
    def shape_json(self) -> str:
        return json.dumps(list(self.shape))


def split_state(state: ModelState, max_piece_bytes: int = DEFAULT_PIECE_BYTES) -> Iterator[Piece]:
    """Cut ``state`` into pieces of at most ``max_piece_bytes`` bytes (at least one element each).

    Args:
        state: weights and optimizer state (``optimizer`` None sends no optimizer pieces).
        max_piece_bytes: upper bound of one piece's ``values`` (bytes, >= 1).

    Yields:
        Pieces in (group, array, offset) order; a 0-element array yields one empty piece, so
        every array is present. ``values`` are views of the arrays (no copy) when they are
        C-contiguous.

    Raises:
        ValueError: when ``max_piece_bytes`` < 1.
    """
    if max_piece_bytes < 1:
        raise ValueError(f"max_piece_bytes must be >= 1. Received: {max_piece_bytes}")
    groups = [(WEIGHTS, state.weights)] + ([(OPTIMIZER, state.optimizer)] if state.optimizer is not None else [])
    for group, arrays in groups:
        for index, array in enumerate(arrays):
            array = np.asarray(array, order="C")
            flat = array.reshape(-1)
            step = max(1, max_piece_bytes // max(1, array.dtype.itemsize))
            for offset in range(0, max(1, flat.size), step):
                chunk = flat[offset : offset + step]
                yield Piece(group, index, offset, tuple(array.shape), array.dtype.str, memoryview(chunk).cast("B"))


class PieceMean:
    """Streaming row-weighted mean of the same pieces from many workers.

    Call :meth:`add` with each worker's pieces and rows (pieces of one worker share its rows);
    :meth:`results` yields each piece's mean in its dtype (floats cast back, integers rounded to
    nearest, bools thresholded at 0.5, as :class:`~sparkdl.core.aggregation.WeightedMean`), except
    float16 pieces (compressed updates), whose mean is float32. A piece
    that one worker alone sent is passed through as it came (what the float64 mean would return
    too, without the arithmetic); from the second worker on, one float64 sum per piece is kept.

    Raises:
        ValueError: from :meth:`add`, when a piece's shape or dtype differs from the one first seen
            under its key, or rows < 0.
    """

    def __init__(self) -> None:
        self._first: dict[tuple, tuple[Piece, float]] = {}
        self._means: dict[tuple, WeightedMean] = {}

    def add(self, piece: Piece, rows: int) -> None:
        if rows < 0:
            raise ValueError(f"rows must be >= 0. Received: {rows}")
        if rows == 0:
            return
        key = piece.key
        if key not in self._first:
            self._first[key] = (piece, rows)
            return
        first, first_rows = self._first[key]
        if (first.shape, first.dtype) != (piece.shape, piece.dtype):
            raise ValueError(
                f"piece {key} must have shape {first.shape} and dtype {first.dtype} in every worker. "
                f"Received: shape {piece.shape}, dtype {piece.dtype}"
            )
        if key not in self._means:
            self._means[key] = WeightedMean()
            self._means[key].add([first.to_numpy()], first_rows)
        self._means[key].add([piece.to_numpy()], rows)

    def results(self) -> Iterator[tuple[Piece, float]]:
        """``(mean piece, total rows)`` for every key that received rows, in key order."""
        for key in sorted(self._first):
            first, rows = self._first.pop(key)
            mean = self._means.pop(key, None)
            if first.dtype == _FLOAT16:  # compressed updates: the mean is kept in float32, never summed in float16
                values = (first.to_numpy().astype(np.float32) if mean is None else mean.means()[0].astype(np.float32)).reshape(-1)
                yield Piece(first.group, first.array, first.offset, first.shape, values.dtype.str, memoryview(values).cast("B")), (
                    rows if mean is None else mean.total_weight)
            elif mean is None:
                yield first, rows
            else:
                values = mean.result()[0].reshape(-1)
                yield Piece(first.group, first.array, first.offset, first.shape, first.dtype, memoryview(values).cast("B")), mean.total_weight


def assemble(pieces: Iterable[Piece]) -> ModelState:
    """Rebuild the arrays of a state from all of its pieces (any order).

    Returns:
        ModelState with arrays of the pieces' shapes and dtypes; ``optimizer`` None when no
        optimizer piece came.

    Raises:
        ValueError: when an array's pieces do not cover its elements exactly once, or array
            indices of a group are not 0..k-1.
    """
    groups = assemble_groups(pieces)
    return ModelState(groups.get(WEIGHTS, []), groups.get(OPTIMIZER))


def assemble_groups(pieces: Iterable[Piece]) -> dict[int, list[np.ndarray]]:
    """Rebuild every group of arrays from its pieces (any order): group -> arrays in index order.

    Raises:
        ValueError: as :func:`assemble`.
    """
    flats: dict[tuple[int, int], tuple[np.ndarray, tuple, list[tuple[int, int]]]] = {}
    for piece in pieces:  # each piece copied into its array as it comes: pieces need not stay alive
        key = (piece.group, piece.array)
        if key not in flats:
            size = int(np.prod(piece.shape, dtype=np.int64))
            flats[key] = (np.empty(size, np.dtype(piece.dtype)), piece.shape, [])
        flat, shape, spans = flats[key]
        values = piece.to_numpy()
        if piece.shape != shape or values.dtype != flat.dtype or piece.offset + values.size > flat.size:
            raise ValueError(
                f"piece {piece.key} must lie inside array {piece.array} of shape {shape} and dtype {flat.dtype}. "
                f"Received: {values.size} {values.dtype} elements at {piece.offset} for shape {piece.shape}"
            )
        flat[piece.offset : piece.offset + values.size] = values
        spans.append((piece.offset, values.size))
    out: dict[int, list[np.ndarray]] = {}
    for group in sorted({g for g, _ in flats}):
        indices = sorted(i for g, i in flats if g == group)
        if indices != list(range(len(indices))):
            raise ValueError(f"group {group} must hold arrays 0..{len(indices) - 1}. Received: {indices}")
        rebuilt = []
        for index in indices:
            flat, shape, spans = flats.pop((group, index))
            position = 0
            for offset, size in sorted(spans):
                if offset != position:
                    raise ValueError(
                        f"array {index} of group {group} must be covered by its pieces exactly once. "
                        f"Received: a piece at element {offset} where {position} was expected"
                    )
                position += size
            if position != flat.size and not (flat.size == 0 and position == 0):
                raise ValueError(f"array {index} of group {group} must hold {flat.size} elements. Received: {position}")
            rebuilt.append(flat.reshape(shape))
        out[group] = rebuilt
    return out
