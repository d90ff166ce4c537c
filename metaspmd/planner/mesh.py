"""Device meshes: axis sizes and names, and the alpha-beta link model of each axis."""

from __future__ import annotations

import math
import reprlib
import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

# Defaults in the range of an intra-node GPU link: 5 us per message, 100 GB/s.
DEFAULT_ALPHA = 5e-6
DEFAULT_BANDWIDTH = 100e9


_MOST_BYTES = 2.0 ** 64  # more than any tensor holds: a link's seconds for it must stay finite


@dataclass(frozen=True)
class MeshAxis:
    """One mesh axis: ``alpha`` seconds per message, ``beta`` seconds per byte."""

    name: str
    size: int
    alpha: float = DEFAULT_ALPHA
    beta: float = 1.0 / DEFAULT_BANDWIDTH

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"a mesh axis name must be a str, got {self.name!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, numbers.Integral):
            raise TypeError(f"mesh axis {self.name!r}: its size must be an int, got {self.size!r}")
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

    def described(self) -> str:
        """Like ``str``, with each axis's link where it is not the default: two meshes that
        differ only in their links read differently."""
        default = (DEFAULT_ALPHA, 1.0 / DEFAULT_BANDWIDTH)
        return "Mesh(" + ", ".join(
            f"{a.name}={a.size}" + ("" if (a.alpha, a.beta) == default else f" ({a.alpha:g} s per message, "
                                                                           f"{1 / a.beta:g} bytes/s)")
            for a in self.axes) + ")"

    def with_links(self, links: Mapping[str, tuple[float, float]] | None) -> "Mesh":
        """This mesh with the named axes' links replaced: ``{"dp": (alpha, bandwidth)}``,
        seconds per message and bytes per second (``{"dp": (10e-6, 25e9)}`` for an axis that
        crosses nodes). Axes not named keep theirs."""
        if links is None:
            return self
        if not isinstance(links, Mapping):  # a str would be read as its letters
            raise TypeError(f"links must be a dict of (seconds per message, bytes per second) by mesh axis name, "
                            f"got {links!r:.60}: write {{{self.names[0]!r}: (10e-6, 25e9)}}")
        unknown = sorted(set(links) - set(self.names))
        if unknown:
            raise ValueError(f"links: no mesh axis named {', '.join(map(repr, unknown))} (axes are {list(self.names)})")
        axes = []
        for a in self.axes:
            if a.name not in links:
                axes.append(a)
                continue
            try:
                if any(isinstance(v, (bool, str, bytes)) for v in links[a.name]):  # float() takes them
                    raise TypeError
                alpha, bandwidth = (float(v) for v in links[a.name])
            except OverflowError:  # an int past float's range (10**400)
                alpha = bandwidth = math.inf
            except (TypeError, ValueError):
                raise ValueError(f"links[{a.name!r}]: expected (seconds per message, bytes per second), "
                                 f"got {reprlib.repr(links[a.name])}") from None
            if not (bandwidth > 0 and math.isfinite(bandwidth)) or not (alpha >= 0 and math.isfinite(alpha)):
                raise ValueError(f"links[{a.name!r}]: seconds per message must be >= 0 and bytes per second > 0, "
                                 f"both finite; got {reprlib.repr(links[a.name])}")
            if not math.isfinite(alpha + _MOST_BYTES / bandwidth):
                raise ValueError(f"links[{a.name!r}]: {links[a.name]!r} is so slow that moving a tensor's bytes takes "
                                 "more seconds than a float holds")
            axes.append(MeshAxis(a.name, a.size, alpha, 1.0 / bandwidth))
        return Mesh(tuple(axes))


__all__ = ["DEFAULT_ALPHA", "DEFAULT_BANDWIDTH", "Mesh", "MeshAxis"]
