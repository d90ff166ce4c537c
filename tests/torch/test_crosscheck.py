"""The DTensor cross-check: DTensor's side, our side, the numerical checks and the report."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # the OpInfo database needs it

from metaspmd.backends.torch import crosscheck, crosscheck_numerics, get_backend  # noqa: E402
from metaspmd.backends.torch.backend import make_runner  # noqa: E402
from metaspmd.backends.torch.crosscheck_dtensor import (  # noqa: E402
    NORM2, AnswerCache, DTensorAnswer, DTensorQuery, QueryConfig, canonical_names, dtensor_answer, dtensor_support,
    placement,
)
from metaspmd.backends.torch.crosscheck_numerics import (  # noqa: E402
    FreshInputs, Trial, check_foreign_rule, chunk_bounds, partial_parts, reverify, run_trial,
)
from metaspmd.backends.torch.crosscheck_real import REAL_CANNOT_RUN, REAL_RAISES, replay  # noqa: E402
from metaspmd.case import OpCase  # noqa: E402
from metaspmd.explorer import explore_case, explore_op  # noqa: E402
from metaspmd.registry_io import write_record  # noqa: E402
from metaspmd.signature import signature  # noqa: E402
from metaspmd.spec import ArgReduce, CombineSpec, Gather, Identity, PartialInput, Reduce, Replicate, Scan, ShardIn  # noqa: E402

OPS = ("aten.mm.default", "aten.add.Tensor", "aten.sum.dim_IntList", "aten.relu.default", "aten.scatter_reduce.two")
OPINFOS = ("mm", "add", "sum", "nn.functional.relu", "scatter_reduce")
MM = torch.ops.aten.mm.default
WRONG_RELU = "{S1: gather(dim=1), S2: gather(dim=1), S3: gather(dim=2)}"  # S1 shards dim 0, not 1
WRONG_MM = "{S1: gather(dim=1), S2: reduce(sum), S3: gather(dim=1)}"  # S1 cuts self's rows: dim 0


@pytest.fixture(scope="module")
def backend():
    return get_backend(opinfos=OPINFOS, max_signatures=2)  # two examples per op keep the module fast


@pytest.fixture(scope="module")
def records(backend):
    return {op: explore_op(backend, op) for op in OPS}


@pytest.fixture(scope="module")
def report(backend, records):
    results = [crosscheck.crosscheck_op(backend, op, records[op]) for op in OPS]
    return crosscheck.Report(crosscheck.Config(), results)


def _case(func, *args, out_spec=None, **kwargs) -> OpCase:
    names = tuple(a.name for a in func._schema.arguments if not a.kwarg_only)
    return OpCase(str(func), make_runner(func, out_spec), args, kwargs, names[: len(args)])


def _answer(case: OpCase, backend, **config) -> dict:
    out = case.call(case.args, dict(case.kwargs))
    query = DTensorQuery(_func(case), case, backend.tensor_ops(), 2, out)
    return dtensor_answer(query, QueryConfig(**config)).accepted


def _func(case: OpCase):
    family, overload = case.op.split(".")[1:]
    return getattr(getattr(torch.ops.aten, family), overload)


# --------------------------------------------------------------------------- notation


def test_placement_names_match_dtensor_notation():
    assert crosscheck.input_key(ShardIn(1)) == "S(1)" and crosscheck.input_key(ShardIn(1, halo=2)) is None
    assert crosscheck.input_key(PartialInput("sum")) == "P(sum)" and crosscheck.input_key(Replicate()) == "R"
    assert crosscheck.output_key(Gather(2)) == "S(2)" and crosscheck.output_key(Identity()) == "R"
    assert crosscheck.output_key(Gather(0, halo=1)) is None and crosscheck.output_key(Gather(0, reverse=True)) is None
    assert crosscheck.output_key(Scan(0, "sum")) is None
    assert crosscheck.output_key(Reduce("xor")) is None and crosscheck.output_key(ArgReduce("max", 0)) is None
    # a block gather is DTensor's _StridedShard(dim, split_factor)
    assert crosscheck.output_key(Gather(0, block=2)) == "_S(0, 2)" and crosscheck.parse_output("_S(0, 5)") == Gather(0, block=5)
    assert crosscheck.output_key(Reduce("max")) == "P(max)"
    assert crosscheck.output_key(Reduce("prod")) == "P(product)"  # c10d's name, which DTensor's Partial uses
    for key in ("R", "S(3)", "P(avg)", "P(product)"):
        assert crosscheck.input_key(crosscheck.parse_input(key)) == key
        assert crosscheck.output_key(crosscheck.parse_output(key)) == key
    assert crosscheck.parse_output("_NormP(3)") is None
    assert crosscheck.output_key(Reduce("norm2")) == "_NormP(2)" and crosscheck.parse_output("_NormP(2)") == Reduce("norm2")


# --------------------------------------------------------------------------- DTensor side


def test_dtensor_accepts_the_megatron_rules_of_mm(backend):
    case = _case(MM, torch.randn(4, 6, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64))
    got = _answer(case, backend)
    assert got == {
        ("S(0)", "R"): ("S(0)",), ("R", "S(1)"): ("S(1)",), ("S(1)", "S(0)"): ("P(sum)",),
        ("P(sum)", "R"): ("P(sum)",), ("R", "P(sum)"): ("P(sum)",),
    }
    # the strategy's own list gives what asking every placement tuple gives
    assert _answer(case, backend, exhaustive=True) == got
    assert dtensor_support(MM) == "single-dim" and dtensor_support(torch.ops.aten.nonzero.default) == "none"


def test_inputs_that_need_redistribution_are_not_accepted(backend):
    case = _case(MM, torch.randn(4, 6, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64))
    query = DTensorQuery(MM, case, backend.tensor_ops(), 2, case.call(case.args, {}))
    assert query.accepts(("S(1)", "S(0)")) == ("P(sum)",)
    assert query.accepts(("S(0)", "S(0)")) is None  # DTensor would all-gather the second input first
    assert query.accepts(("S(0)", "P(sum)")) is None


def test_out_overloads_need_the_out_tensor_placed_like_the_result(backend):
    case = _case(torch.ops.aten.abs.out, torch.randn(4, 6, dtype=torch.float64), out_spec={"out": torch.float64})
    got = _answer(case, backend)
    assert got == {("S(0)",): ("S(0)",), ("S(1)",): ("S(1)",)}  # abs is not linear: no Partial


def _bool_named(case: OpCase, backend) -> dict:
    out = case.call(case.args, dict(case.kwargs))
    return {k: canonical_names(v, [out]) for k, v in _answer(case, backend).items()}


def test_bool_partials_have_one_name(backend):
    """On bools Partial(sum) is logical or, like Partial(max): DTensor says sum, the explorer max."""
    func = torch.ops.aten.any.dim
    case = OpCase(str(func), func, (torch.randn(6, 4, dtype=torch.float64) > 0.3, 1), {}, ("self", "dim"))
    assert _answer(case, backend)[("S(1)",)] == ("P(sum)",)  # DTensor's own name, as cached
    assert _bool_named(case, backend) == {("S(0)",): ("S(0)",), ("S(1)",): ("P(max)",)}
    entry = explore_case(case, backend.tensor_ops())
    ours = {r.inputs: r.options for r in crosscheck.our_rules(entry)}
    assert ours == {("S(0)",): (("S(0)",),), ("S(1)",): (("P(max)",),)}


def test_product_partials_match_reduce_prod_and_on_bools_min(backend):
    """DTensor's Partial('product') is our reduce(prod); on bools (all) it is logical and,
    the explorer's reduce(min)."""
    func = torch.ops.aten.all.dim
    case = OpCase(str(func), func, (torch.randn(6, 4, dtype=torch.float64) > -0.3, 1), {}, ("self", "dim"))
    assert _bool_named(case, backend)[("S(1)",)] == ("P(min)",)
    entry = explore_case(case, backend.tensor_ops())
    ours = {r.inputs: r.options for r in crosscheck.our_rules(entry)}
    assert ours[("S(1)",)] == (("P(min)",),)
    func = torch.ops.aten.prod.dim_int
    case = OpCase(str(func), func, (torch.randn(6, 4, dtype=torch.float64), 1), {}, ("self", "dim"))
    assert _answer(case, backend)[("S(1)",)] == ("P(product)",)
    entry = explore_case(case, backend.tensor_ops())
    assert {r.inputs: r.options for r in crosscheck.our_rules(entry)}[("S(1)",)] == (("P(product)",),)


