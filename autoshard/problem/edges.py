"""Edge cost matrices: what every (producer strategy, consumer strategy) pair of an edge costs.

A plain edge charges the forward reshard from the producer's layout to the one the consumer
reads, plus in training the gradient's reshard back; a consumer that runs again when its block
is recomputed pays the forward reshard again. The edge from a parameter to its owner allows
only the owner strategies reading the parameter's use layout and charges its gathers and its
gradient's way back to the stored layout. Matrices are shared by identical edges (repeated layers).

Overlap (``BuildOptions.overlap``): FSDP2 and DDP run a parameter's gathers and its gradient's
reduction on a communication stream, prefetched under the neighbouring layer's compute. For an
owner ``o`` inside a repeated layer (the edges ``cost/overlap.py``'s rule hides), whose twin in the neighbouring layer runs the same
strategy ``j``, the edge charges only what the twin's compute cannot hide:

    cost(i, j) = max(0, F_ij - fwd_j) + max(0, B_ij - bwd_j)

with ``F`` the forward-pass gathers, ``B`` the backward-pass ones (re-gather, recompute gather)
plus the gradient's reduction, and ``fwd_j`` / ``bwd_j`` the owner's own forward and backward
compute under ``j`` (recompute included). Pairing each parameter with its own op's twin, not the
whole layer, never hides more than the layer could. Every other collective (activations, tensor
parallelism) is exposed: the step is the sum of compute and exposed communication.
With ``async_tp`` (``--async-tp``), an activation edge's reshard is charged what torch's
micro-pipelined collective leaves exposed where its inductor pass fuses it with a product
(``cost/async_tp.py`` ``fused_exposed``, ``EdgePrices.async_matrices``), else in full. Under
tensorwise Float8, a converted linear's input and its output's gradient are resharded in float8
where no partial sum moves (``cost/float8.activation_itemsize``).

Where the model charges compute and FSDP2 runs the parameters (``fsdp2``: with overlap, every
parameter, the embedding and head outside the repeated layers included), FSDP2's own copies on
the compute stream are added to every owner edge, never hidden
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): each
gather's copy-out (``split_with_sizes_copy`` from the all-gather buffer into the parameter: the
gathered bytes read and written) and the gradient's copy-in before its reduction (``chunk_cat``
of the gradient into the reduction buffer, cast to the reduction dtype: read at the compute
dtype, written at the gradient's), all at the device's streaming bandwidth; a parameter gathered
along a dimension other than 0 is copied once more each way (``torch.cat`` between its chunks
and its layout, at the compute dtype). Parameters gather at
their compute dtype (a tensorwise Float8 linear's weight in float8, ``cost/float8.py``) and
gradients reduce at the precision's gradient dtype (``cost/memory.py``).

Kept gathered (``kept_over`` = ``m`` > 0: a pipeline stage whose ``m`` microbatches share one
gather, as FSDP2's ``reshard_after_forward=False`` under torch.distributed.pipelining): the
problem's objective is the stage's time per microbatch, so the owner edge charges the step's
one gather, hidden under the first microbatch's compute as above, and its one gradient reduction,
after the stage's last backward and so exposed, with their copies, each divided by ``m``:

    cost(i, j) = ceil((max(0, F_ij - fwd_j) + R_ij + copies_ij) / m)

with no re-gather (the use copy is kept, recomputation reads it) and no hiding of ``R``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import lru_cache

import numpy as np

from autoshard.cost.communication import CostModel
from autoshard.cost.async_tp import fused_exposed, fuses
from autoshard.cost.float8 import activation_itemsize, compute_dtype, gather_itemsize
from autoshard.cost.memory import local_bytes, param_precision
from autoshard.frontend.graph import OpGraph, TensorMeta
from autoshard.problem.candidates import Candidate
from autoshard.sharding.mesh import Mesh
from autoshard.sharding.reshard import ALL_GATHER, REDUCE_SCATTER, Step, reshard_steps, reshard_traffic
from autoshard.sharding.spec import TensorSpec
from autoshard.solver.model.problem import FORBIDDEN


@lru_cache(maxsize=1 << 15)
def recent_steps(src: TensorSpec, dst: TensorSpec, shape: tuple[int, ...], itemsize: int,
                 mesh_shape: tuple[int, ...]) -> tuple[Step, ...]:
    """``reshard_steps``, remembered for the last 32,768 distinct calls: identical edges' copies
    (``reshard_copies.py``) and fused collectives (``async_matrices``) read the steps of the same pairs."""
    return reshard_steps(src, dst, shape, itemsize, mesh_shape)


_PRICES: dict[str, dict[tuple, int]] = {}
"""Reshard prices per cost model (its ``repr``: kind, mesh, links, device), shared by every problem
built in the process (pipeline stages, budgeted and free): a price depends on nothing else."""


class EdgePrices:
    """Cost matrices of edges, shared across identical edges (repeated layers); ``async_tp``: an
    activation edge's collective fused with a product leaves only what torch's pipeline exposes
    (``async_matrices``)."""

    async_tp: bool = False

    def __init__(self, mesh: Mesh, cost_model: CostModel, precision: str = "as-is", fsdp2: bool = False,
                 kept_over: int = 0) -> None:
        self.mesh, self.cost_model, self.precision, self.fsdp2 = mesh, cost_model, precision, fsdp2
        self.kept_over = kept_over
        self.reshards = _PRICES.setdefault(repr(cost_model), {})
        self.matrices: dict[tuple, np.ndarray] = {}
        self.grids: dict[tuple, tuple[np.ndarray, list, list]] = {}

    def reshard(self, src: TensorSpec, dst: TensorSpec, meta: TensorMeta) -> int:
        """Price of turning ``src`` into ``dst`` for a tensor of ``meta``."""
        key = (src, dst, meta.shape, meta.itemsize)
        if key not in self.reshards:
            traffic = reshard_traffic(src, dst, meta.shape, meta.itemsize, self.mesh.shape)
            self.reshards[key] = self.cost_model.ticks(self.cost_model.traffic_cost(traffic, meta.shape))
        return self.reshards[key]

    def matrix(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta, backward: bool,
               owner: bool, same_block: bool, overlap: bool = False, sole_reader: bool = True) -> np.ndarray:
        """Cost of every (producer strategy, consumer strategy) pair on one edge. A consumer that
        runs again when its block is recomputed pays the forward reshard again; inside one block, or from a
        parameter to its owner, both ends must make the same recompute choice. ``overlap``: a
        parameter's traffic to its owner hides under the owner's compute (module doc).
        ``sole_reader``: this edge is the only one reading ``src``'s output (``reader_counts``)."""
        key = (id(src.strategies), id(dst.strategies), id(dst.costs), id(dst.reruns), operand, meta, backward, owner,
               same_block, overlap)  # identical nodes share these lists; a kept one's costs and reruns differ
        if self.async_tp:  # what async_matrices reads besides: the ends' ops, their flops and compute dtypes
            key += (_fusing(src), _fusing(dst), sole_reader)
        if key not in self.matrices:
            if owner:
                matrix = self._owner(src, dst, operand, meta, backward, overlap)
            else:
                matrix = self._plain(src, dst, operand, meta, backward, sole_reader)
                if dst.reruns is not None:
                    again = self._plain(src, dst, operand, meta, False, sole_reader)
                    matrix = np.where(np.asarray(dst.reruns)[None, :], np.minimum(matrix + again, FORBIDDEN),
                                      matrix)
            if dst.recompute is not None and (same_block or owner) and src.recompute is not None:
                differ = np.asarray(src.recompute)[:, None] != np.asarray(dst.recompute)[None, :]
                matrix = np.where(differ, FORBIDDEN, matrix)
            matrix.flags.writeable = False  # shared by every identical edge: nobody may edit it in place
            self.matrices[key] = matrix
        return self.matrices[key]

    def _plain(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta, backward: bool,
               sole_reader: bool) -> np.ndarray:
        if self.async_tp:
            forward, back = self.async_matrices(src, dst, operand, meta, backward, sole_reader)
        else:
            forward, back = self.reshard_matrices(src, dst, operand, meta, backward)
        return forward + back

    def async_matrices(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta,
                       backward: bool, sole_reader: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """``reshard_matrices`` as torch's micro-pipelined TP runs them (``cost/async_tp.py``): per
        pair (i, j), with ``F``/``B`` the blocking forward/backward reshards and ``E(T, kind, p)``
        the ``fused_exposed`` ticks of a reshard priced ``T`` fused as a collective of ``kind`` with
        the (flops, dtype) product ``p`` (``T`` itself where ``fused_step`` finds no single
        collective of that kind torch fuses),

            forward(i, j)  = min(E(F_ij, ALL_GATHER, dst's forward product under j),
                                 E(F_ij, REDUCE_SCATTER, src's forward product under i))
            backward(i, j) = min(E(B_ij, REDUCE_SCATTER, dst's input-gradient product under j),
                                 E(B_ij, ALL_GATHER, src's input-gradient product under i))

        each term only where that end ``fuses`` (for dst's, the edge is its left operand 0; for src's
        forward, the edge is the ``sole_reader`` of src's output: torch's ``fuse_matmul_reduce_scatter``
        skips a product with another user, and each reader's edge reshards for itself, so two readers
        are two users; the input-gradient product ``dX = dY W`` is half a linear's backward flops); with no term,
        ``F_ij`` / ``B_ij``. A fused pipeline can expose more than the blocking collective (its
        copies, chunks below the device's best rate): torch fuses it all the same, so it is not
        capped. Each edge reshards for its own consumer, so no gathered tensor is ragged."""
        forward, back = self.reshard_matrices(src, dst, operand, meta, backward)
        if not self.cost_model.charges_compute:  # no product time to hide under
            return forward, back
        cast = activation_itemsize(dst.node) if operand == 0 else None
        forward = self._fused(forward, [s.out_spec for s in src.strategies],
                              [s.in_specs[operand] for s in dst.strategies], meta, cast,
                              (ALL_GATHER, dst, 0) if operand == 0 else None,
                              (REDUCE_SCATTER, src, 0) if sole_reader else None)
        if backward:
            back = self._fused(back, [s.grad_specs[operand] for s in dst.strategies],
                               [s.out_spec.without_partial() for s in src.strategies], meta,
                               activation_itemsize(src.node), (REDUCE_SCATTER, dst, 1) if operand == 0 else None,
                               (ALL_GATHER, src, 1), transposed=True)
        return forward, back

    def _fused(self, full: np.ndarray, sources: list[TensorSpec], targets: list[TensorSpec], meta: TensorMeta,
               itemsize: int | None, by_dst: tuple[str, Candidate, int] | None,
               by_src: tuple[str, Candidate, int] | None,
               transposed: bool = False) -> np.ndarray:
        """``full`` (producer x consumer strategies) with each pair's reshard, from ``sources`` (by
        consumer strategy if ``transposed``, else by producer strategy) into ``targets`` (the other
        way), at its least ``fused_exposed`` over the fusings ``by_dst`` / ``by_src`` (kind, the end
        whose product fuses, 0: its forward product, 1: its input-gradient product)."""
        options = [(o, side) for o, side in ((by_dst, 1), (by_src, 0)) if o is not None and fuses(o[1].node)
                   and o[1].flops is not None]
        if not options:
            return full
        out = full.copy()
        for i, j in zip(*np.nonzero(full)):
            a, b = (sources[j], targets[i]) if transposed else (sources[i], targets[j])
            cast = meta if a.partial else _cast(meta, itemsize)
            steps = recent_steps(a, b, meta.shape, cast.itemsize, self.mesh.shape)
            lefts = []
            for (kind, end, role), side in options:
                flops = end.flops[(i, j)[side]]
                product = (flops[0] if role == 0 else flops[1] // 2,
                           compute_dtype(end.node.work, end.node.tensor.dtype))
                lefts.append(fused_exposed(steps, meta.shape, self.mesh.shape, kind, int(full[i, j]), [product],
                                           self.cost_model.device, self.cost_model.ticks_per_unit))
            out[i, j] = min(lefts)
        return out

    def reshard_matrices(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta,
                         backward: bool) -> tuple[np.ndarray, np.ndarray]:
        """The forward reshard and (``backward``) the gradient's way back, per strategy pair; in
        float8 where torchao's Float8 tensor-parallel styles cast first (the consumer's input, the
        producer's output gradient, neither a partial sum: ``cost/float8.activation_itemsize``).
        Each is computed once per pair of strategy lists (identical nodes share theirs), operand,
        tensor and cast, and shared read-only."""
        forward = self._grid(src, dst, operand, meta, activation_itemsize(dst.node) if operand == 0 else None, False)
        if not backward:
            return forward, np.zeros_like(forward)
        return forward, self._grid(src, dst, operand, meta, activation_itemsize(src.node), True)

    def _grid(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta, itemsize: int | None,
              gradient: bool) -> np.ndarray:
        """Per (producer strategy, consumer strategy): the forward reshard, or the ``gradient``'s way back."""
        key = (id(src.strategies), id(dst.strategies), operand, meta, itemsize, gradient)
        if key not in self.grids:
            cast = _cast(meta, itemsize)
            if gradient:  # the consumer's gradient layout g into the producer's layout e, partial sums reduced
                rows = [s.out_spec.without_partial() for s in src.strategies]
                columns = [s.grad_specs[operand] for s in dst.strategies]
                price = lambda e, g: self.reshard(g, e, meta if g.partial else cast)  # noqa: E731
            else:  # the producer's layout a into the layout b the consumer reads
                rows = [s.out_spec for s in src.strategies]
                columns = [s.in_specs[operand] for s in dst.strategies]
                price = lambda a, b: self.reshard(a, b, meta if a.partial else cast)  # noqa: E731
            across, down = sorted(set(rows)), sorted(set(columns))
            table = np.array([[price(r, c) for c in down] for r in across], dtype=np.int64)
            at_row, at_column = {r: n for n, r in enumerate(across)}, {c: n for n, c in enumerate(down)}
            grid = table[np.ix_([at_row[r] for r in rows], [at_column[c] for c in columns])]
            grid.flags.writeable = False
            self.grids[key] = (grid, src.strategies, dst.strategies)  # the lists keep their identities theirs
        return self.grids[key][0]

    def _owner(self, src: Candidate, dst: Candidate, operand: int, meta: TensorMeta, backward: bool,
               overlap: bool) -> np.ndarray:
        """Parameter -> owner: only the owner strategies reading the use layout. The forward pass
        gathers the stored layout into the use layout; the backward pass gathers it again when
        re-gathered or recomputed, and reshards the gradient back to the stored layout."""
        forward = np.zeros((len(src.strategies), len(dst.strategies)), dtype=np.int64)
        backward_pass = np.zeros_like(forward)
        copies = np.zeros_like(forward)  # FSDP2's copies on the compute stream, wherever FSDP2 runs
        allowed = np.zeros(forward.shape, dtype=bool)
        recompute = dst.recompute or [False] * len(dst.strategies)
        hides = overlap and dst.forward_costs is not None
        bytes_of = param_precision(self.precision, meta.itemsize)
        used = replace(meta, itemsize=bytes_of.compute or bytes_of.value)
        gathered = replace(used, itemsize=gather_itemsize(dst.node, operand) or used.itemsize)  # Float8 all-gather
        reduced = replace(meta, itemsize=bytes_of.gradient)
        for i, (stored, storage) in enumerate(zip(src.strategies, src.storage)):
            gather = self.reshard(stored.out_spec, storage.use, gathered)
            rearranged = any(d != 0 and axes != storage.use.dims[d] for d, axes in enumerate(stored.out_spec.dims))
            copy_out = self._streamed((2 + 2 * rearranged) * local_bytes(storage.use, gathered, self.mesh)) \
                if self.fsdp2 and gather else 0
            for j, s in enumerate(dst.strategies):
                if s.in_specs[operand] != storage.use:
                    continue
                allowed[i, j] = True
                back = self.reshard(s.grad_specs[operand], stored.out_spec, reduced) if backward else 0
                gathers = 1 if self.kept_over else 1 + int(storage.regather) + int(recompute[j])
                forward[i, j] = gather
                backward_pass[i, j] = back + gather * (gathers - 1)
                copy_in = self._streamed((1 + 2 * rearranged) * local_bytes(s.grad_specs[operand], used, self.mesh)
                                         + local_bytes(s.grad_specs[operand], reduced, self.mesh)) if self.fsdp2 and back else 0
                copies[i, j] = copy_out * gathers + copy_in
        if hides:
            own_forward = np.asarray(dst.forward_costs, dtype=np.int64)[None, :]
            own_backward = np.asarray(dst.costs, dtype=np.int64)[None, :] - own_forward
            forward = np.maximum(0, forward - own_forward)
            if not self.kept_over:  # a kept stage reduces after its last backward: nothing left to hide under
                backward_pass = np.maximum(0, backward_pass - own_backward)
        total = forward + backward_pass + copies
        if self.kept_over:
            total = -(-total // self.kept_over)
        return np.where(allowed, np.minimum(total, FORBIDDEN), FORBIDDEN)

    def _streamed(self, nbytes: int) -> int:
        """Ticks of a memory-bound copy of ``nbytes`` (0 where the model does not charge compute)."""
        if not self.cost_model.charges_compute:
            return 0
        return self.cost_model.ticks(nbytes / self.cost_model.device.streaming_bandwidth)


def _cast(meta: TensorMeta, itemsize: int | None) -> TensorMeta:
    """``meta`` moved at ``itemsize`` bytes an element (None: as it is)."""
    return meta if itemsize is None else replace(meta, itemsize=itemsize)


def _fusing(cand: Candidate) -> tuple:
    """What ``EdgePrices.async_matrices`` reads of an end besides its strategies: whether torch's
    pass fuses with it, its per-strategy flops (shared by identical nodes) and its compute dtype."""
    fused = fuses(cand.node) and cand.flops is not None
    return (id(cand.flops), compute_dtype(cand.node.work, cand.node.tensor.dtype)) if fused else ()


def reader_counts(graph: OpGraph, candidates: dict[str, Candidate]) -> Counter[str]:
    """How many edges read each candidate's output: one per (consumer, operand) that reads its values
    (an operand with an input layout), each of which reshards for itself."""
    return Counter(src for node in graph if node.name in candidates for operand, src in enumerate(node.inputs)
                   if src in candidates and operand < len(candidates[node.name].strategies[0].in_specs)
                   and candidates[node.name].strategies[0].in_specs[operand] is not None)
