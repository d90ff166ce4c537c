from metaspmd import spec
from metaspmd.planner.mesh import Mesh
from metaspmd.placement import Partial, Replicate, Shard
from metaspmd.planner.strategies import axis_strategies, compose, tensor_placements
from metaspmd.target import DTENSOR_PLAN, JAX_PLAN, project
from metaspmd.planner.synthetic import mm_rules, rules

R = Replicate()


def test_rule_strategies_map_to_placements():
    s1, s2, s3, s4, _ = mm_rules()
    assert project(s1, DTENSOR_PLAN).inputs == (Shard(0), R) and project(s1, DTENSOR_PLAN).outputs == (Shard(0),)
    assert project(s2, DTENSOR_PLAN).inputs == (Shard(1), Shard(0)) and project(s2, DTENSOR_PLAN).outputs == (Partial("sum"),)
    assert project(s4, DTENSOR_PLAN).inputs == (Partial("sum"), R)


def test_halo_and_block_strategies_are_not_runnable():
    halo_in = spec.Strategy("S1", (spec.ShardIn(0, halo=1),), (spec.OutputCombine.parse("gather(dim=0)"),))
    block_out = spec.Strategy("S2", (spec.ShardIn(0),), (spec.OutputCombine.parse("gather(dim=0, block=2)"),))
    halo_out = spec.Strategy("S3", (spec.ShardIn(0),), (spec.OutputCombine.parse("gather(dim=0, halo=2)"),))
    assert not project(halo_in, DTENSOR_PLAN) and not project(block_out, DTENSOR_PLAN) and not project(halo_out, DTENSOR_PLAN)
    # no public Partial placement reduces by the 2-norm
    norm = spec.Strategy("S4", (spec.ShardIn(0),), (spec.OutputCombine.parse("reduce(norm2)"),))
    assert not project(norm, DTENSOR_PLAN)
    # nor by shard order: a scan(sum) is no Partial(sum), a reversed gather no Shard(0)
    for text in ("scan(dim=0, op=sum)", "gather(dim=0, reverse=true)"):
        assert not project(spec.Strategy("S5", (spec.ShardIn(0),), (spec.OutputCombine.parse(text),)), DTENSOR_PLAN)
    # nor offset positions: a framework would hand each shard the indices unchanged
    lookup = spec.Strategy("S6", (spec.ShardIn(0), spec.IndexOffset()), (spec.OutputCombine.parse("reduce(sum)"),))
    assert not project(lookup, DTENSOR_PLAN)


def test_replicate_is_preferred_among_equivalent_combines():
    s = spec.Strategy("S1", (spec.ShardIn(0),), (spec.OutputCombine.parse("reduce(max) | identity"),))
    assert project(s, DTENSOR_PLAN).outputs == (R,)
    s = spec.Strategy("S1", (spec.ShardIn(0),), (spec.OutputCombine.parse("gather(dim=0, block=2) | reduce(sum)"),))
    assert project(s, DTENSOR_PLAN).outputs == (Partial("sum"),)


def test_all_replicate_comes_first_and_duplicates_or_wrong_arity_go():
    out = axis_strategies(mm_rules() + mm_rules()[:1] + rules("[[S1]]", "{S1: gather(dim=0)}"), 2, 1)
    assert [a.label for a in out] == ["R", "S1", "S2", "S3", "S4", "S5"]
    assert out[0].inputs == (R, R) and out[0].outputs == (R,)


def test_composition_on_a_2d_mesh():
    mesh = Mesh.of((2, 4))
    per_axis = axis_strategies(mm_rules(), 2, 1)
    ss = compose(per_axis, mesh, [(16, 8), (8, 12)], [(16, 12)])
    by_label = {s.label: s for s in ss}
    # both axes split rows: DTensor's [Shard(0), Shard(0)]
    assert by_label["S1,S1"].inputs[0] == (Shard(0), Shard(0)) and by_label["S1,S1"].outputs[0] == (Shard(0), Shard(0))
    # rows over one axis, columns over the other
    assert by_label["S1,S3"].inputs == ((Shard(0), R), (R, Shard(1)))
    assert by_label["S1,S3"].outputs[0] == (Shard(0), Shard(1))
    # the contraction over both axes: Partial on both
    assert by_label["S2,S2"].outputs[0] == (Partial("sum"), Partial("sum"))
    # 12 columns do not split 8 ways, 8 contraction elements do
    assert "S3,S3" not in by_label and "S2,S2" in by_label
    assert ss[0].label == "R,R"
    assert len(ss) == len({(s.inputs, s.outputs) for s in ss})