def test_a_call_dtensor_cannot_run_is_asked_once(backend):
    func = torch.ops.aten._chunk_cat.default  # DTensor's decomposition of it fails even on replicas
    case = _case(func, [torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)], 0, 2)
    query = DTensorQuery(func, case, backend.tensor_ops(), 2, case.call(case.args, {}))
    answer = dtensor_answer(query, QueryConfig())
    assert not answer.runs and answer.queried == 1 and answer.accepted == {}


def test_the_answer_says_whether_the_clock_or_the_count_stopped_it(backend):
    """A clock-stopped enumeration depends on the machine's speed: the report counts those apart."""
    case = _case(MM, torch.randn(4, 6, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64))
    query = DTensorQuery(MM, case, backend.tensor_ops(), 2, case.call(case.args, {}))
    by_count = dtensor_answer(query, QueryConfig(max_combos=2, exhaustive=True))
    assert by_count.truncated and not by_count.clocked and by_count.queried == 3
    by_clock = dtensor_answer(query, QueryConfig(max_seconds=0.0, exhaustive=True))
    assert by_clock.truncated and by_clock.clocked and by_clock.queried == 2
    whole = dtensor_answer(query, QueryConfig(exhaustive=True))
    assert not whole.truncated and not whole.clocked


def test_an_out_tensor_can_be_offered_as_a_norm_partial(backend):
    """Our reduce(norm2) of an out= overload's result is asked of DTensor as _NormPartial(2),
    not an error that stops the op's check (_euclidean_dist.out's (S(1), S(1)) rule)."""
    assert str(placement(NORM2)) == NORM2
    func = torch.ops.aten._euclidean_dist.out
    case = _case(func, torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64),
                 out_spec={"out": torch.float64})
    query = DTensorQuery(func, case, backend.tensor_ops(), 2, case.call(case.args, {}))
    assert query.accepts(("S(1)", "S(1)", NORM2)) is None  # DTensor would all-gather the inputs
    assert query.accepts(("S(0)", "R", "S(0)")) == ("S(0)",)


def test_modes_left_by_an_interrupted_query_are_dropped():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    depth = torch._C._len_torch_dispatch_stack()
    Passthrough().__enter__()  # as a timeout inside DTensor's decomposition tracing leaves it
    assert torch._C._len_torch_dispatch_stack() == depth + 1
    crosscheck._drop_dispatch_modes(depth)
    assert torch._C._len_torch_dispatch_stack() == depth


def test_a_worker_prepares_its_backend_before_any_op(monkeypatch):
    # The model programs' calls, made inside a worker's first check, once came out short:
    # they are made before any op, as sweep workers make them.
    import metaspmd.backends.torch as torch_backend

    class Backend:
        prepared = False

        def prepare(self):
            self.prepared = True

    monkeypatch.setattr(torch_backend, "get_backend", lambda **options: Backend())
    monkeypatch.setattr(crosscheck, "_WORKER", {})
    crosscheck._init_worker({}, None, quiet=False)
    assert crosscheck._WORKER["backend"].prepared


