"""End to end: cases of real primitives explored into the expected paper-notation rules."""

import dataclasses

import pytest

pytest.importorskip("jax")

from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.signature import signature  # noqa: E402


def _case(backend, ops, op, sig):
    for case in backend.cases(op):
        if signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes) == sig:
            return case
    raise AssertionError(f"no case {sig} for {op}")


def _strategies(entry):
    return {s.label: (tuple(str(p) for p in s.inputs), tuple(str(o) for o in s.outputs)) for s in entry.strategies()}


@pytest.mark.slow  # 12 s; the jax sweep's --check in CI covers dot_general's rules too
def test_dot_general_matmul_gives_the_mm_rule(backend, ops):
    case = _case(backend, ops, "jax.dot_general", "lhs:f[*,*] rhs:f[*,*] dimension_numbers=[[[1],[0]],[[],[]]]")
    entry = explore_case(case, ops)
    assert entry.status == "ok"
    assert str(entry.shard).startswith("[[S1, S2], [S2, S3]")
    combine = entry.combine.as_dict()
    assert [str(o) for o in combine["S1"]] == ["gather(dim=0)"]
    assert [str(o) for o in combine["S2"]] == ["reduce(sum)"]
    assert [str(o) for o in combine["S3"]] == ["gather(dim=1)"]
    # Partial(sum) in either operand alone: matmul is linear in each.
    assert ("P(sum)", "R") in [s[0] for s in _strategies(entry).values()]


@pytest.mark.slow  # a whole exploration of the op, verification included: 8 s
def test_a_plain_cut_the_sample_shows_nothing_about_is_verified_on_lengthened_data(backend, ops):
    # the mask program's operands repeat along dims 0 and 1 (halves alike), and eq of blind
    # random floats is all False: the plain cuts are verified with those dims lengthened
    case = _case(backend, ops, "jax.eq", "x:f[*,*,*,*] y:f[*,*,*,1]")
    entry = explore_case(case, ops)
    assert _strategies(entry)["S1"] == (("S(0)", "S(0)"), ("gather(dim=0)",))
    assert "plain cut of x dim 0: verified with that dim lengthened from 2 to 3 by random data" in entry.notes


def test_add_gives_elementwise_rule(backend, ops):
    case = _case(backend, ops, "jax.add", "x:f[*,*] y:f[*,*]")
    entry = explore_case(case, ops)
    assert str(entry.shard) == "[[S1, S2], [S1, S2]]"
    assert str(entry.combine).startswith("{S1: gather(dim=0), S2: gather(dim=1)")


def test_a_cast_to_bool_is_verified_on_data_with_zeros(backend, ops):
    # the flax program's float 0/1 attention mask cast to bool: on random floats every
    # element is True and no trial tells a cut apart; zeros planted in the data do
    case = _case(backend, ops, "jax.convert_element_type", "x:f[*,1,*,*] new_dtype='bool' weak_type=False")
    entry = explore_case(case, ops)
    assert entry.status == "ok"
    cuts = {s[0][0]: s[1] for s in _strategies(entry).values()}
    assert cuts["S(0)"] == ("gather(dim=0)",) and cuts["S(2)"] == ("gather(dim=2)",)


@pytest.mark.slow  # 10 s
def test_broadcast_in_dim_shards_through_its_shape_param(backend, ops):
    case = backend.cases("jax.broadcast_in_dim")[0]
    entry = explore_case(case, ops)
    gathers = [o for s in entry.strategies() for o in s.outputs if str(o).startswith("gather")]
    assert entry.status == "ok" and gathers  # only possible because `shape` follows the shards


def test_reduce_max_combines_with_max(backend, ops):
    case = _case(backend, ops, "jax.reduce_max", "x:f[*,*] axes=[0]")
    entry = explore_case(case, ops)
    assert ("S(0)",) in [s[0] for s in _strategies(entry).values()]
    assert any(s[1] == ("reduce(max)",) for s in _strategies(entry).values())


def test_complex_max_combines_in_lexicographic_order(backend, ops):
    # jax orders complex numbers by real part, then imaginary: the max of local maxima
    case = _case(backend, ops, "jax.reduce_max", "x:c[*,*] axes=[0]")
    assert (("S(0)",), ("reduce(max)",)) in _strategies(explore_case(case, ops)).values()