def test_strict_mode_drops_uneven_splits():
    mesh = Mesh.of(4)
    per_axis = axis_strategies(mm_rules(), 2, 1)
    strict = {s.label for s in compose(per_axis, mesh, [(6, 8), (8, 12)], [(6, 12)])}
    loose = {s.label for s in compose(per_axis, mesh, [(6, 8), (8, 12)], [(6, 12)], strict=False)}
    assert "S1" not in strict and "S1" in loose


def test_mixed_partial_reductions_are_dropped():
    mesh = Mesh.of((2, 2))
    per_axis = axis_strategies(
        rules("[[S1, N]]", "{S1: reduce(sum)}") + rules("[[N, S1]]", "{S1: reduce(max)}"), 1, 1)
    labels = {s.label for s in compose(per_axis, mesh, [(4, 4)], [(4,)])}
    assert "S1,S1" in labels and "S1,S2" not in labels


def test_tensor_placements_are_replicate_or_shard():
    ps = tensor_placements((4, 6), Mesh.of((2, 2)))
    assert (R, R) in ps and (Shard(0), Shard(1)) in ps and (Shard(1), Shard(1)) not in ps  # 6 % 4
    assert not any(isinstance(x, Partial) for p in ps for x in p)


def test_argreduce_outputs_are_pending_arg_reductions_where_the_runtime_finishes_them():
    s = spec.Strategy("S1", (spec.ShardIn(0),), (spec.OutputCombine.parse("argreduce(max, input=0)"),))
    assert not project(s, DTENSOR_PLAN)  # DTensor has no such Partial
    assert project(s, JAX_PLAN).outputs == (Partial("argmax"),)  # JAX: XLA gathers the pairs


def test_index_offsets_enter_replicate_where_the_compiler_moves_the_positions():
    # a gather into an operand cut along the dim its positions index: Shardy offsets and masks
    # the replicated positions itself (a vocab-parallel lookup); DTensor would not move them
    s = spec.Strategy("S1", (spec.ShardIn(0), spec.IndexOffset(None)), (spec.OutputCombine.parse("reduce(sum)"),))
    assert not project(s, DTENSOR_PLAN)
    a = project(s, JAX_PLAN)
    assert a.inputs == (Shard(0), Replicate()) and a.outputs == (Partial("sum"),)


def test_a_slice_of_a_cut_dim_keeps_it_cut_where_the_compiler_evens_out_the_pieces():
    # local params (a slice, split): Shardy's permutation factor, a neighbour exchange the node
    # makes itself, charged to it on each axis that cuts it; DTensor cannot run uneven pieces
    s = spec.Strategy("S1", (spec.ShardIn(1, local=True),), (spec.OutputCombine.parse("gather(dim=1)"),))
    assert not project(s, DTENSOR_PLAN)
    a = project(s, JAX_PLAN)
    assert a.inputs == (Shard(1),) and a.outputs == (Shard(1),) and a.exchange
    mesh = Mesh.of((2, 2))
    node = next(n for n in compose([a, axis_strategies([], 1, 1)[0]], mesh, [(8, 8)], [(8, 4)]) if n.label == "R,S1")
    assert node.exchanges == (1,)
    # unstack's pieces held by one shard each come out Partial: not something to even out
    held = spec.Strategy("S1", (spec.ShardIn(1, local=True),), (spec.OutputCombine.parse("reduce(sum)"),))
    assert not project(held, JAX_PLAN)


