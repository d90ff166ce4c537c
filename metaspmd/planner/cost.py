"""Alpha-beta cost model: collectives per mesh axis, resharding between placements,
per-device compute (roofline) and per-device memory. All times in seconds, memory in bytes.

Collectives are ring algorithms on one axis of ``k`` devices; ``nbytes`` is the size of the
buffer that is whole along that axis (the all-gather result, the reduce-scatter input):

    all-gather, reduce-scatter: L + (k-1) alpha + (k-1)/k nbytes beta
    all-reduce:               L + 2 (k-1) alpha + 2 (k-1)/k nbytes beta
    all-to-all:                 L + (k-1) alpha + (k-1)/k (nbytes / k) beta

``L`` (``Device.collective_launch``) is the fixed cost of issuing one collective (kernel
launch, synchronisation), paid once per call whatever the ring does. Without it an
all-reduce costs exactly an all-gather plus a reduce-scatter, so data parallelism (one
gradient all-reduce per parameter) and ZeRO/FSDP-style sharding (a weight all-gather plus
a gradient reduce-scatter) tie, and the solver picks between them arbitrarily.

Gradient reductions are fused: DDP all-reduces gradients in buckets, FSDP reduce-scatters
flat parameters and XLA's all-reduce combiner merges a step's independent reductions, so a
bucket pays one collective's fixed cost (``L`` and the ``alpha`` terms) for all its members.
``fused(share)`` is the model of one member: a reduction (all-reduce, reduce-scatter) pays its
own bytes and ``share`` of the fixed cost, any other collective its full cost (the planner
shares it among a step's tied gradients, so reducing every gradient on an axis pays one
collective's latency, not one per parameter). The planner also hides a gradient's reduction
behind the backward compute that follows it (``problem._overlap``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from ..placement import (
    ARG_PARTIAL_OPS, REPLICATE, Partial, Placement, Placements, Replicate, Shard, local_shape, shard_factor,
)
from .flops import dtype_bytes, flops, numel
from .mesh import Mesh


@dataclass(frozen=True)
class Device:
    """One device's peak arithmetic rate (FLOP/s) and memory bandwidth (bytes/s)."""

    peak_flops: float = 100e12
    memory_bandwidth: float = 2e12
    collective_launch: float = 1e-6  # seconds per collective call, on top of the alpha-beta terms


def regathers(axis: int, src: Placements, dst: Placements) -> bool:
    """Must ``axis`` gather its cut and cut again, though it may keep its placement? A dim
    cut on several axes is cut in mesh order, the first axis outermost: where an earlier
    axis adds or drops a cut of the dim this axis cuts, this axis's local piece is no
    longer a piece of the new layout (``[R, S(1)] -> [S(1), S(1)]`` moves data between the
    second axis's devices, which XLA compiles as gathering the whole tensor)."""
    s = src[axis]
    return isinstance(s, Shard) and cut_moves(s, [src[e] == s for e in range(axis)], dst[:axis])


def cut_moves(cut: Shard, held_before: Sequence[bool], earlier_dst: Sequence[Placement | None]) -> bool:
    """``regathers`` from what it reads of the earlier axes: whether each held ``cut`` on the
    source, and what each holds on the destination (the ILP's coarse per-axis keys give
    these alone): some earlier axis holds the cut on one side only."""
    return any(held != (d == cut) for held, d in zip(held_before, earlier_dst))


@dataclass(frozen=True)
class ReshardStep:
    """One collective (or free local step) on one mesh axis."""

    axis: str
    kind: str  # all-gather, all-reduce, reduce-scatter, all-to-all, slice, zero
    src: Placement
    dst: Placement
    cost: float

    def __str__(self) -> str:
        return f"{self.kind}@{self.axis}"


