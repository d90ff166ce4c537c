import pytest

from metaspmd.planner.mesh import Mesh
from metaspmd.placement import Partial, Replicate, Shard, is_valid, local_shape, shard_factor

R = Replicate()


def test_mesh_of_builds_named_axes_with_alpha_beta():
    mesh = Mesh.of((2, 4), ("dp", "tp"), alpha=(1e-5, 2e-6), bandwidth=(25e9, 200e9))
    assert mesh.shape == (2, 4) and mesh.names == ("dp", "tp") and mesh.size == 8 and mesh.ndim == 2
    assert mesh.axes[0].alpha == 1e-5 and mesh.axes[1].beta == pytest.approx(1 / 200e9)


@pytest.mark.parametrize("kwargs", [
    dict(shape=(2, 2), names=("a", "a")),
    dict(shape=(2, 2), names=("a",)),
    dict(shape=(0,)),
    dict(shape=(2,), bandwidth=0),
    dict(shape=(2, 2), alpha=(1.0,)),
])
def test_mesh_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        Mesh.of(**kwargs)


@pytest.mark.parametrize("shape,names,message", [
    (("4",), ("x",), r"mesh axis 'x': its size must be an int, got '4'"),
    ((2.5,), ("x",), r"mesh axis 'x': its size must be an int, got 2.5"),
    ((True,), ("x",), r"mesh axis 'x': its size must be an int, got True"),
    ((2,), (0,), r"a mesh axis name must be a str, got 0"),
])
def test_mesh_names_a_size_or_name_of_the_wrong_type(shape, names, message):
    """'4' < 1 raised "'<' not supported"; 2.5 was taken."""
    with pytest.raises(TypeError, match=message):
        Mesh.of(shape, names)


def test_two_axes_may_split_one_dim_and_must_divide_it():
    assert shard_factor((Shard(0), Shard(0)), (2, 4), 0) == 8
    assert is_valid((Shard(0), Shard(0)), (16, 3), (2, 4))
    assert not is_valid((Shard(0), Shard(0)), (12, 3), (2, 4))  # 12 % 8 != 0
    assert is_valid((Shard(0), Shard(0)), (12, 3), (2, 4), strict=False)
    assert not is_valid((Shard(1), R), (4, 3), (2, 4))  # uneven split, strict
    assert is_valid((Shard(1), R), (4, 3), (2, 4), strict=False)  # uneven allowed: 3 rows over 2
    assert not is_valid((Shard(1), R), (4, 1), (2, 4), strict=False)  # fewer elements than devices


def test_invalid_placements():
    assert not is_valid((Shard(2),), (4, 4), (2,))  # no such dim
    assert not is_valid((Partial("sum"), Partial("max")), (4,), (2, 2))  # reductions do not commute
    assert is_valid((Partial("sum"), Partial("sum")), (4,), (2, 2))
    assert not is_valid((R,), (4,), (2, 2))  # one entry per mesh axis


def test_local_shape_rounds_uneven_splits_up():
    assert local_shape((Shard(1), Shard(0)), (10, 8), (2, 4)) == (3, 4)
    assert local_shape((Partial("sum"), R), (10, 8), (2, 4)) == (10, 8)