def test_halos_keep_the_dim_cut_where_the_compiler_exchanges_edge_rows():
    # a convolution's input read one row past each shard, the output's halo dropped: JAX's
    # partitioner exchanges the rows (an exchange charged to the node); DTensor cannot
    conv = spec.Strategy("S1", (spec.ShardIn(2, halo=1), spec.Replicate()),
                         (spec.OutputCombine.parse("gather(dim=2, halo=(0, 1))"),))
    assert not project(conv, DTENSOR_PLAN)
    a = project(conv, JAX_PLAN)
    assert a.inputs == (Shard(2), Replicate()) and a.outputs == (Shard(2),) and a.exchange
    # a plain gather beside the halo one is preferred, and needs no exchange of its own
    both = spec.Strategy("S2", (spec.ShardIn(0),), (spec.OutputCombine.parse("gather(dim=0) | gather(dim=0, halo=1)"),))
    assert not project(both, JAX_PLAN).exchange
    # the weight gradient of a halo cut is a Partial sum: the rows are exchanged all the same
    grad = spec.Strategy("S3", (spec.ShardIn(2, halo=1), spec.ShardIn(2)), (spec.OutputCombine.parse("reduce(sum)"),))
    g = project(grad, JAX_PLAN)
    assert g.outputs == (Partial("sum"),) and g.exchange
    # blocks, reversed gathers and overlaps stay out
    for text in ("gather(dim=0, block=2)", "gather(dim=0, reverse=true)", "gather(dim=0, overlap=1)"):
        assert not project(spec.Strategy("S4", (spec.ShardIn(0),), (spec.OutputCombine.parse(text),)), JAX_PLAN)


def test_dims_cut_by_one_label_must_have_one_length():
    """A label cuts its dims at the same bounds, verified on dims of one length: gather's
    index narrower than self, both cut along a dim it does not gather, would take the wrong
    columns on every shard but the first. Each part of a joint of independent parts
    (S1+S3) is checked on its own label."""
    from metaspmd.ir import MetaOp, MetaVar
    from metaspmd.planner.problem import _node_rules
    from metaspmd.target import cuts_line_up

    gather = spec.OutputCombine.parse("gather(dim=1)")
    cols = spec.Strategy("S1", (spec.ShardIn(1), spec.ShardIn(1)), (gather,))
    assert cuts_line_up(cols, [(4, 6), (4, 6)], {})
    assert not cuts_line_up(cols, [(4, 6), (4, 4)], {})
    first = spec.Strategy("S1", (spec.ShardIn(0), R_IN), (gather, R_OUT))
    second = spec.Strategy("S3", (R_IN, spec.ShardIn(0)), (R_OUT, gather))
    joint = spec.Strategy("S1+S3", (spec.ShardIn(0), spec.ShardIn(0)), (gather, gather))
    assert cuts_line_up(joint, [(4, 6), (8, 6)], {"S1": first, "S3": second})

    ins = (MetaVar("self", (4, 6)), MetaVar("index", (4, 4), "int64"))
    op = MetaOp("g", "aten.gather.default", (ins[0], 0, ins[1]), outputs=(MetaVar("out", (4, 4)),))
    rows = spec.Strategy("S2", (spec.ShardIn(0), spec.ShardIn(0)), (spec.OutputCombine.parse("gather(dim=0)"),))
    assert [r.label for r in _node_rules(op, [cols, rows], ins)] == ["R", "S2"]


R_IN, R_OUT = spec.Replicate(), spec.OutputCombine.parse("identity")


def test_a_lookup_the_framework_masks_is_cut_by_its_rows_along_one_mesh_axis_only():
    """DTensor's row-cut embedding keeps one mask per lookup: a table cut by its rows along
    both axes of a 2x2 mesh raises inside DTensor ("MaskBuffer has been materialized with
    conflicting data"), so the plan never asks for it. JAX's partitioner offsets positions
    itself and takes the rows cut along both axes."""
    rows = spec.Strategy("S1", (spec.ShardIn(0), spec.IndexOffset(drop=True)), (spec.OutputCombine.parse("reduce(sum)"),))
    cols = spec.Strategy("S2", (spec.ShardIn(1), spec.Replicate()), (spec.OutputCombine.parse("gather(dim=2)"),))
    mesh, shapes, out = Mesh.of((2, 2)), [(16, 4), (2, 3)], [(2, 3, 4)]
    dtensor = [project(s, DTENSOR_PLAN, "aten.embedding.default") for s in (rows, cols)]
    assert dtensor[0].masked and not dtensor[1].masked
    labels = {n.label for n in compose(dtensor, mesh, shapes, out)}
    assert "S1,S1" not in labels and {"S1,S2", "S2,S1", "S2,S2"} <= labels
    jax = [project(s, JAX_PLAN, "aten.embedding.default") for s in (rows, cols)]
    assert not jax[0].masked and "S1,S1" in {n.label for n in compose(jax, mesh, shapes, out)}
