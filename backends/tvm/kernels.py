"""The built-in catalog of TE kernels (float64 for tight verification).

Every dim is a symbolic var. Example sizes differ between the dims of one kernel unless
the dims are meant to be cut together (a contraction dim, concat's blocks), so the
explorer's groups of equal-sized dims stay meaningful; spatial dims are at least 6 so
halo strategies (convolution, sliding pooling, pad) get explored.
"""

from __future__ import annotations

from tvm import te, topi

from .registry import kernel

F64 = "float64"


def _vars(*names: str) -> list:
    return [te.var(n) for n in names]


# --------------------------------------------------------------------------- linear algebra


@kernel(example={"n": 8})
def vector_add():
    """The MetaDist appendix A.1 example: c[i] = a[i] + b[i]."""
    (n,) = _vars("n")
    a = te.placeholder((n,), F64, name="a")
    b = te.placeholder((n,), F64, name="b")
    return [a, b], te.compute((n,), lambda i: a[i] + b[i], name="c")


@kernel(example={"n": 8, "k": 6, "m": 4})
def matmul():
    n, k, m = _vars("n", "k", "m")
    a = te.placeholder((n, k), F64, name="a")
    b = te.placeholder((k, m), F64, name="b")
    r = te.reduce_axis((0, k), name="r")
    return [a, b], te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="out")


@kernel(example={"n": 8, "k": 6, "m": 4})
def dense():
    """x @ w.T with w stored (out_features, in_features)."""
    n, k, m = _vars("n", "k", "m")
    x = te.placeholder((n, k), F64, name="x")
    w = te.placeholder((m, k), F64, name="w")
    return [x, w], topi.nn.dense(x, w)


@kernel(example={"b": 3, "n": 8, "k": 6, "m": 4})
def batch_matmul():
    b, n, k, m = _vars("b", "n", "k", "m")
    x = te.placeholder((b, n, k), F64, name="x")
    y = te.placeholder((b, k, m), F64, name="y")
    r = te.reduce_axis((0, k), name="r")
    # by hand: topi's batch_matmul names a fresh output var for a symbolic batch dim
    return [x, y], te.compute((b, n, m), lambda t, i, j: te.sum(x[t, i, r] * y[t, r, j], axis=r), name="out")


# --------------------------------------------------------------------------- convolution, pooling


@kernel(example={"b": 2, "c": 3, "w": 10, "o": 4, "kw": 3}, variants=[{"padding": 0}, {"padding": 1}], exact=["kw"])
def conv1d(padding):
    b, c, w, o, kw = _vars("b", "c", "w", "o", "kw")
    data = te.placeholder((b, c, w), F64, name="data")
    weight = te.placeholder((o, c, kw), F64, name="weight")
    return [data, weight], topi.nn.conv1d_ncw(data, weight, 1, padding, 1)


@kernel(example={"b": 2, "c": 3, "h": 9, "w": 8, "o": 4, "kh": 3, "kw": 2}, variants=[{"padding": 0}, {"padding": 1}],
        exact=["kh", "kw"])
def conv2d(padding):
    b, c, h, w, o, kh, kw = _vars("b", "c", "h", "w", "o", "kh", "kw")
    data = te.placeholder((b, c, h, w), F64, name="data")
    weight = te.placeholder((o, c, kh, kw), F64, name="weight")
    return [data, weight], topi.nn.conv2d_nchw(data, weight, 1, padding, 1)


def _pool1d(name: str, pool_type: str) -> None:
    @kernel(name, example={"b": 2, "c": 3, "w": 10})
    def build():
        """Window 3, stride 1: a sliding window, so the width shards with a halo."""
        b, c, w = _vars("b", "c", "w")
        data = te.placeholder((b, c, w), F64, name="data")
        return [data], topi.nn.pool1d(data, (3,), (1,), (1,), (0, 0), pool_type, layout="NCW")


def _pool2d(name: str, pool_type: str) -> None:
    @kernel(name, example={"b": 2, "c": 3, "h": 8, "w": 6})
    def build():
        """Window 2x2, stride 2."""
        b, c, h, w = _vars("b", "c", "h", "w")
        data = te.placeholder((b, c, h, w), F64, name="data")
        return [data], topi.nn.pool2d(data, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), pool_type, layout="NCHW")


_pool1d("max_pool1d", "max")
_pool1d("avg_pool1d", "avg")
_pool2d("max_pool2d", "max")
_pool2d("avg_pool2d", "avg")


# --------------------------------------------------------------------------- normalization


@kernel(example={"n": 6, "m": 8})
def softmax():
    n, m = _vars("n", "m")
    x = te.placeholder((n, m), F64, name="x")
    return [x], topi.nn.softmax(x, axis=-1)


@kernel(example={"n": 6, "m": 8})
def log_softmax():
    n, m = _vars("n", "m")
    x = te.placeholder((n, m), F64, name="x")
    return [x], topi.nn.log_softmax(x, axis=-1)


