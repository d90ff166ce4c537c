"""Constraints: placements a user already decided (a batch on dp, a weight column-cut)
are honoured by the plan, and a constraint no plan can meet is refused by name."""

import pytest

from metaspmd import spec
from metaspmd.ir import MetaIR, MetaOp, MetaVar
from metaspmd.placement import Partial, Replicate, Shard
from metaspmd.planner import Mesh, PlannerError, plan

R = Replicate()


def mm_rules():
    shard = spec.ShardSpec.parse("[[S1, S2], [S2, S3]]")
    partial = spec.PartialSpec(((), ()))
    return tuple(spec.strategies(shard, partial, spec.CombineSpec.parse(
        "{S1: gather(dim=0), S2: reduce(sum), S3: gather(dim=1)}")))


def one_matmul():
    x, w, y = MetaVar("x", (64, 32)), MetaVar("w", (32, 16)), MetaVar("y", (64, 16))
    return MetaIR((x, w), (MetaOp("mm", "aten.mm.default", (x, w), {}, (y,)),), (y,))


def test_an_input_constraint_is_kept_where_the_planner_would_choose_otherwise():
    ir, mesh = one_matmul(), Mesh.of((4,), ("tp",))
    free = plan(ir, {"mm": mm_rules()}, mesh)
    assert free.placement("w") != (Shard(1),)  # cutting the small weight is not the free choice
    pinned = plan(ir, {"mm": mm_rules()}, mesh, constraints={"w": (Shard(1),)})
    assert pinned.placement("w") == (Shard(1),)
    assert pinned.strategy("mm").inputs[1] == (Shard(1),)  # no reshard: the matmul runs column-parallel


def test_an_output_constraint_picks_the_ops_strategy():
    ir, mesh = one_matmul(), Mesh.of((4,), ("dp",))
    p = plan(ir, {"mm": mm_rules()}, mesh, constraints={"y": (Shard(0),)})
    assert p.strategy("mm").outputs == ((Shard(0),),)


def test_constraints_that_cannot_hold_are_refused_by_name():
    ir, mesh = one_matmul(), Mesh.of((4,), ("dp",))
    with pytest.raises(PlannerError, match="'z'"):
        plan(ir, {"mm": mm_rules()}, mesh, constraints={"z": (R,)})
    with pytest.raises(PlannerError, match="cannot place shape"):
        plan(ir, {"mm": mm_rules()}, mesh, constraints={"w": (Shard(2),)})
    # no rule of the matmul leaves its output pending a max
    with pytest.raises(PlannerError, match="no strategy of mm"):
        plan(ir, {"mm": mm_rules()}, mesh, constraints={"y": (Partial("max"),)})