def test_answers_are_cached_per_op(tmp_path):
    cache = AnswerCache(tmp_path)
    answer = DTensorAnswer({("S(0)", "R"): ("S(0)",)}, queried=7, truncated=True, clocked=True)
    cache.put("aten.mm.default", "k1", answer)
    assert cache.get("aten.mm.default", "other") is None
    cache.flush()
    again = AnswerCache(tmp_path)
    assert again.get("aten.mm.default", "k1") == answer
    assert again.get("aten.add.Tensor", "k1") is None
    # written before the clock was recorded: a whole answer is kept, a capped one asked again
    older = {"accepted": [], "queried": 3, "runs": True}
    (tmp_path / "aten.abs.default.json").write_text(
        json.dumps({"whole": {**older, "truncated": False}, "capped": {**older, "truncated": True}}), encoding="utf-8")
    assert AnswerCache(tmp_path).get("aten.abs.default", "whole") == DTensorAnswer({}, 3, False, True, False)
    assert AnswerCache(tmp_path).get("aten.abs.default", "capped") is None
    (tmp_path / "aten.add.Tensor.json").write_text("{not json", encoding="utf-8")
    assert AnswerCache(tmp_path).get("aten.add.Tensor", "k1") is None  # unreadable: a miss, not an error


# --------------------------------------------------------------------------- numerics


def test_partial_parts_reduce_back_to_the_tensor(backend):
    ops = backend.tensor_ops()
    x = torch.randn(3, 4, dtype=torch.float64)
    for op, fold in (("sum", lambda p: sum(p)), ("avg", lambda p: sum(p) / len(p)),
                     ("max", lambda p: torch.stack(p).amax(0)), ("min", lambda p: torch.stack(p).amin(0))):
        parts = partial_parts(ops, x, op, 3, seed=5)
        assert len(parts) == 3 and not torch.equal(parts[0], parts[1])
        assert torch.allclose(fold(parts), x), op
    assert chunk_bounds(5, 2) == [(0, 3), (3, 2)] and chunk_bounds(3, 4) == [(0, 1), (1, 1), (2, 1), (3, 0)]


def test_reverify_accepts_right_rules_and_rejects_wrong_ones(backend):
    ops = backend.tensor_ops()
    case = _case(MM, torch.randn(8, 6, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64))
    assert reverify(FreshInputs(case, ops), (ShardIn(0), Replicate()), ((Gather(0),),), seed=3)[0] == "ok"
    assert reverify(FreshInputs(case, ops), (ShardIn(1), ShardIn(0)), ((Reduce("sum"),),), seed=3)[0] == "ok"
    verdict, detail = reverify(FreshInputs(case, ops), (ShardIn(0), Replicate()), ((Gather(1),),), seed=3)
    assert verdict == "failed" and "gather(dim=1)" in detail
    both = ((Reduce("sum"), Reduce("max")),)  # every listed alternative must hold
    assert reverify(FreshInputs(case, ops), (ShardIn(1), ShardIn(0)), both, seed=3)[0] == "failed"
    empty = _case(MM, torch.randn(0, 6, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64))
    partial = (PartialInput("sum"), PartialInput("sum"))
    assert reverify(FreshInputs(empty, ops), partial, ((Identity(),),), seed=3)[0] == "vacuous"


def test_an_even_gather_is_reverified_on_the_even_counts_it_claims(backend):
    """view_copy of [25, 5] as [5, 5, 5] cut along its rows: each shard's rows must make
    whole [5, 5] blocks, which 5 shards do and 4 cannot (a shard of 7 rows does not even
    view). The rule claims even cuts alone, so it is checked on those, with each shard's
    sizes as the runtime gives them (``call_case``)."""
    from metaspmd.backends.torch.rules_at_runtime import call_case

    ops = backend.tensor_ops()
    view_copy = torch.ops.aten.view_copy.default
    case = call_case(view_copy, (torch.randn(25, 5, dtype=torch.float64), [5, 5, 5]), {})
    assert reverify(FreshInputs(case, ops), (ShardIn(0),), ((Gather(0, even=True),),), seed=3) == (
        "ok", "2 checks on 5 and 5 shards")
    verdict, detail = reverify(FreshInputs(case, ops), (ShardIn(0),), ((Gather(1, even=True),),), seed=3)
    assert verdict == "failed" and "from 5 shards" in detail  # a wrong even gather still fails
    prime = call_case(view_copy, (torch.randn(7, 5, dtype=torch.float64), [7, 5]), {})
    assert reverify(FreshInputs(prime, ops), (ShardIn(0),), ((Gather(1, even=True),),), seed=3) == (
        "unchecked", "an even gather, and no shard count cuts its dims evenly")  # rows 7, columns 5


def test_a_rule_true_only_for_the_samples_inputs_is_caught(backend):
    """lerp(self, end, weight) ignores ``end`` where the weight is 0. A sample whose generator
    always draws a zero weight makes (R, P(sum), R) -> R hold on every one of its draws."""
    ops = backend.tensor_ops()

    def zero_weight(seed):
        g = torch.Generator().manual_seed(seed)
        self, end = (torch.randn(6, 4, dtype=torch.float64, generator=g) for _ in range(2))
        return (self, end, torch.zeros(6, 4, dtype=torch.float64)), {}

    func = torch.ops.aten.lerp.Tensor
    case = OpCase(str(func), func, zero_weight(0)[0], {}, ("self", "end", "weight"), fresh=zero_weight)
    ignores_end = (Replicate(), PartialInput("sum"), Replicate())
    verdict, detail = reverify(FreshInputs(case, ops), ignores_end, ((Identity(),),), seed=1)
    assert verdict == "data-dependent" and "random" in detail
    assert reverify(FreshInputs(case, ops), (ShardIn(0),) * 3, ((Gather(0),),), seed=1)[0] == "ok"


def test_norm_partials_are_our_reduces(backend):
    """DTensor's _NormPartial(2) is our reduce(norm2). A norm's local values are
    non-negative, so _NormPartial(1) and (inf) are plain sum and max Partials."""
    keys = ("_NormP(2.0)", "_NormP(1.0)", "_NormP(inf)", "_NormP(-inf)", "_NormP(3)")
    assert canonical_names(keys, []) == ("_NormP(2)", "P(sum)", "P(max)", "P(min)", "_NormP(3)")
    func = torch.ops.aten.linalg_vector_norm.default
    case = OpCase(str(func), func, (torch.randn(6, 4, dtype=torch.float64),), {}, ("self",))
    assert _bool_named(case, backend)[("S(0)",)] == ("_NormP(2)",)
    entry = explore_case(case, backend.tensor_ops())
    assert {r.inputs: r.options for r in crosscheck.our_rules(entry)}[("S(0)",)] == (("_NormP(2)",),)


