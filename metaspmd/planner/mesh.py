"""Device meshes: axis sizes and names, and the alpha-beta link model of each axis."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

# Defaults in the range of an intra-node GPU link: 5 us per message, 100 GB/s.
DEFAULT_ALPHA = 5e-6
DEFAULT_BANDWIDTH = 100e9


@dataclass(frozen=True)
class MeshAxis:
    """One mesh axis: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    name: str
    size: int
    alpha: float = DEFAULT_ALPHA
    beta: float = 1.0 / DEFAULT_BANDWIDTH

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"mesh axis {self.name!r} has size {self.size}")
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"mesh axis {self.name!r} has a negative alpha or beta")


Scalars = Union[float, Sequence[float]]


def _per_axis(value: Scalars, n: int, what: str) -> tuple[float, ...]:
    if isinstance(value, (int, float)):
        return (float(value),) * n
    out = tuple(float(v) for v in value)
    if len(out) != n:
        raise ValueError(f"{what}: expected {n} values, got {len(out)}")
    return out


@dataclass(frozen=True)
class Mesh:
    axes: tuple[MeshAxis, ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise ValueError("a mesh needs at least one axis")
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names):
            raise ValueError(f"mesh axis names must be unique: {names}")

    @classmethod
    def of(
        cls,
        shape: int | Sequence[int],
        names: Sequence[str] | None = None,
        alpha: Scalars = DEFAULT_ALPHA,
        bandwidth: Scalars = DEFAULT_BANDWIDTH,
    ) -> "Mesh":
        """``Mesh.of((2, 4), ("dp", "tp"), bandwidth=(25e9, 200e9))``; bandwidth in bytes/s."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = len(shape)
        names = tuple(names) if names is not None else tuple(f"d{i}" for i in range(n))
        if len(names) != n:
            raise ValueError(f"{n} axes but {len(names)} names")
        alphas = _per_axis(alpha, n, "alpha")
        bws = _per_axis(bandwidth, n, "bandwidth")
        if any(b <= 0 for b in bws):
            raise ValueError("bandwidth must be positive")
        return cls(tuple(MeshAxis(nm, s, a, 1.0 / b) for nm, s, a, b in zip(names, shape, alphas, bws)))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @property
    def ndim(self) -> int:
        return len(self.axes)

    @property
    def size(self) -> int:
        n = 1
        for a in self.axes:
            n *= a.size
        return n

    def __str__(self) -> str:
        return "Mesh(" + ", ".join(f"{a.name}={a.size}" for a in self.axes) + ")"


__all__ = ["DEFAULT_ALPHA", "DEFAULT_BANDWIDTH", "Mesh", "MeshAxis"]
