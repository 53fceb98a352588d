"""A model state cut into N contiguous slices, one per worker: the layout of backend ``sharded``.

The state's arrays are read as two flat vectors, the weights (every ``model.weights`` array, C
order, one after the other) and the optimizer state (every ``optimizer.variables`` array); each
vector is cut into N contiguous ranges of nearly equal element counts, and owner j holds range j
of each (BigDL's ``AllReduceParameter``: each task owns ``1/N`` of the flattened parameters).
A range that crosses arrays is several :class:`SlicePiece` s, one per array it touches, so an
owner's slice is a :class:`~sparkdl.core.state.ModelState` whose arrays are 1-D pieces: the
mode policies, which are elementwise (:mod:`sparkdl.core.modes`), run on a slice exactly as they
run on a whole state, with their per-array settings (BMUF's ``trainable``) given per piece
(:meth:`SliceLayout.per_piece`). Integer arrays (an optimizer's iteration counter) are pieces
like any other.

Pure numpy: no Spark, no Keras, no network.

Reference: Dai et al., "BigDL: A Distributed Deep Learning Framework for Big Data", SoCC 2019
(section 4: the parameter synchronization as a reduce-scatter and an all-gather of slices).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sparkdl.core.state import ModelState
from sparkdl.errors import InvariantError

WEIGHTS, OPTIMIZER = 0, 1


@dataclass(frozen=True)
class SlicePiece:
    """Elements ``[start, stop)`` (C order) of array ``array`` of group ``group`` (0 weights, 1 optimizer)."""

    group: int
    array: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def _ranges(sizes: Sequence[int], owners: int) -> list[list[SlicePiece]]:
    """Per owner, the pieces of its range of the flat vector made of arrays of ``sizes`` elements."""
    total = int(sum(sizes))
    bounds = [total * j // owners for j in range(owners + 1)]
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    out: list[list[SlicePiece]] = []
    for j in range(owners):
        lo, hi = bounds[j], bounds[j + 1]
        pieces = []
        for i, size in enumerate(sizes):
            a0, a1 = int(starts[i]), int(starts[i]) + int(size)
            s, e = max(lo, a0), min(hi, a1)
            if e > s:
                pieces.append((i, s - a0, e - a0))
        out.append(pieces)
    return out


class SliceLayout:
    """Where each element of a model state lives: N owners, each a contiguous range of the
    weights and of the optimizer state (see the module docstring).

    Args:
        weights: ``(shape, dtype)`` of each weight array, in model order.
        optimizer: ``(shape, dtype)`` of each optimizer array, or None when the slices hold no
            optimizer state (workers keep their own: ``keepLocalOptimizer``).
        owners: N >= 1.

    Raises:
        ValueError: ``owners`` < 1.
    """

    def __init__(self, weights: Sequence[tuple], optimizer: Sequence[tuple] | None, owners: int) -> None:
        if owners < 1:
            raise ValueError(f"owners must be >= 1. Received: {owners}")
        self.owners = int(owners)
        self.shapes = [[tuple(int(d) for d in s) for s, _ in weights], None if optimizer is None else [tuple(int(d) for d in s) for s, _ in optimizer]]
        self.dtypes = [[np.dtype(d) for _, d in weights], None if optimizer is None else [np.dtype(d) for _, d in optimizer]]
        self._pieces: list[list[SlicePiece]] = [[] for _ in range(self.owners)]
        for group in (WEIGHTS, OPTIMIZER):
            if self.shapes[group] is None:
                continue
            sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes[group]]
            for j, ranges in enumerate(_ranges(sizes, self.owners)):
                self._pieces[j].extend(SlicePiece(group, i, s, e) for i, s, e in ranges)

    @classmethod
    def of(cls, state: ModelState, owners: int) -> SliceLayout:
        """The layout of ``state``'s arrays (its optimizer state sliced when it has one)."""
        weights = [(np.shape(a), np.asarray(a).dtype) for a in state.weights]
        optimizer = None if state.optimizer is None else [(np.shape(a), np.asarray(a).dtype) for a in state.optimizer]
        return cls(weights, optimizer, owners)

    @property
    def has_optimizer(self) -> bool:
        return self.shapes[OPTIMIZER] is not None

    def pieces(self, owner: int) -> list[SlicePiece]:
        """Owner ``owner``'s pieces: its weight pieces in array order, then its optimizer pieces."""
        return list(self._pieces[owner])

    def counts(self, owner: int) -> tuple[int, int]:
        """How many weight pieces and optimizer pieces ``owner`` holds."""
        pieces = self._pieces[owner]
        return sum(p.group == WEIGHTS for p in pieces), sum(p.group == OPTIMIZER for p in pieces)

    def nbytes(self, owner: int | None = None) -> int:
        """Bytes of ``owner``'s slice (None: of the whole state)."""
        owners = range(self.owners) if owner is None else [owner]
        return sum(p.size * self.dtypes[p.group][p.array].itemsize for j in owners for p in self._pieces[j])

    def take(self, state: ModelState, owner: int) -> ModelState:
        """Owner ``owner``'s slice of ``state``: 1-D views (copies where an array is not
        C-contiguous) of its pieces, weights then optimizer (None when the layout holds none).

        Raises:
            InvariantError: ``state``'s arrays do not match the layout.
        """
        self._check(state)
        groups: list[list[np.ndarray]] = [[], []]
        sources = [state.weights, state.optimizer]
        for p in self._pieces[owner]:
            flat = np.ascontiguousarray(sources[p.group][p.array]).reshape(-1)
            groups[p.group].append(flat[p.start:p.stop])
        return ModelState(groups[WEIGHTS], groups[OPTIMIZER] if self.has_optimizer else None)

    def split(self, state: ModelState) -> list[ModelState]:
        """Every owner's slice of ``state`` (views), in owner order."""
        return [self.take(state, j) for j in range(self.owners)]

    def empty(self) -> ModelState:
        """Whole arrays of the layout's shapes and dtypes, to :meth:`put` slices into (uninitialized)."""
        weights = [np.empty(s, d) for s, d in zip(self.shapes[WEIGHTS], self.dtypes[WEIGHTS], strict=True)]
        optimizer = None
        if self.has_optimizer:
            optimizer = [np.empty(s, d) for s, d in zip(self.shapes[OPTIMIZER], self.dtypes[OPTIMIZER], strict=True)]
        return ModelState(weights, optimizer)

    def put(self, whole: ModelState, owner: int, part: ModelState) -> None:
        """Write owner ``owner``'s slice ``part`` into the arrays of ``whole`` (made by :meth:`empty`).

        Raises:
            InvariantError: ``part`` does not hold ``owner``'s pieces (count, size or dtype).
        """
        self.check_slice(part, owner)
        targets = [whole.weights, whole.optimizer]
        values = {WEIGHTS: iter(part.weights), OPTIMIZER: iter(part.optimizer or [])}
        for p in self._pieces[owner]:
            target = targets[p.group][p.array]
            flat = target.reshape(-1)  # a view: `empty` made C-contiguous arrays
            flat[p.start:p.stop] = next(values[p.group])

    def views(self, whole: ModelState, owner: int, groups: tuple[int, ...] = (WEIGHTS, OPTIMIZER)) -> list[np.ndarray]:
        """1-D views into ``whole`` (C-contiguous arrays, e.g. from :meth:`empty`) where owner
        ``owner``'s pieces of ``groups`` go, weights then optimizer."""
        targets = [whole.weights, whole.optimizer]
        return [targets[p.group][p.array].reshape(-1)[p.start:p.stop] for p in self._pieces[owner] if p.group in groups]

    def put_weights(self, weights: Sequence[np.ndarray], owner: int, pieces: Sequence[np.ndarray]) -> None:
        """Write owner ``owner``'s weight pieces into the whole ``weights`` arrays (a weights-only read).

        Raises:
            InvariantError: ``pieces`` are not ``owner``'s weight pieces.
        """
        mine = [p for p in self._pieces[owner] if p.group == WEIGHTS]
        if len(mine) != len(pieces) or any(np.size(a) != p.size for p, a in zip(mine, pieces, strict=False)):
            raise InvariantError(f"slice {owner} must hold {len(mine)} weight pieces of sizes {[p.size for p in mine][:6]}. "
                                 f"Received: {len(pieces)} pieces")
        for p, piece in zip(mine, pieces, strict=True):
            weights[p.array].reshape(-1)[p.start:p.stop] = piece

    def assemble(self, parts: Sequence[ModelState]) -> ModelState:
        """The whole state from every owner's slice (one new copy)."""
        if len(parts) != self.owners:
            raise InvariantError(f"a state is assembled from one slice per owner. Received: {len(parts)} slices for {self.owners} owners")
        whole = self.empty()
        for j, part in enumerate(parts):
            self.put(whole, j, part)
        return whole

    def check_slice(self, part: ModelState, owner: int) -> None:
        """Raise :class:`InvariantError` unless ``part`` holds exactly ``owner``'s pieces."""
        n_w, n_o = self.counts(owner)
        got_o = len(part.optimizer) if part.optimizer is not None else 0
        if len(part.weights) != n_w or got_o != n_o:
            raise InvariantError(f"slice {owner} must hold {n_w} weight and {n_o} optimizer pieces. "
                                 f"Received: {len(part.weights)} and {got_o}")
        values = {WEIGHTS: iter(part.weights), OPTIMIZER: iter(part.optimizer or [])}
        for p in self._pieces[owner]:
            array = np.asarray(next(values[p.group]))
            dtype = self.dtypes[p.group][p.array]
            if array.size != p.size or array.dtype != dtype:
                raise InvariantError(f"slice {owner}'s piece {p} must hold {p.size} values of {dtype}. "
                                     f"Received: {array.size} values of {array.dtype}")

    def per_piece(self, values: Sequence, owner: int, group: int = WEIGHTS) -> list:
        """A per-array setting (one value per array of ``group``) as one value per piece of ``owner``."""
        return [values[p.array] for p in self._pieces[owner] if p.group == group]

    def names(self, names: Sequence[str], owner: int) -> list[str]:
        """Names of ``owner``'s weight pieces: ``"dense/kernel[0:512]"``."""
        return [f"{names[p.array]}[{p.start}:{p.stop}]" for p in self._pieces[owner] if p.group == WEIGHTS]

    def _check(self, state: ModelState) -> None:
        for group, arrays in ((WEIGHTS, state.weights), (OPTIMIZER, state.optimizer)):
            shapes = self.shapes[group]
            if shapes is None:
                continue
            got = [tuple(np.shape(a)) for a in (arrays or [])]
            if got != shapes:
                raise InvariantError(f"a state must match its slice layout. Received: {'weight' if group == WEIGHTS else 'optimizer'} "
                                     f"shapes {got[:4]}... for {shapes[:4]}...")

    def to_json(self) -> dict:
        """The layout as JSON (a sharded checkpoint's manifest)."""
        def group(g):
            if self.shapes[g] is None:
                return None
            return [[list(s), d.str] for s, d in zip(self.shapes[g], self.dtypes[g], strict=True)]
        return {"owners": self.owners, "weights": group(WEIGHTS), "optimizer": group(OPTIMIZER)}

    @classmethod
    def from_json(cls, obj: dict) -> SliceLayout:
        """The inverse of :meth:`to_json`."""
        weights = [(tuple(s), d) for s, d in obj["weights"]]
        optimizer = None if obj["optimizer"] is None else [(tuple(s), d) for s, d in obj["optimizer"]]
        return cls(weights, optimizer, int(obj["owners"]))