def test_real_dtensor_replays_what_our_replay_cannot(backend):
    """Composite ops and out= views are asked of DTensor itself (fake process group +
    LocalTensorMode): view_as runs its decomposition, which reads other's global shape;
    slice_scatter.out, which DTensor's query accepts, raises: it has no strategy for the op
    (or, once a query has traced its decomposition, the local kernel gets mismatched shapes)."""
    ops = backend.tensor_ops()
    func = torch.ops.aten.view_as.default
    case = _case(func, torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64))
    assert replay(func, FreshInputs(case, ops), ("R", "S(0)"), ("R",), 2)[0] == "holds"
    assert replay(func, FreshInputs(case, ops), ("S(0)", "R"), ("S(1)",), 2)[0] == "unchecked"  # DTensor gives S(0)
    func = torch.ops.aten.slice_scatter.out
    case = _case(func, torch.randn(4, 6, dtype=torch.float64), torch.randn(2, 6, dtype=torch.float64), 0, 0, 2,
                 out_spec={"out": torch.float64})
    verdict, detail = replay(func, FreshInputs(case, ops), ("R", "S(0)"), ("S(0)",), 2)
    assert verdict == "wrong" and detail.startswith((REAL_CANNOT_RUN, REAL_RAISES)), detail


@pytest.mark.parametrize("name,keys", [
    ("add_.Tensor", ("R", "P(sum)")), ("mul_.Tensor", ("R", "P(sum)")), ("add_.Tensor", ("S(1)", "P(sum)")),
    ("mul.Tensor", ("P(sum)", "R")),
])
def test_real_dtensor_replay_gives_every_rank_its_own_tensors(backend, name, keys):
    """These hold on gloo. Under LocalTensorMode a replicated local is one plain tensor for
    every rank, so an in-place op with a per-rank argument wrote it once per rank
    (x + 2y on two ranks), and Partial parts drawn under the mode were draws per rank
    themselves (mul's compare could not reconcile them): the replay called DTensor wrong."""
    ops = backend.tensor_ops()
    packet, overload = name.split(".")
    func = getattr(getattr(torch.ops.aten, packet), overload)
    case = _case(func, torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64))
    verdict = replay(func, FreshInputs(case, ops), keys, keys[:1], 2)  # the output placed as the first input
    assert verdict == ("holds", "real DTensor: matches the unsharded op"), verdict


def test_a_composite_rule_only_its_decomposition_gives_is_told_apart(backend):
    """view_as(R, S(0)) -> R holds on real DTensor, whose decomposition reads other's global
    shape; the op itself on the shards views self as other's half: no local rule. linear's
    batch cut holds both ways: a miss of that kind would be the explorer's."""
    ops, config = backend.tensor_ops(), crosscheck.Config()
    func = torch.ops.aten.view_as.default
    case = _case(func, torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64))
    assert replay(func, FreshInputs(case, ops), ("R", "S(0)"), ("R",), 2)[0] == "holds"
    why = crosscheck._local_failure(FreshInputs(case, ops), ("R", "S(0)"), ("R",), config)
    assert crosscheck.SHARD_FAILS_RE.match(why), why
    detail = f"real DTensor: matches ({crosscheck.COMPOSITE}); {crosscheck.LOCAL_FAILS}: {why}"
    assert crosscheck._reason("", "holds", detail).endswith("the op itself on these shards fails or differs")
    linear = _case(torch.ops.aten.linear.default, torch.randn(4, 6, dtype=torch.float64),
                   torch.randn(3, 6, dtype=torch.float64))
    assert crosscheck._local_failure(FreshInputs(linear, ops), ("S(0)", "R"), ("S(0)",), config) == ""


def test_dtensor_mean_of_uneven_shards_is_a_false_positive(backend):
    """DTensor gives mse_loss(S(0), S(0)) -> P(avg) for any size: on 5 rows cut 3 + 2 the
    average of the shard means is not the mean."""
    ops = backend.tensor_ops()
    func = torch.ops.aten.mse_loss.default
    rule = ((ShardIn(0), ShardIn(0)), (Reduce("avg"),))
    uneven = _case(func, torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64))
    assert ("S(0)", "S(0)") in _answer(uneven, backend)
    assert check_foreign_rule(FreshInputs(uneven, ops), *rule, mesh_size=2, seed=1)[0] == "wrong"
    even = _case(func, torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64))
    # right on its own 2-way split, wrong on 3 shards: not a rule the explorer keeps
    assert check_foreign_rule(FreshInputs(even, ops), *rule, mesh_size=2, seed=1)[0] == "split-dependent"
    right = ((ShardIn(0), Replicate()), (Gather(0),))
    assert check_foreign_rule(FreshInputs(_case(MM, *even.args), ops), *right, mesh_size=2, seed=1)[0] == "holds"


def test_a_partial_rule_true_at_the_example_sizes_only_is_size_dependent(backend):
    """A slice_scatter whose slice covers all of self ignores self: self Partial with src
    replicated gives src, replicated, at this size, and DTensor, deciding on the real sizes,
    says so. Our signature leaves the sizes open, where a longer self keeps rows of its own."""
    ops, config = backend.tensor_ops(), crosscheck.Config()
    func = torch.ops.aten.slice_scatter.default
    covered = _case(func, torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64), 0, 0, 4)
    rule = ((PartialInput("sum"), Replicate()), (Identity(),))
    assert check_foreign_rule(FreshInputs(covered, ops), *rule, mesh_size=2, seed=1)[0] == "holds"
    assert crosscheck._replay_on_shards(FreshInputs(covered, ops), ("P(sum)", "R"), ("R",), config)[0] == "size-dependent"
    both = crosscheck._replay_on_shards(FreshInputs(covered, ops), ("P(sum)", "P(sum)"), ("P(sum)",), config)
    assert both[0] == "holds"  # self and src Partial together: linear at any size


