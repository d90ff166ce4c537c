"""Sharding planner: strategies on a device mesh, an alpha-beta cost model, graph
reductions, an ILP solver (Python-MIP, imported only when used) and a beam-search baseline.

    mesh = Mesh.of((2, 4), ("dp", "tp"))
    result = plan(ir, strategies_by_node, mesh, memory_budget=16 * 2**30)
    print(result.table())
"""

from ..placement import Partial, Placement, Placements, Replicate, Shard
from .api import SOLVER_CHOICES, evaluate, plan, solve
from .beam import solve_beam
from .choice import ChoiceEdge, ChoiceNode, ChoiceProblem, Infeasible, Solution, Tie, TieMember
from .cost import CostModel, Device, ReshardStep
from .ilp import solve_ilp
from .mesh import Mesh, MeshAxis
from .plan import NodePlan, Plan, Reshard, make_plan
from .problem import Delivery, Flow, PlannerError, ShardingProblem, build_problem
from .reduce import Reduced, Reductions, reduce_problem
from .strategies import AxisStrategy, NodeStrategy, axis_strategies, compose, tensor_placements

__all__ = [
    "AxisStrategy", "ChoiceEdge", "ChoiceNode", "ChoiceProblem", "CostModel", "Delivery", "Device",
    "Flow", "Infeasible", "Mesh", "MeshAxis", "NodePlan", "NodeStrategy",
    "Partial", "Placement", "Placements", "Plan", "PlannerError", "Reduced", "Reductions", "Replicate", "Reshard",
    "ReshardStep", "SOLVER_CHOICES", "Shard", "ShardingProblem", "Solution", "Tie", "TieMember", "axis_strategies",
    "build_problem", "compose", "evaluate", "make_plan", "plan", "reduce_problem", "solve", "solve_beam", "solve_ilp",
    "tensor_placements",
]