def test_reduce_init_is_the_identity_so_a_cut_reduced_dim_sums(backend, ops):
    # the harness passes init 3 to an add-reduce; jax.lax.reduce leaves that undefined (XLA
    # drops the init of a one-row shard), so the case takes the identity, 0, and keeps it
    case = _case(backend, ops, "jax.reduce", "operands:[f[*,*]] init_values:[f[]] dimensions=[0] jaxpr='{add}'")
    assert float(case.args[1][0]) == 0.0 and "init_values" in case.fixed
    entry = explore_case(case, ops)
    assert (("S(0)", "R"), ("reduce(sum)",)) in _strategies(entry).values()
    assert any(note.startswith("init_values: the identity") for note in entry.notes)


def test_a_fill_value_beside_a_short_dim_allows_widening(backend, ops):
    # pad's integer padding_value is a value, not a position: the halo search lengthens the
    # dim of 3 (cropped by one at each end) to prove its halo on three shards. Local params
    # (the outer shards crop) come first, so the halo search runs without them
    case = _case(backend, ops, "jax.pad", "operand:i[*,*] padding_value:i[] padding_config=[[0,0,0],[-1,-1,0]]")
    assert any(p == "S(1, local)" for s in _strategies(explore_case(case, ops)).values() for p in s[0])
    entry = explore_case(dataclasses.replace(case, localize=None), ops)
    assert any(p.startswith("S(1, halo=") for s in _strategies(entry).values() for p in s[0]), _strategies(entry)
    assert any("lengthened from 3 to 6" in note for note in entry.notes)


SELECT_AND_SCATTER = ("operands:[f[*,*],f[*,*],f[]] padding=[[0,0],[0,0]] scatter_consts=[] scatter_jaxpr='{add}' "
                      "select_consts=[] select_jaxpr='{ge}' window_dimensions=[2,2] window_strides=[2,2]")
SELECT_AND_SCATTER_ADD = ("source:i[1,*,*] operand:i[*,*,*] padding=[[0,0],[0,0],[0,0]] select_prim='ge' "
                          "window_dimensions=[2,2,2] window_strides=[1,1,1]")


@pytest.mark.slow  # a whole exploration of the op, verification included: 6 s
def test_a_window_operand_is_cut_in_proportion_to_its_source(backend, ops):
    # windows of 2 at stride 2: the operand [8, 6] is cut at twice the source [4, 3]'s
    # boundaries, so every window and its source element share a shard
    case = _case(backend, ops, "jax.select_and_scatter", SELECT_AND_SCATTER)
    strategies = _strategies(explore_case(case, ops)).values()
    assert (("S(0, scale=2, extend=0)", "S(0)", "R"), ("gather(dim=0)",)) in strategies
    # stride 1: a shard's last window reaches one element into the next shard's operand,
    # and both shards scatter into that element, whose parts add up
    case = _case(backend, ops, "jax.select_and_scatter_add", SELECT_AND_SCATTER_ADD)
    strategies = _strategies(explore_case(case, ops)).values()
    assert (("S(1)", "S(1, scale=1, extend=1)"), ("gather(dim=1, overlap=1)",)) in strategies


def test_a_bool_window_op_overlaps_by_or(backend, ops):
    # bools add by or, the two shards' scatters into their shared element too; checked on
    # every split, the halo that dropped one of them (it held on one split in five) is gone
    sig = SELECT_AND_SCATTER_ADD.replace("i[", "b[")
    strategies = _strategies(explore_case(_case(backend, ops, "jax.select_and_scatter_add", sig), ops)).values()
    assert (("S(1)", "S(1, scale=1, extend=1)"), ("gather(dim=1, overlap=1)",)) in strategies
    assert not any("halo" in o for s in strategies for o in s[1])


def test_a_scatter_mul_takes_its_operand_as_partial_prod(backend, ops):
    # updates cut along the scatter dim: each shard multiplies its own updates into the
    # operand, so the operand must count once in the product: Partial(prod), ones elsewhere
    case = next(c for c in backend.cases("jax.scatter-mul") if len(c.args[1].shape) == 3)
    strategies = _strategies(explore_case(case, ops)).values()
    assert (("P(prod)", "S(0)", "S(1)"), ("reduce(prod)",)) in strategies
    assert not any(s[1] == ("reduce(sum)",) and s[0][0] == "P(sum)" and s[0][2] != "R" for s in strategies)