def test_a_cut_rule_true_at_the_example_sizes_only_is_size_dependent(backend):
    """A convolution whose kernel spans its input: input and kernel cut along the width sum
    their shards at this width, where DTensor decides, and at no other. The signature pins
    the kernel's extent (a halo is read off it) and leaves the input's open."""
    ops, config = backend.tensor_ops(), crosscheck.Config()
    func = torch.ops.aten.convolution.default
    spans = dataclasses.replace(
        _case(func, torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(4, 3, 5, dtype=torch.float64),
              None, [1], [0], [1], False, [0], 1),
        exact_sizes={"weight": slice(2, None)})
    width = crosscheck._replay_on_shards(FreshInputs(spans, ops), ("S(2)", "S(2)"), ("P(sum)",), config)
    assert width[0] == "size-dependent", width
    channels = crosscheck._replay_on_shards(FreshInputs(spans, ops), ("S(1)", "S(1)"), ("P(sum)",), config)
    assert channels[0] == "holds", channels  # the channel sum holds at any size


def test_a_foreign_rule_must_hold_on_several_draws(backend):
    """DTensor gives nll_loss_forward(S(0), S(0), R) -> (P(avg), P(sum)) with class weights
    and reduction=mean. The average of the shards' weighted means is the weighted mean only
    where every shard's targets weigh the same: true on the first draw of seed 1 (both
    targets of one class), false on the next."""
    ops, func = backend.tensor_ops(), torch.ops.aten.nll_loss_forward.default

    def fresh(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(2, 3, generator=g, dtype=torch.float64), torch.randint(0, 3, (2,), generator=g),
                torch.rand(3, generator=g, dtype=torch.float64) + 0.5, 1, -100), {}

    case = dataclasses.replace(_case(func, *fresh(0)[0]), fresh=fresh)
    rule = ((ShardIn(0), ShardIn(0), Replicate()), (Reduce("avg"), Reduce("sum")))
    first = Trial(2, crosscheck_numerics.draw_seed(1, 0), chunked=True)
    assert run_trial(FreshInputs(case, ops), *rule, first) is None  # one draw alone would pass it
    assert check_foreign_rule(FreshInputs(case, ops), *rule, mesh_size=2, seed=1)[0] == "wrong"
    summed = dataclasses.replace(case, args=case.args[:3] + (2, -100),
                                 fresh=lambda seed: ((*fresh(seed)[0][:3], 2, -100), {}))
    rule = ((ShardIn(0), ShardIn(0), Replicate()), (Reduce("sum"), Reduce("sum")))
    assert check_foreign_rule(FreshInputs(summed, ops), *rule, mesh_size=2, seed=1)[0] == "holds"


def test_a_partial_rule_that_fails_where_the_parts_cancel_is_wrong(backend):
    """DTensor gives any(P(sum)) -> P(max): true on random parts, false where x1 = -x2 (the
    sum is zero, so any() is False, while each part's any() is True). Linear rules hold
    there exactly."""
    ops = backend.tensor_ops()
    x = torch.randn(4, 6, dtype=torch.float64)
    any_ = _case(torch.ops.aten.any.default, x)
    assert run_trial(FreshInputs(any_, ops), (PartialInput(),), (Reduce("max"),), Trial(2, 5)) is None  # random parts
    verdict, detail = check_foreign_rule(FreshInputs(any_, ops), (PartialInput(),), (Reduce("max"),), mesh_size=2, seed=1)
    assert verdict == "wrong" and "cancel" in detail
    mm = _case(MM, x, torch.randn(6, 5, dtype=torch.float64))
    assert check_foreign_rule(FreshInputs(mm, ops), (PartialInput(), Replicate()), (Reduce("sum"),), mesh_size=2, seed=1)[0] == "holds"
    assert reverify(FreshInputs(mm, ops), (PartialInput(), Replicate()), ((Reduce("sum"),),), seed=1)[0] == "ok"


def test_a_rule_of_a_nan_skipping_op_is_checked_with_nan(backend):
    """DTensor gives nansum(P(sum)) -> P(sum): true on finite data, false where a part holds
    NaN (nansum drops it there and keeps the other parts' values). Ops marked
    special_always are checked on their special values too, foreign rules and ours alike."""
    from metaspmd.backends.torch.sample_data import with_nan_specks

    ops = backend.tensor_ops()
    plain = _case(torch.ops.aten.nansum.default, torch.randn(4, 6, dtype=torch.float64))
    rule = ((PartialInput(),), (Reduce("sum"),))
    assert check_foreign_rule(FreshInputs(plain, ops), *rule, mesh_size=2, seed=1)[0] == "holds"
    nan_aware = dataclasses.replace(plain, special=with_nan_specks, special_always=True)
    verdict, detail = check_foreign_rule(FreshInputs(nan_aware, ops), *rule, mesh_size=2, seed=1)
    assert verdict == "wrong" and "special values" in detail
    assert reverify(FreshInputs(nan_aware, ops), rule[0], (rule[1],), seed=1)[0] == "failed"
    cut = ((ShardIn(0),), ((Reduce("sum"),),))  # a row cut sums on NaN too
    assert reverify(FreshInputs(nan_aware, ops), *cut, seed=1)[0] == "ok"


def test_special_values_check_a_partial_rule_on_two_parts(backend):
    """A Partial(sum) scale of a special_always op, zero in the all-zero patterns: its two
    parts r and -r cancel exactly through a linear op, four parts round at their own size,
    which the zero output cannot excuse. Its rule is linear, and re-verifies."""
    from metaspmd.backends.torch.sample_data import with_special_values

    ops, func = backend.tensor_ops(), torch.ops.aten.mul.Tensor
    case = dataclasses.replace(_case(func, torch.randn(4, 6, dtype=torch.float64), torch.randn((), dtype=torch.float64)),
                               special=with_special_values, special_always=True)
    assert reverify(FreshInputs(case, ops), (Replicate(), PartialInput()), ((Reduce("sum"),),), seed=1)[0] == "ok"


# --------------------------------------------------------------------------- whole ops


