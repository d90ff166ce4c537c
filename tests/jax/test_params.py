"""Params as plain values, and params fitted to shard shapes."""

import enum

import pytest

pytest.importorskip("jax")

from metaspmd.backends.jax.params import (  # noqa: E402
    exact_sizes, for_shards, group_operands, plain, signature_params,
)


def test_plain_values_are_yaml_safe():
    import numpy as np
    from jax import lax

    class Mode(enum.IntEnum):
        A = 1

    assert plain(Mode.A) == "Mode.A"  # an IntEnum must not pass as an int
    assert plain(np.dtype("float32")) == "float32"
    assert plain(lax.GatherScatterMode.FILL_OR_DROP) == "GatherScatterMode.FILL_OR_DROP"
    assert plain(((1,), (0,))) == ((1,), (0,))
    dn = lax.GatherDimensionNumbers((1,), (0,), (0,))
    assert " " not in plain(dn) and plain(dn).startswith("GatherDimensionNumbers(")
    raw = {"precision": None, "dimension_numbers": (((1,), (0,)), ((), ())), "out_sharding": None}
    params = signature_params("dot_general", raw, [(2, 3), (3, 4)])
    assert params == {"dimension_numbers": (((1,), (0,)), ((), ()))}


def test_a_convolution_is_keyed_by_its_kernel_extent():
    """rhs_spec's spatial dims set the halo: OIHW pins dims 2-3, HWIO dims 0-1, raw or plain."""
    from jax import lax

    oihw = lax.conv_dimension_numbers((1, 3, 8, 8), (4, 3, 3, 3), ("NCHW", "OIHW", "NCHW"))
    hwio = lax.conv_dimension_numbers((1, 8, 8, 3), (3, 3, 3, 4), ("NHWC", "HWIO", "NHWC"))
    assert exact_sizes("conv_general_dilated", {"dimension_numbers": oihw}) == {"rhs": slice(2, 4)}
    plain_hwio = signature_params("conv_general_dilated", {"dimension_numbers": hwio}, [(1, 8, 8, 3), (3, 3, 3, 4)])
    assert exact_sizes("conv_general_dilated", plain_hwio) == {"rhs": slice(0, 2)}
    assert exact_sizes("add", {}) == {}


def test_a_slice_that_spans_its_dim_keys_the_rule_by_that_dim():
    """A shard slices its own length where the slice spans the dim (for_shards), which is
    the global slice only while it does: 10 of a dim of 10 is the whole dim, 10 of 20 is
    not. The spanned dims' sizes enter the signature, so a rule found at (10, 10, 10) is
    not the one looked up at (12, 12, 20)."""
    from metaspmd.backends.jax.backend import _AvalOps
    from metaspmd.signature import signature
    import jax

    params = {"start_indices": (0, 1, 0), "limit_indices": (1, 2, 10), "strides": None}
    assert exact_sizes("slice", params, (10, 10, 10)) == {"x": slice(2, 3)}
    assert exact_sizes("slice", signature_params("slice", params, [(10, 10, 10)]), (10, 10, 10)) == {"x": slice(2, 3)}
    assert exact_sizes("slice", params, (12, 12, 20)) == {}

    def sig(shape):
        x = jax.core.ShapedArray(shape, "float32")
        plain_params = signature_params("slice", params, [shape])
        return signature(_AvalOps(), ("x",), (x,), plain_params, exact_sizes("slice", plain_params, shape))

    assert sig((10, 10, 10)).startswith("x:f[*,*,10]") and sig((12, 12, 20)).startswith("x:f[*,*,*]")
    # gather and dynamic_slice by their slice_sizes, where a slice takes a whole dim of 2 or more
    assert exact_sizes("gather", {"slice_sizes": (1, 3, 2)}, (2, 3, 3)) == {"operand": slice(1, 2)}
    assert exact_sizes("dynamic_slice", {"slice_sizes": (1, 4)}, (5, 4)) == {"operand": slice(1, 2)}
    assert exact_sizes("dynamic_slice", {"slice_sizes": (1, 1)}, (1, 4)) == {}
    with pytest.raises(ValueError, match="operand's shape"):
        exact_sizes("gather", {"slice_sizes": (1, 3, 2)})


def test_operand_layout():
    names, args = group_operands("dynamic_update_slice", ["op", "upd", "i0", "i1"])
    assert names == ("operand", "update", "start_indices") and args == ("op", "upd", ["i0", "i1"])
    names, args = group_operands("reduce", ["a", "b", "ia", "ib"])
    assert args == (["a", "b"], ["ia", "ib"])
    assert group_operands("neg", ["x"])[0] == ("x",)