@pytest.mark.slow  # a whole exploration of the op, verification included: 6 s
def test_a_gather_that_clamps_positions_runs_its_dropping_form_on_shards(backend, ops):
    # x[idx] binds PROMISE_IN_BOUNDS, which XLA clamps like CLIP: a shard's positions past its
    # edge would read the edge. Clamped first, then offset, the FILL_OR_DROP form reads zero
    # there, so the shards sum (vocab-parallel); blind trials bring positions out of range.
    # Slice sizes [1,3,2] of a [2,3,3] operand: the whole of dim 1 follows its length on the
    # lengthened trials, and positions are clamped by the sizes fitted to them
    for mode, size in (("PROMISE_IN_BOUNDS", "slice_sizes=[1,5]"), ("CLIP", "slice_sizes=[1,10,10]"),
                       ("PROMISE_IN_BOUNDS", "slice_sizes=[1,3,2]")):
        case = next(c for c in backend.cases("jax.gather") if mode in str(c.kwargs.get("mode"))
                    and size in signature(ops, c.arg_names, c.args, c.kwargs))
        strategies = _strategies(explore_case(case, ops)).values()
        assert any(s[0][0] == "S(0)" and s[0][1].endswith("drop)") and s[1] == ("reduce(sum)",) for s in strategies)
        plain = dataclasses.replace(case, dropping=None)  # the op itself on every shard: no such rule
        assert not any("O" in p for s in _strategies(explore_case(plain, ops)).values() for p in s[0])
        unclamped = dataclasses.replace(case, in_range=None)  # offsets of positions the op clamps
        assert not any("drop" in p for s in _strategies(explore_case(unclamped, ops)).values() for p in s[0])


def test_an_update_slice_drops_what_falls_outside_a_shard(backend, ops):
    # dynamic_update_slice clamps its start so the update fits; on a shard of the operand the
    # clamped start, less the shard's start, places the update partly outside: the dropping
    # form writes the elements that fall inside and drops the others, one by one
    case = _case(backend, ops, "jax.dynamic_update_slice", "operand:f[*,*] update:f[*,1] start_indices:[i[],i[]]")
    strategies = _strategies(explore_case(case, ops)).values()
    assert (("S(0)", "R", "O(drop)", "R"), ("gather(dim=0)",)) in strategies
    assert (("S(1)", "R", "R", "O(drop)"), ("gather(dim=1)",)) in strategies


@pytest.mark.slow  # a whole exploration of the op, verification included: 7 s
def test_a_slice_of_a_cut_dim_runs_on_each_shard_with_its_own_bounds(backend, ops):
    # slice [1:2] of 3 rows: the shard holding row 1 keeps it, the others keep nothing; the
    # uneven local outputs concatenate to the slice (Shardy's permutation factor)
    case = _case(backend, ops, "jax.slice", "x:f[*] limit_indices=[2] start_indices=[1] strides=None")
    assert (("S(0, local)",), ("gather(dim=0)",)) in _strategies(explore_case(case, ops)).values()
    # re-based params fix the cut dim alone: dim 2, sliced whole, keys the rule by its
    # size (10 of a dim of 10; of a dim of 20 the slice is not whole), and every shard
    # slices all of its own there
    case = _case(backend, ops, "jax.slice", "x:f[*,*,10] limit_indices=[1,2,10] start_indices=[0,1,0] strides=None")
    assert (("S(0, local)",), ("gather(dim=0)",)) in _strategies(explore_case(case, ops)).values()
    # each piece of a split keeps its part of the shard; unstack's pieces come from the shard
    # that holds them, zeros elsewhere, so they sum
    case = _case(backend, ops, "jax.split", "x:f[*,*] axis=1 sizes=[2,3,1]")
    assert (("S(1, local)",), ("gather(dim=1)",) * 3) in _strategies(explore_case(case, ops)).values()
    case = _case(backend, ops, "jax.unstack", "x:f[*,*,*] axis=1")
    assert (("S(1, local)",), ("reduce(sum)",) * 3) in _strategies(explore_case(case, ops)).values()
    # without re-based params no shard can run the slice
    plain = dataclasses.replace(case, localize=None)
    assert not any("local" in p for s in _strategies(explore_case(plain, ops)).values() for p in s[0])


def test_strided_slice_bounds_re_base_to_the_shard():
    from metaspmd.backends.jax.local_params import _rebase_slice, _rebase_split

    params = {"start_indices": (1,), "limit_indices": (10,), "strides": (3,)}  # rows 1, 4, 7
    assert _rebase_slice(params, 0, 0, 5, 10)["start_indices"] == (1,)  # rows 1, 4
    assert _rebase_slice(params, 0, 0, 5, 10)["limit_indices"] == (5,)
    assert (_rebase_slice(params, 0, 5, 10, 10)["start_indices"], _rebase_slice(params, 0, 5, 10, 10)["limit_indices"]) == ((2,), (5,))  # row 7
    assert _rebase_slice(params, 0, 8, 10, 10)["limit_indices"] == (0,)  # none held: empty
    assert _rebase_slice({"start_indices": (0,), "limit_indices": (10,), "strides": None}, 0, 0, 5, 10) is None
    assert _rebase_split({"sizes": (2, 3, 1), "axis": 1}, 1, 3, 6, 6)["sizes"] == (0, 2, 1)
    assert _rebase_split({"sizes": (2, 3, 1), "axis": 1}, 0, 0, 2, 4) is None