def test_our_rules_agree_with_dtensor_on_shared_ops(report):
    by_op = {r.op: r for r in report.results}
    for op in OPS[:4]:
        r = by_op[op]
        assert r.compared == r.examples > 0, op
        assert r.agree > 0 and r.dtensor_rules >= r.agree, op
    mm = by_op["aten.mm.default"]
    assert not [m for m in mm.misses if "f[" in m.signature]  # every float DTensor rule of mm is ours too
    assert all(m.reason for m in report.misses())
    assert not report.failures()


def test_op_dtensor_cannot_run_is_covered_by_us_only(report):
    (scatter,) = report.dtensor_cannot_run()
    assert scatter.op == "aten.scatter_reduce.two" and scatter.support == "none" and scatter.dtensor_rules == 0
    assert scatter.extras and all(e.verdict == "ok" for e in scatter.extras)
    assert any(e.rule == "(S(1), S(1), S(1)) -> (S(1))" and e.kind == "no-dtensor-rule" for e in scatter.extras)
    # the rows cut with the positions offset (the dropping form): no DTensor placement says it
    assert any(e.kind == "no-placement" for e in scatter.extras)


def test_a_wrong_rule_in_the_registry_fails_reverification(backend, records):
    record = records["aten.relu.default"]
    entry = next(e for e in record.entries if e.signature == "self:f[*,*,*]")
    bad = dataclasses.replace(entry, combine=CombineSpec.parse(WRONG_RELU))
    result = crosscheck.crosscheck_op(backend, record.op, dataclasses.replace(record, entries=(bad,)))
    failed = [e for e in result.extras if e.verdict == "failed"]
    assert [e.rule for e in failed] == ["(S(0)) -> (S(1))"]
    assert any(m.rule == "(S(0)) -> (S(0))" and m.reason.startswith("output differs") for m in result.misses)


def test_report_prints_totals_and_json_round_trips(report):
    text = crosscheck.format_report(report)
    assert "agreement: ours too" in text and "Ops DTensor cannot run at all that we cover" in text
    assert "aten.scatter_reduce.two" in text and "FAILED re-verification" not in text
    data = json.loads(crosscheck.report_json(report))
    s = data["summary"]
    assert s["ops"] == len(OPS) and s["extras_by_verdict"]["failed"] == 0 and s["dtensor_cannot_run_ops"] == 1
    assert s["agree"] + s["missed"] == s["dtensor_rules"]
    assert s["decomposition_only"] <= s["missed"] - s["dtensor_false_positives"]
    assert sum(v["dtensor_rules"] for v in s["by_source"].values()) == s["dtensor_rules"]
    assert sum(v["missed"] for v in s["by_source"].values()) == s["missed"]
    assert "DTensor's rules by where they come from" in text


def test_misses_are_counted_by_where_dtensor_takes_the_rule_from():
    def miss(numeric="holds", decomposition_only=False):
        return crosscheck.Miss("op", "sig", "(S(0)) -> (S(0))", "why", numeric, decomposition_only=decomposition_only)

    results = [
        crosscheck.OpResult("aten.a", "single-dim", dtensor_rules=40, misses=[miss(), miss("wrong")]),
        crosscheck.OpResult("aten.b", "op-strategy", dtensor_rules=60),
        crosscheck.OpResult("aten.c", "decomposition", dtensor_rules=50,
                            misses=[miss(decomposition_only=True), miss("wrong"), miss()]),
        crosscheck.OpResult("aten.d", "none"),
    ]
    report = crosscheck.Report(crosscheck.Config(), results)
    s = report.summary()
    assert list(s["by_source"]) == ["single-dim", "op-strategy", "decomposition"]
    assert s["by_source"]["decomposition"] == {"dtensor_rules": 50, "missed": 3, "dtensor_false_positives": 1,
                                               "decomposition_only": 1}
    assert s["hand_written_miss_rate"] == 0.02 and s["miss_rate"] == round(5 / 150, 4)
    text = crosscheck.format_report(report)
    assert "miss rate on DTensor's hand-written rules 2.0%" in text
    row = next(line for line in text.splitlines() if line.startswith("propagated through the op's decomposition"))
    assert row.split()[-6:] == ["3", "6.0%", "1", "1", "1", "2.0%"]


# Explores mm live and runs the cross-check three times (a minute on two shared cores): the
# slow job. What it runs is checked in the default run piece by piece (the answer cache, a
# wrong rule failing re-verification, the report and its JSON), and the command line's usage
# errors just below.
@pytest.mark.slow
def test_command_line_explores_missing_ops_and_sets_the_exit_status(tmp_path, monkeypatch, capsys, records):
    real_run = crosscheck.run
    opinfos = {"opinfos": ("mm", "nn.functional.relu"), "max_signatures": 2}
    monkeypatch.setattr(crosscheck, "run", lambda *a, **k: real_run(*a, backend_options=opinfos, **k))
    out, cache = tmp_path / "new" / "out.json", tmp_path / "cache"  # --json into a folder not made yet
    argv = ["--registry", str(tmp_path / "registry"), "--ops", "aten.mm.default", "--cache-dir", str(cache),
            "--json", str(out)]
    assert crosscheck.main(argv) == 0
    assert "agreement" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["explored_now"] == ["aten.mm.default"] and data["summary"]["agree"] > 0
    cached = (cache / "aten.mm.default.json").stat().st_mtime_ns
    assert crosscheck.main(argv) == 0
    assert (cache / "aten.mm.default.json").stat().st_mtime_ns == cached  # all answers came from the cache
    # a registry file with a wrong rule: exit status 1
    relu = records["aten.relu.default"]
    entry = next(e for e in relu.entries if e.signature == "self:f[*,*,*]")
    bad = dataclasses.replace(entry, combine=CombineSpec.parse(WRONG_RELU))
    write_record(tmp_path / "registry", dataclasses.replace(relu, entries=(bad,)))
    assert crosscheck.main(["--registry", str(tmp_path / "registry"), "--no-cache"]) == 1
    assert "FAILED re-verification" in capsys.readouterr().out
    assert crosscheck.main(["--partials", "median"]) == 2