@kernel(example={"n": 6, "m": 8})
def layer_norm():
    """Over the last dim, with scale and shift (topi's layer_norm has no float64)."""
    n, m = _vars("n", "m")
    x = te.placeholder((n, m), F64, name="x")
    gamma = te.placeholder((m,), F64, name="gamma")
    beta = te.placeholder((m,), F64, name="beta")
    size = m.astype(F64)
    # TE allows a reduction only at the top of a compute: sums first, divisions after.
    r1 = te.reduce_axis((0, m), name="r1")
    total = te.compute((n,), lambda i: te.sum(x[i, r1], axis=r1), name="total")
    mean = te.compute((n,), lambda i: total[i] / size, name="mean")
    r2 = te.reduce_axis((0, m), name="r2")
    sq = te.compute((n,), lambda i: te.sum((x[i, r2] - mean[i]) * (x[i, r2] - mean[i]), axis=r2), name="sq")
    out = te.compute(
        (n, m), lambda i, j: (x[i, j] - mean[i]) / te.sqrt(sq[i] / size + 1e-5) * gamma[j] + beta[j], name="out"
    )
    return [x, gamma, beta], out


# --------------------------------------------------------------------------- elementwise

UNARY = {
    "negative": topi.negative,
    "abs": topi.abs,
    "exp": topi.exp,
    "tanh": topi.tanh,
    "sigmoid": topi.sigmoid,
    "relu": topi.nn.relu,
    "erf": topi.erf,
    "sin": topi.sin,
}

BINARY = {
    "add": topi.add,
    "subtract": topi.subtract,
    "multiply": topi.multiply,
    "divide": topi.divide,
    "maximum": topi.maximum,
    "minimum": topi.minimum,
}


def _unary(name: str, fn) -> None:
    @kernel(name, example={"n": 6, "m": 8})
    def build():
        n, m = _vars("n", "m")
        x = te.placeholder((n, m), F64, name="x")
        return [x], fn(x)


def _binary(name: str, fn) -> None:
    @kernel(name, example={"n": 6, "m": 8}, variants=[{"broadcast": False}, {"broadcast": True}])
    def build(broadcast):
        """broadcast=True: a row vector on the right, numpy-style."""
        n, m = _vars("n", "m")
        lhs = te.placeholder((n, m), F64, name="lhs")
        rhs = te.placeholder((m,) if broadcast else (n, m), F64, name="rhs")
        return [lhs, rhs], fn(lhs, rhs)


for _name, _fn in UNARY.items():
    _unary(_name, _fn)
for _name, _fn in BINARY.items():
    _binary(_name, _fn)


@kernel(example={"n": 6, "m": 8})
def where():
    n, m = _vars("n", "m")
    cond = te.placeholder((n, m), "bool", name="cond")
    x = te.placeholder((n, m), F64, name="x")
    y = te.placeholder((n, m), F64, name="y")
    return [cond, x, y], topi.where(cond, x, y)


# --------------------------------------------------------------------------- reductions

_AXES = [{"axis": 0}, {"axis": 1}]


def _reduction(name: str, fn) -> None:
    @kernel(name, example={"n": 6, "m": 8}, variants=_AXES)
    def build(axis):
        n, m = _vars("n", "m")
        x = te.placeholder((n, m), F64, name="x")
        return [x], fn(x, axis)


def _mean(x, axis):
    total = topi.sum(x, axis=axis)
    size = x.shape[axis].astype(F64)
    return te.compute(total.shape, lambda *i: total(*i) / size, name="mean")


_reduction("sum", lambda x, axis: topi.sum(x, axis=axis))
_reduction("max", lambda x, axis: topi.max(x, axis=axis))
_reduction("min", lambda x, axis: topi.min(x, axis=axis))
_reduction("mean", _mean)


# --------------------------------------------------------------------------- data movement


@kernel(example={"n": 6, "p": 6, "m": 4, "q": 4}, variants=_AXES)
def concat(axis):
    """Two inputs of equal example size along ``axis``, so the block gather shows up."""
    n, p, m, q = _vars("n", "p", "m", "q")
    a = te.placeholder((n, m), F64, name="a")
    b = te.placeholder((p, m) if axis == 0 else (n, q), F64, name="b")
    return [a, b], topi.concatenate([a, b], axis=axis)


@kernel(example={"b": 3, "n": 6, "m": 8})
def transpose():
    """(b, n, m) -> (m, b, n)."""
    b, n, m = _vars("b", "n", "m")
    x = te.placeholder((b, n, m), F64, name="x")
    return [x], topi.transpose(x, (2, 0, 1))


@kernel(example={"n": 8, "m": 6})
def pad():
    """Zero pad: 1 before and after dim 0, 0 before and 2 after dim 1 (shards need halos)."""
    n, m = _vars("n", "m")
    x = te.placeholder((n, m), F64, name="x")
    return [x], topi.nn.pad(x, (1, 0), (1, 2), 0.0)


@kernel(example={"n": 6, "m": 8}, variants=_AXES)
def cumsum(axis):
    n, m = _vars("n", "m")
    x = te.placeholder((n, m), F64, name="x")
    return [x], topi.cumsum(x, axis=axis)


@kernel(example={"n": 8, "m": 6, "p": 5}, int_ranges={"indices": (0, "n")})
def take():
    """Rows of ``data`` by index; mode='clip' keeps out-of-range indices (a shard's) in bounds."""
    n, m, p = _vars("n", "m", "p")
    data = te.placeholder((n, m), F64, name="data")
    indices = te.placeholder((p,), "int64", name="indices")
    return [data, indices], topi.take(data, indices, axis=0, mode="clip")