@pytest.mark.slow  # 8 s; the proportional and overlapping window cuts are checked in the default job
def test_a_padded_window_op_pads_only_its_outer_shards(backend, ops):
    # select_and_scatter_add with padding (1, 1): a shard of windows reads its operand range
    # one element early; the first shard's range starts in the padding, which it pads, and
    # the inner shards read their neighbours' elements instead. Dim 0 (operand 2, source 3)
    # is too short for three shards that each read part of it: lengthened, and noted
    sig = SELECT_AND_SCATTER_ADD.replace("source:i[1,*,*] operand:i", "source:f[*,*,*] operand:f").replace("[[0,0],[0,0],[0,0]]", "[[1,1],[1,1],[1,1]]")
    entry = explore_case(_case(backend, ops, "jax.select_and_scatter_add", sig), ops)
    strategies = _strategies(entry).values()
    for d in range(3):
        assert ((f"S({d})", f"S({d}, scale=1, extend=1, local)"), (f"gather(dim={d}, overlap=1)",)) in strategies
    assert any("lengthened from 3 to 6" in n for n in entry.notes)
    unpadded = dataclasses.replace(_case(backend, ops, "jax.select_and_scatter_add", sig), padding=None)
    assert not any(p.startswith("S") for s in _strategies(explore_case(unpadded, ops)).values() for p in s[0])


def test_a_pad_of_a_cut_dim_pads_only_the_outer_ends_of_the_outer_shards():
    # low padding on the first shard, high on the last, and each inner boundary keeps the
    # interior padding after its shard's last element: the pieces concatenate to the pad
    import jax.numpy as jnp
    from jax import lax

    from metaspmd.backends.jax.local_params import _rebase_pad

    x = jnp.arange(1.0, 8.0)
    for config in ((2, 3, 1), (-1, 2, 0), (0, -2, 2)):
        params = {"padding_config": (config,)}
        want = lax.pad(x, 0.0, (config,))
        pieces = [lax.pad(x[a:b], 0.0, _rebase_pad(params, 0, a, b, 7)["padding_config"]) for a, b in ((0, 3), (3, 5), (5, 7))]
        assert jnp.array_equal(jnp.concatenate(pieces), want), config
    assert _rebase_pad({"padding_config": ((0, 0, 0),)}, 0, 0, 3, 7) is None


def _entry(ops, prim, params, x_shape):
    """The explored entry of one call of ``prim`` on a random operand of ``x_shape``."""
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from metaspmd.backends.jax.backend import PrimitiveCall
    from metaspmd.backends.jax.params import exact_sizes, signature_params
    from metaspmd.case import OpCase

    x = jnp.asarray(np.random.default_rng(0).standard_normal(x_shape))
    call = PrimitiveCall(getattr(lax, f"{prim}_p"), params, (x_shape,))
    kwargs = signature_params(prim, params, [x_shape])
    case = OpCase(op=f"jax.{prim}", fn=call, args=(x,), kwargs=kwargs, arg_names=("x",), widen=True,
                  exact_sizes=exact_sizes(prim, kwargs, x_shape))
    return signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes), explore_case(case, ops)


def test_a_broadcast_or_a_unit_reshape_finds_the_same_rules_at_any_sizes_of_one_pattern(ops):
    """The signature writes a broadcast's shape, and the new sizes of a reshape that only
    adds or drops dims of 1, as their pattern of 1s: the rules explored at one model's sizes
    are those at another's, as one table entry claims."""
    def broadcast(x_shape, shape):
        return _entry(ops, "broadcast_in_dim", {"shape": shape, "broadcast_dimensions": (0, 1), "sharding": None},
                      x_shape)

    def reshape(x_shape, new):
        return _entry(ops, "reshape", {"new_sizes": new, "dimensions": None, "sharding": None}, x_shape)

    for small, large, sig in [
        (broadcast((6, 1), (6, 1, 3)), broadcast((10, 1), (10, 1, 7)),
         "x:f[*,1] broadcast_dimensions=[0,1] shape='[*,1,*]'"),
        (reshape((6, 5), (6, 1, 5)), reshape((10, 7), (10, 1, 7)), "x:f[*,*] dimensions=None new_sizes='[*,1,*]'"),
    ]:
        assert small[0] == large[0] == sig
        assert _strategies(small[1]) == _strategies(large[1])
        assert (("S(0)",), ("gather(dim=0)",)) in _strategies(small[1]).values()
