"""A user's own TE kernels, swept into a registry of their own:

    python tools/sweep.py --backend tvm --kernels examples/tvm_user_kernels.py --out my_registry

writes my_registry/tvm/tvm.scale_rows.yaml. Every dim is a symbolic var, so the kernel is
compiled once and runs on shards of any size.
"""

from tvm import te

from metaspmd.backends.tvm import kernel


@kernel(example={"n": 6, "m": 8})
def scale_rows():
    """out[i, j] = x[i, j] * s[i]: each row scaled by its own factor."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", name="x")
    s = te.placeholder((n,), "float64", name="s")
    return [x, s], te.compute((n, m), lambda i, j: x[i, j] * s[i], name="out")