def test_an_interrupted_check_reports_the_ops_it_checked_and_counts_the_rest(tmp_path, monkeypatch, capsys):
    """Ctrl-C an hour into a check printed one line: what it had checked was lost."""
    checked = []

    def check_one(op, record, explore, config):
        if len(checked) == 2:
            raise KeyboardInterrupt
        checked.append(op)
        return crosscheck.OpResult(op, "none", status="ok", examples=1), None

    monkeypatch.setattr(crosscheck, "_check_one", check_one)
    monkeypatch.setattr(crosscheck, "_init_worker", lambda *a: None)
    out = tmp_path / "report.json"
    ops = "aten.abs.default,aten.relu.default,aten.neg.default,aten.sin.default"
    argv = ["--ops", ops, "--registry", str(tmp_path), "--jobs", "1", "--timeout", "0", "--no-cache", "--json", str(out)]
    assert crosscheck.main(argv) == 130  # (a registry of no file: the ops are read from the catalog)
    text, err = capsys.readouterr()
    assert "Interrupted: 2 op(s) not checked; the counts above are of the 2 checked" in text, text
    assert "2 ops (" in text and "interrupted; 2 op(s) not done" in err, err
    data = json.loads(out.read_text())
    assert [r["op"] for r in data["ops"]] == sorted(checked) and len(data["not_checked"]) == 2, data
    assert not set(data["not_checked"]) & set(checked)


@pytest.mark.parametrize("option, why", [
    (["--other-calls", "2", "--partials", "max"], "--partials does not apply to --other-calls"),
    (["--other-calls", "2", "--exhaustive"], "--exhaustive does not apply to --other-calls"),
    (["--other-calls", "2", "--cache-dir", "somewhere"], "--cache-dir does not apply to --other-calls"),
    (["--no-cache", "--cache-dir", "somewhere"], "--cache-dir does not combine with --no-cache"),
])
def test_command_line_refuses_an_option_the_run_would_ignore(option, why, capsys):
    with pytest.raises(SystemExit) as e:
        crosscheck.main(["--ops", "aten.relu.default", *option])
    assert e.value.code == 2 and why in capsys.readouterr().err