def mode_slice(layout: SliceLayout, mode: dict[str, list[np.ndarray]], owner: int) -> dict[str, list[np.ndarray]]:
    """Owner ``owner``'s slice of a mode state whose entries are aligned with the weights (BMUF's
    ``delta``, DiLoCo's ``momentum``: one array per weight array, any float dtype)."""
    out = {}
    for key, arrays in mode.items():
        out[key] = [np.ascontiguousarray(arrays[p.array]).reshape(-1)[p.start:p.stop]
                    for p in layout.pieces(owner) if p.group == WEIGHTS]
    return out


def assemble_mode(layout: SliceLayout, parts: Sequence[dict[str, list[np.ndarray]]]) -> dict[str, list[np.ndarray]]:
    """A weight-aligned mode state from every owner's slice of it (see :func:`mode_slice`)."""
    keys = sorted(set().union(*[set(p) for p in parts])) if parts else []
    out: dict[str, list[np.ndarray]] = {}
    for key in keys:
        arrays: list[np.ndarray | None] = [None] * len(layout.shapes[WEIGHTS])
        for j, part in enumerate(parts):
            values = iter(part.get(key, []))
            for p in layout.pieces(j):
                if p.group != WEIGHTS:
                    continue
                piece = np.asarray(next(values))
                if arrays[p.array] is None:
                    arrays[p.array] = np.empty(layout.shapes[WEIGHTS][p.array], piece.dtype)
                arrays[p.array].reshape(-1)[p.start:p.stop] = piece
        for i, a in enumerate(arrays):
            if a is None:  # a 0-element weight array: no owner holds a piece of it
                arrays[i] = np.empty(layout.shapes[WEIGHTS][i], np.float64)
        out[key] = arrays
    return out