class CostModel:
    def __init__(self, mesh: Mesh, device: Device = Device(), reduction_share: float = 1.0):
        self.mesh = mesh
        self.device = device
        self.reduction_share = reduction_share  # of a reduction's fixed cost (fused)
        self._reshard = lru_cache(maxsize=None)(self._reshard_steps)
        self._fused: dict[float, CostModel] = {}

    def fused(self, share: float) -> "CostModel":
        """The model of a reduction fused with others into one (a gradient bucket): its bytes
        cost what they cost, its fixed cost (launch and per-message latency) is scaled by
        ``share``; other collectives are not fused. ``fused(1.0)`` is this model."""
        if not 0.0 < share <= 1.0:
            raise ValueError(f"a fused collective's share of the fixed cost is in (0, 1], got {share}")
        if share == 1.0:
            return self
        if share not in self._fused:
            self._fused[share] = CostModel(self.mesh, self.device, share)
        return self._fused[share]

    # ------------------------------------------------------------------ collectives
    def _axis(self, axis: int):
        return self.mesh.axes[axis]

    def _ring(self, axis: int, nbytes: float) -> float:
        """One ring pass over the axis (all-gather or reduce-scatter), launch excluded."""
        a = self._axis(axis)
        k = a.size
        return (k - 1) * a.alpha + (k - 1) / k * nbytes * a.beta

    def all_gather(self, axis: int, nbytes: float) -> float:
        return 0.0 if self._axis(axis).size == 1 else self.device.collective_launch + self._ring(axis, nbytes)

    def reduce_scatter(self, axis: int, nbytes: float) -> float:
        a = self._axis(axis)
        k = a.size
        fixed = self.device.collective_launch + (k - 1) * a.alpha
        return 0.0 if k == 1 else self.reduction_share * fixed + (k - 1) / k * nbytes * a.beta

    def all_reduce(self, axis: int, nbytes: float) -> float:
        a = self._axis(axis)
        k = a.size
        fixed = self.device.collective_launch + 2 * (k - 1) * a.alpha
        return 0.0 if k == 1 else self.reduction_share * fixed + 2 * (k - 1) / k * nbytes * a.beta

    def neighbour_exchange(self, axis: int, nbytes: float) -> float:
        """Each device sends up to ``nbytes`` to a neighbour on the axis (a collective
        permute: the pieces of a slice of a cut dim evened out)."""
        a = self._axis(axis)
        return 0.0 if a.size == 1 else self.device.collective_launch + a.alpha + nbytes * a.beta

    def all_to_all(self, axis: int, nbytes: float) -> float:
        a = self._axis(axis)
        k = a.size
        return 0.0 if k == 1 else self.device.collective_launch + (k - 1) * a.alpha + (k - 1) / k * (nbytes / k) * a.beta

    # ------------------------------------------------------------------ resharding
    def _axis_step(self, axis: int, src: Placement, dst: Placement, nbytes: float) -> list[tuple[str, float]]:
        if src == dst:
            return []
        if isinstance(src, Replicate):
            return [("slice" if isinstance(dst, Shard) else "zero", 0.0)]
        if isinstance(src, Shard):
            if isinstance(dst, Shard):
                return [("all-to-all", self.all_to_all(axis, nbytes))]
            steps = [("all-gather", self.all_gather(axis, nbytes))]
            # Shard -> Partial goes through Replicate: apply layers only need the two basic moves.
            return steps + ([("zero", 0.0)] if isinstance(dst, Partial) else [])
        # src is Partial
        if src.op in ARG_PARTIAL_OPS:  # positions pending an arg-reduction: (value, position)
            k = self._axis(axis).size  # pairs all-gathered from every device, then kept or sliced
            steps = [("all-gather", self.all_gather(axis, 2 * k * nbytes))]
            return steps + ([("zero", 0.0)] if isinstance(dst, Partial) else [])
        if isinstance(dst, Shard):
            return [("reduce-scatter", self.reduce_scatter(axis, nbytes))]
        steps = [("all-reduce", self.all_reduce(axis, nbytes))]
        return steps + ([("zero", 0.0)] if isinstance(dst, Partial) else [])

    def _reshard_steps(
        self, shape: tuple[int, ...], itemsize: int, src: Placements, dst: Placements
    ) -> tuple[ReshardStep, ...]:
        """Axis by axis, in mesh order; each step moves the buffer that is whole along its
        axis: earlier axes already hold their ``dst`` placement, later ones still ``src``.
        An axis whose cut an earlier axis reorders (``regathers``) gathers it first."""
        total = float(numel(shape) * itemsize)
        steps: list[ReshardStep] = []
        for axis in range(self.mesh.ndim):
            again = regathers(axis, src, dst)
            if src[axis] == dst[axis] and not again:
                continue
            nbytes = total / self.others_factor(axis, src, dst)
            for kind, cost in self._axis_steps(axis, src[axis], dst[axis], nbytes, again):
                steps.append(ReshardStep(self.mesh.axes[axis].name, kind, src[axis], dst[axis], cost))
        return tuple(steps)

    def _axis_steps(self, axis: int, src: Placement, dst: Placement, nbytes: float,
                    again: bool) -> list[tuple[str, float]]:
        """``_axis_step``, or where the axis ``regathers``: its cut gathered, then ``dst`` cut."""
        if not again:
            return self._axis_step(axis, src, dst, nbytes)
        return [("all-gather", self.all_gather(axis, nbytes))] + self._axis_step(axis, REPLICATE, dst, nbytes)

    def others_factor(self, axis: int, src: Placements, dst: Placements) -> int:
        """How many ways the other axes split the tensor while ``axis`` is resharded."""
        k = 1
        for b, size in enumerate(self.mesh.shape):
            state = dst[b] if b < axis else src[b]
            if b != axis and isinstance(state, Shard):
                k *= size
        return k

    def axis_cost(
        self, shape: Sequence[int], dtype: str, axis: int, src: Placement, dst: Placement, others: int,
        again: bool = False,
    ) -> float:
        """The resharding cost on one axis when the other axes split the tensor ``others`` ways
        (``again``: the axis ``regathers``): one term of ``reshard``, their sum over axes."""
        nbytes = float(numel(tuple(shape)) * dtype_bytes(dtype)) / others
        return sum(cost for _, cost in self._axis_steps(axis, src, dst, nbytes, again))

    def reshard_steps(
        self, shape: Sequence[int], dtype: str, src: Placements, dst: Placements
    ) -> tuple[ReshardStep, ...]:
        return self._reshard(tuple(shape), dtype_bytes(dtype), tuple(src), tuple(dst))

    def reshard(self, shape: Sequence[int], dtype: str, src: Placements, dst: Placements) -> float:
        if src == dst:
            return 0.0
        return sum(s.cost for s in self.reshard_steps(shape, dtype, src, dst))

    # ------------------------------------------------------------------ compute and memory
    def local_shape(self, shape: Sequence[int], p: Placements) -> tuple[int, ...]:
        return local_shape(p, tuple(shape), self.mesh.shape)

    def memory(self, shape: Sequence[int], dtype: str, p: Placements) -> float:
        """Bytes per device (a Partial tensor is full size on every device)."""
        return float(numel(self.local_shape(shape, p)) * dtype_bytes(dtype))

    def compute(
        self,
        op: str,
        in_shapes: Sequence[tuple[int, ...]],
        out_shapes: Sequence[tuple[int, ...]],
        itemsize: int = 4,
        kwargs: Mapping[str, Any] | None = None,
    ) -> float:
        """Roofline time of one op on per-device shapes: max(FLOPs / peak, bytes / bandwidth)."""
        f = flops(op, in_shapes, out_shapes, kwargs)
        nbytes = itemsize * sum(numel(s) for s in (*in_shapes, *out_shapes))
        return max(f / self.device.peak_flops, nbytes / self.device.memory_bandwidth)

    def shard_factor(self, p: Placements, dim: int) -> int:
        return shard_factor(p, self.mesh.shape, dim)


__all__ = ["CostModel", "Device", "ReshardStep", "cut_moves", "regathers"]