def test_command_line_usage_errors_exit_2(tmp_path, capsys):
    assert crosscheck.main(["--partials", "median"]) == 2
    assert "--partials takes sum, avg, max, min, got 'median'" in capsys.readouterr().err
    assert crosscheck.main(["--registry", str(tmp_path), "--ops", "aten.no_such_op.default"]) == 2
    assert "no op matches aten.no_such_op.default" in capsys.readouterr().err
    # a typo beside a good name checked the good one alone, and passed
    assert crosscheck.main(["--registry", str(tmp_path), "--ops", "aten.relu.default,aten.mmm.default"]) == 2
    assert "--ops: no op matches aten.mmm.default (did you mean aten.mm.default" in capsys.readouterr().err
    assert crosscheck.main(["--registry", str(tmp_path), "--ops", "abs"]) == 2  # a bare name: no glob of the full one
    assert "no op matches abs (did you mean aten.abs.default" in capsys.readouterr().err
    # a cache folder that is a file would be skipped without a word
    (tmp_path / "file").write_text("")
    assert crosscheck.main(["--cache-dir", str(tmp_path / "file")]) == 2
    assert f"--cache-dir {tmp_path / 'file'} is not a folder" in capsys.readouterr().err
    assert crosscheck.main(["--cache-dir", str(tmp_path / "file" / "sub")]) == 2
    assert f"--cache-dir {tmp_path / 'file' / 'sub'}: {tmp_path / 'file'} is not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--max-seconds", "nan"], "--max-seconds: expected a number of seconds: finite and > 0, got 'nan'"),
    (["--max-seconds", "-1"], "got '-1'"),
    (["--limit", "-1"], "--limit: expected an integer >= 1, got -1"),
    (["--max-combos", "0"], "got 0"),
    (["--timeout", "inf"], "got 'inf'"),
    # DTensor shards no example dim past a few dozen: every rule would read "DTensor lacks it"
    (["--mesh-size", "1000000"], "--mesh-size: expected an integer from 2 to 64, got '1000000'"),
    (["--mesh-size", "1"], "got '1'"),
])
def test_command_line_numbers_are_checked(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        crosscheck.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_an_unwritable_json_fails_before_any_op_is_checked(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(crosscheck, "run", lambda *a, **k: pytest.fail("the check ran"))
    assert crosscheck.main(["--ops", "aten.relu.default", "--json", str(tmp_path / "file" / "r.json")]) == 2
    assert f"--json {tmp_path / 'file' / 'r.json'}: {tmp_path / 'file'} is not a folder" in capsys.readouterr().err


@pytest.mark.slow  # worker processes that import torch
def test_worker_processes_print_nothing_into_the_report(capfd):
    # aten._print writes its string to stdout from C++; a worker's prints (and torch's C++
    # warnings) would land in the parent's report, where tools read it
    report = crosscheck.run(["aten._print.default"], {}, crosscheck.Config(cache=None), explore_missing=True,
                            jobs=2, backend_options={"opinfos": ()})
    assert report.results[0].op == "aten._print.default"
    assert capfd.readouterr().out == ""


def test_lookup_ignores_default_arguments_and_memory_format():
    from metaspmd.backends.torch.table import lookup, normalize, op_info

    info = op_info(torch.ops.aten.sum.dim_IntList)
    assert normalize("self:f[*,*] dim=[1] keepdim=False", info.defaults) == "self:f[*,*] dim=[1]"
    assert normalize("self:f[*,*] memory_format=torch.contiguous_format", {}) == "self:f[*,*]"
    x = torch.randn(4, 6)
    plain = lookup(torch.ops.aten.sum.dim_IntList, (x, [0, 1]), {})
    spelled = lookup(torch.ops.aten.sum.dim_IntList, (x, [0, 1], False), {})
    assert plain is not None and spelled == plain


@pytest.mark.slow  # about 20 s of worker start-ups; the pool's limits are tests/test_sweep.py's too
def test_an_op_past_the_time_limit_is_a_note_and_the_check_goes_on():
    # the sweep's worker pool kills a worker past the limit (tried once more, then noted):
    # no alarm inside the process, which a check stuck in C++ would never see
    report = crosscheck.run(["aten.mm.default", "aten.relu.default"], {}, crosscheck.Config(cache=None),
                            explore_missing=True, jobs=1, backend_options={"opinfos": ("mm",)}, timeout=0.01)
    assert [r.op for r in report.results] == ["aten.mm.default", "aten.relu.default"]
    assert all(r.notes == ["cross-check fails: timeout after 0.01s"] for r in report.results)


@pytest.mark.parametrize("other_calls", [0, 2])
def test_an_op_whose_check_fails_is_counted_listed_and_fails_the_exit_status(monkeypatch, tmp_path, capsys,
                                                                             other_calls):
    """A check that raised (a replay's AssertionError) left its op's rules unchecked; it read
    as one note among thousands, and the command exited 0. It exits 3, not the 1 of a rule
    that fails re-verification: CI tells a check that could not run (a time limit on a
    loaded machine) from a wrong rule."""
    failed = crosscheck.OpResult("aten.mm.default", "unknown", notes=[f"{crosscheck.CHECK_FAILS}: AssertionError: x"])
    checked = crosscheck.OpResult("aten.relu.default", "single-dim", notes=["a note"])
    monkeypatch.setattr(crosscheck, "run", lambda *a, **k: crosscheck.Report(a[2], [failed, checked]))
    argv = ["--ops", "aten.mm.default,aten.relu.default", "--registry", str(tmp_path), "--no-cache"]
    assert crosscheck.main(argv + ["--other-calls", str(other_calls)] * bool(other_calls)) == 3
    out = capsys.readouterr().out
    assert "Ops whose check FAILED, none of their rules checked (1):\n  aten.mm.default: cross-check fails" in out
    assert "Notes (1):\n  aten.relu.default: a note" in out
    report = crosscheck.Report(crosscheck.Config(), [failed, checked])
    assert report.summary()["ops_check_failed"] == 1
    monkeypatch.setattr(crosscheck, "run", lambda *a, **k: crosscheck.Report(a[2], [checked]))
    assert crosscheck.main(argv) == 0


def test_a_partial_float8_input_is_unchecked_not_a_dtensor_false_positive(backend):
    """_scaled_mm is linear in self, so DTensor's (P(sum), R, R, R) -> P(sum) is right; but a
    float8 input's parts round to float8, so no split sums back to it: no verdict."""
    ops = backend.tensor_ops()
    func = torch.ops.aten._scaled_mm.default
    a = torch.randn(16, 32).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    case = OpCase(str(func), func, (a, b, torch.tensor(1.0), torch.tensor(1.0)), {"out_dtype": torch.float32},
                  ("self", "mat2", "scale_a", "scale_b"))
    rule = ((PartialInput("sum"), Replicate(), Replicate(), Replicate()), (Reduce("sum"),))
    verdict, detail = check_foreign_rule(FreshInputs(case, ops), *rule, mesh_size=2, seed=1)
    assert verdict == "unchecked" and detail.startswith(crosscheck_numerics.INEXACT_SPLIT)
    assert "not found by the explorer; unchecked" in crosscheck._reason("", verdict, detail)


# --------------------------------------------------------------------------- --other-calls


def test_other_calls_share_a_signature_at_other_shapes(backend):
    explored = {(c.signature, str([list(x.shape) for x in c.args if isinstance(x, torch.Tensor)]))
                for c in backend.index["aten.mm.default"]}
    cases = backend.cases_at_other_sizes("aten.mm.default", 2)
    ops = backend.tensor_ops()
    sigs = [signature(ops, c.arg_names, c.args, c.kwargs, c.exact_sizes) for c in cases]
    assert "self:f[*,*] mat2:f[*,*]" in sigs
    for case, sig in zip(cases, sigs):
        assert (sig, str([list(x.shape) for x in case.args])) not in explored  # never the explored call again
    assert max(sigs.count(s) for s in sigs) <= 2
    # an out= overload without OpInfo calls of its own takes its functional sibling's
    assert backend.cases_at_other_sizes("aten.mm.out", 2)


def test_other_calls_reverify_the_rules_of_their_signature(backend, records):
    config = crosscheck.Config(other_calls=3)
    record = records["aten.mm.default"]
    good = crosscheck.recheck_op(backend, record.op, record, 3, 1, crosscheck.OpResult(record.op, "-"))
    assert good.rechecks and all(r.verdict == "ok" for r in good.rechecks)
    entry = next(e for e in record.entries if e.signature == "self:f[*,*] mat2:f[*,*]")
    bad = dataclasses.replace(entry, combine=CombineSpec.parse(WRONG_MM))
    wrong = dataclasses.replace(record, entries=(bad,))
    result = crosscheck.recheck_op(backend, record.op, wrong, 3, 1, crosscheck.OpResult(record.op, "-"))
    failed = [r for r in result.rechecks if r.verdict == "failed"]
    assert failed and {r.rule for r in failed} == {"(S(0), R) -> (S(1))"}
    explored = " ".join(str(list(v.shape)) for _, v in entry.example.args)
    assert all(r.signature == entry.signature and r.shapes != explored for r in failed)
    report = crosscheck.Report(config, [good, result])
    assert report.failures() == failed
    text = crosscheck.format_rechecks(report)
    assert "FAILED re-verification" in text and failed[0].shapes in text


def test_other_calls_skip_rules_whose_cuts_do_not_line_up(records):
    """The runtime applies a label only where its dims have one length (target.cuts_line_up):
    scatter's index narrower than self, cut with it, is never run; nor is it rechecked."""
    entry = next(e for e in records["aten.mm.default"].entries if e.signature == "self:f[*,*] mat2:f[*,*]")
    every = {r.text() for r in crosscheck.our_rules(entry)}
    assert {"(S(0), R) -> (S(0))", "(S(1), S(0)) -> (P(sum))"} <= every
    assert {r.text() for r in crosscheck.our_rules(entry, [(3, 4), (4, 5)])} == every
    unequal = {r.text() for r in crosscheck.our_rules(entry, [(3, 4), (6, 5)])}
    assert "(S(0), R) -> (S(0))" in unequal and "(S(1), S(0)) -> (P(sum))" not in unequal
