import numpy as np
import pytest

from metaspmd.planner.choice import ChoiceEdge, ChoiceNode, ChoiceProblem, Infeasible
from metaspmd.planner.ilp import solve_ilp
from metaspmd.planner.reduce import (
    Reductions, colours, eliminate_chains, eliminate_fixed, merge_followers, reduce_problem, tie_identical,
)

pytest.importorskip("mip")


def solve_reduced(p, reductions):
    reduced = reduce_problem(p, reductions)
    sol = solve_ilp(reduced.problem)
    full = reduced.expand(sol.assignment)
    # what the reduced problem claims is what the original assignment costs
    assert p.evaluate(full) == pytest.approx(sol.cost, rel=1e-9, abs=1e-12)
    assert p.feasible(full)
    return reduced, p.evaluate(full)


@pytest.mark.parametrize("seed", range(12))
def test_exact_reductions_keep_the_optimum(make_problem, brute_force, seed):
    p = make_problem(np.random.default_rng(seed), 5, budget=False, ties=seed % 2 == 0, factors=seed % 3 == 0)
    try:
        want, _ = brute_force(p)
    except Infeasible:
        with pytest.raises(Infeasible):
            solve_reduced(p, Reductions.exact())
        return
    reduced, got = solve_reduced(p, Reductions.exact())
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_exact_reductions_keep_the_optimum_under_a_budget(make_problem, brute_force, seed):
    p = make_problem(np.random.default_rng(seed + 50), 5, budget=True)
    want, _ = brute_force(p)
    _, got = solve_reduced(p, Reductions.exact())
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_reductions_carry_the_buffers_under_a_liveness_budget(make_problem, brute_force, seed):
    """Eliminated and merged nodes hand their buffers (held over step ranges) to the node
    that decides them, so a reduced plan meets the budget on the original problem."""
    p = make_problem(np.random.default_rng(seed + 70), 5, budget=True, live=True)
    if seed % 2:  # interchangeable followers: every heuristic step moves buffers too
        p = ChoiceProblem(tuple(ChoiceNode(n.name, n.labels, n.cost, n.memory, "same", True) for n in p.nodes),
                          p.edges, (), p.memory_budget, liveness=p.liveness)
    try:
        want, _ = brute_force(p)
    except Infeasible:
        return
    _, got = solve_reduced(p, Reductions.exact())
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    try:
        _, heuristic = solve_reduced(p, Reductions(follow=True, tie=True, tie_depth=1))
    except Infeasible:
        return  # tying nodes may rule every plan out; the planner then retries exactly
    assert heuristic >= want - 1e-12


@pytest.mark.parametrize("seed", range(8))
def test_heuristic_reductions_give_feasible_plans_no_better_than_optimal(make_problem, brute_force, seed):
    p = make_problem(np.random.default_rng(seed + 100), 5)
    p = ChoiceProblem(tuple(ChoiceNode(n.name, n.labels, n.cost, n.memory, "same", True) for n in p.nodes), p.edges)
    want, _ = brute_force(p)
    _, got = solve_reduced(p, Reductions(follow=True, tie=True, tie_depth=1))
    assert got >= want - 1e-12


def node(name, cost, memory=None, signature="", follower=False):
    cost = np.asarray(cost, dtype=float)
    return ChoiceNode(name, tuple(f"{name}{i}" for i in range(len(cost))), cost,
                      np.zeros(len(cost)) if memory is None else np.asarray(memory, dtype=float), signature, follower)


def test_fixed_nodes_become_constants():
    p = ChoiceProblem(
        (node("a", [1.0]), node("b", [0.0, 2.0])),
        (ChoiceEdge(0, 1, np.array([[5.0, 0.0]])),),
    )
    reduced, origins = eliminate_fixed(p)
    assert len(reduced.nodes) == 1 and reduced.offset == 1.0
    assert list(reduced.nodes[0].cost) == [5.0, 2.0]


def test_a_chain_collapses_to_its_ends():
    # a -> b -> c, b is a two-neighbour node: eliminated exactly
    m = np.array([[0.0, 3.0], [3.0, 0.0]])
    p = ChoiceProblem(
        (node("a", [0.0, 1.0]), node("b", [0.5, 0.0]), node("c", [2.0, 0.0])),
        (ChoiceEdge(0, 1, m), ChoiceEdge(1, 2, m)),
    )
    reduced, origins = eliminate_chains(p)
    assert len(reduced.nodes) <= 1  # the rest is a tree: everything folds away
    full = reduce_problem(p, Reductions(fixed=False, follow=False, tie=False, chains=True)).expand(
        [0] * len(reduced.nodes))
    assert p.evaluate(full) == pytest.approx(1.0)  # a1, b1, c1


def test_chains_keep_nodes_whose_memory_varies_under_a_budget():
    p = ChoiceProblem(
        (node("a", [0.0, 1.0], [1, 2]), node("b", [0.5, 0.0], [1, 2])),
        (ChoiceEdge(0, 1, np.ones((2, 2))),),
        memory_budget=3.0,
    )
    reduced, _ = eliminate_chains(p)
    assert len(reduced.nodes) == 2


def test_followers_take_their_cheapest_response():
    prod = node("prod", [0.0, 0.0])
    foll = node("foll", [0.0, 0.0, 1.0], follower=True)
    m = np.array([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0]])
    reduced, origins = merge_followers(ChoiceProblem((prod, foll), (ChoiceEdge(0, 1, m),)))
    assert len(reduced.nodes) == 1
    assert list(origins[1].table) == [0, 1]  # follow the producer, not the costly third choice


def test_identical_layers_share_one_choice():
    # Two identical three-node chains hanging off one source.
    def chain_nodes(k):
        return [node(f"x{k}", [0.0, 1.0], signature="x"), node(f"y{k}", [1.0, 0.0], signature="y"),
                node(f"z{k}", [0.3, 0.2], signature="z")]

    m = np.array([[0.0, 2.0], [2.0, 0.0]])
    nodes = (node("src", [0.0, 0.0], signature="src"),) + tuple(chain_nodes(0)) + tuple(chain_nodes(1))
    edges = []
    for base in (1, 4):
        edges += [ChoiceEdge(0, base, m), ChoiceEdge(base, base + 1, m), ChoiceEdge(base + 1, base + 2, m)]
    p = ChoiceProblem(nodes, tuple(edges))
    col = colours(p, 3)
    assert col[1] == col[4] and col[2] == col[5] and col[3] == col[6] and len(set(col)) == 4
    reduced, _ = tie_identical(p, 3)
    assert len(reduced.nodes) == 4
    _, got = solve_reduced(p, Reductions(fixed=False, chains=False))
    assert got == pytest.approx(solve_ilp(p).cost)