def test_shape_params_follow_the_shards():
    p = for_shards("broadcast_in_dim", {"shape": (3, 4, 5), "broadcast_dimensions": (0, 2)}, [(3, 1)], [(2, 1)])
    assert p["shape"] == (2, 4, 5)  # the size-1 dim stays broadcast
    p = for_shards("reshape", {"new_sizes": (24,), "dimensions": None}, [(4, 6)], [(2, 6)])
    assert p["new_sizes"] == (12,)
    p = for_shards("reshape", {"new_sizes": (3, 20), "dimensions": None}, [(3, 4, 5)], [(3, 4, 2)])
    assert p["new_sizes"] == (3, 8)
    with pytest.raises(ValueError):  # 5 rows do not split into whole rows of 6
        for_shards("reshape", {"new_sizes": (4, 6), "dimensions": None}, [(24,)], [(10,)])
    p = for_shards("slice", {"start_indices": (0, 1), "limit_indices": (6, 3), "strides": None}, [(6, 4)], [(3, 4)])
    assert p["limit_indices"] == (3, 3)  # full-range dims follow, partial ones stay
    same = {"shape": (2, 3), "broadcast_dimensions": (1,)}
    assert for_shards("broadcast_in_dim", same, [(3,)], [(3,)]) == same


def test_an_ulp_step_is_compared_bit_for_bit():
    """jax's nextafter, as the sweep and the runtime run it (``compared_as_bits``): its
    outputs are the integers of their bits, so no Partial input passes within a tolerance."""
    import jax
    import jax.numpy as jnp

    from metaspmd.backends.jax.tensor_ops import JaxOps, float_bits
    from metaspmd.case import OpCase
    from metaspmd.explorer import explore_case
    from metaspmd.spec import ShardIn, strategies
    from metaspmd.tensor_ops import compared_as_bits

    fn = compared_as_bits(jax.lax.nextafter, JaxOps().is_tensor, float_bits)
    x, y = jax.random.normal(jax.random.key(0), (6, 4)), jax.random.normal(jax.random.key(1), (6, 4))
    bits = fn(x, y)
    assert jnp.issubdtype(bits.dtype, jnp.integer) and bits.dtype.itemsize == x.dtype.itemsize and bits.shape == (6, 4)
    e = explore_case(OpCase("jax.nextafter", fn, (x, y), {}, ("x1", "x2")), JaxOps())
    rules = list(strategies(e.shard, e.partial, e.combine, e.offset))
    assert {r.inputs for r in rules} == {(ShardIn(0), ShardIn(0)), (ShardIn(1), ShardIn(1))}


def test_a_broadcasts_signature_keeps_which_output_dims_are_1_not_their_sizes():
    """A broadcast's rules follow which operand dim lands where and which dims are 1, never
    the sizes: the same signature (and table entry) at a model's sizes and at the sweep's,
    while a size-1 dim stays apart."""
    from metaspmd.backends.jax.backend import _AvalOps
    from metaspmd.signature import signature
    import jax

    def sig(x_shape, shape, dims):
        plain_params = signature_params("broadcast_in_dim", {"shape": shape, "broadcast_dimensions": dims,
                                                             "sharding": None}, [x_shape])
        return signature(_AvalOps(), ("x",), (jax.core.ShapedArray(x_shape, "float32"),), plain_params)

    assert sig((64,), (4, 128, 64), (2,)) == sig((6,), (2, 3, 6), (2,))
    assert sig((6,), (2, 3, 6), (2,)) == "x:f[*] broadcast_dimensions=[2] shape='[*,*,*]'"
    assert sig((4, 1), (4, 1, 8), (0, 1)) == "x:f[*,1] broadcast_dimensions=[0,1] shape='[*,1,*]'"
    assert sig((4, 1), (4, 5, 8), (0, 1)) != sig((4, 1), (4, 1, 8), (0, 1))


def test_a_reshape_that_only_adds_or_drops_dims_of_1_is_keyed_by_its_pattern():
    """expand_dims and squeeze as reshapes keep every dim of 2 or more in its place: their
    rules do not depend on the sizes, so the signature writes a pattern; a reshape that
    merges or splits dims keeps its sizes, which decide its rules."""
    from metaspmd.backends.jax.backend import _AvalOps
    from metaspmd.signature import signature
    import jax

    def sig(x_shape, new):
        params = {"new_sizes": new, "dimensions": None, "sharding": None}
        plain_params = signature_params("reshape", params, [x_shape])
        return signature(_AvalOps(), ("x",), (jax.core.ShapedArray(x_shape, "float32"),), plain_params,
                         exact_sizes("reshape", plain_params, x_shape))

    assert sig((8, 16), (8, 16, 1)) == sig((3, 5), (3, 5, 1)) == "x:f[*,*] dimensions=None new_sizes='[*,*,1]'"
    assert sig((32,), (1, 1, 32)) == "x:f[*] dimensions=None new_sizes='[1,1,*]'"
    assert sig((8, 16, 1), (8, 16)) == "x:f[*,*,1] dimensions=None new_sizes='[*,*]'"
    assert sig((8, 16, 32), (8, 16, 4, 8)) == "x:f[8,16,32] dimensions=None new_sizes=[8,16,4,8]"
    assert sig((4, 6), (6, 4, 1)).startswith("x:f[4,6] ")  # as many dims of 2 or more, other sizes
