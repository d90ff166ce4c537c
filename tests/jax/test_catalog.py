"""The primitive catalog and the cases built from harness and sample programs."""

import pytest

pytest.importorskip("jax")

from metaspmd.case import NoSample, Skip  # noqa: E402
from metaspmd.signature import signature  # noqa: E402


def test_lists_every_primitive_sorted(backend):
    names = backend.list_ops()
    assert names == sorted(names) and len(names) >= 200
    assert {"jax.dot_general", "jax.conv_general_dilated", "jax.scatter-add", "jax.psum", "jax.while"} <= set(names)
    from metaspmd.backends.jax.catalog import catalog

    explored = [e for e in catalog().values() if e.status == "explore"]
    assert len(explored) >= 100


def test_harness_groups_are_all_cataloged(backend):
    # the backend first, as every sweep has it: jax's harnesses of 64-bit dtypes exist only
    # where float64 was enabled before they were imported, and the process keeps that list
    from metaspmd.backends.jax import programs
    from metaspmd.backends.jax.catalog import catalog

    groups = set(programs.harness_groups())
    assert len(groups) == 132
    seen = {s.split("/", 1)[1] for e in catalog().values() for s in e.sources if s.startswith("harness/")}
    assert seen == groups  # every harness group maps to at least one cataloged primitive


def test_collectives_and_control_flow_are_skipped_with_a_reason(backend):
    for op in ("jax.psum", "jax.all_gather", "jax.jit"):
        with pytest.raises(Skip) as info:
            backend.cases(op)
        assert info.value.status == "skipped" and info.value.reason
    for op in ("jax.while", "jax.cond", "jax.scan"):  # planned through their bodies at runtime
        with pytest.raises(Skip) as info:
            backend.cases(op)
        assert info.value.status == "composite" and "planned through" in info.value.reason
    with pytest.raises(Skip) as info:
        backend.cases("jax.rng_uniform")
    assert info.value.status == "nondeterministic"
    with pytest.raises(NoSample):
        backend.cases("jax.not_a_primitive")


def test_cases_have_distinct_signatures_and_params(backend, ops):
    from metaspmd.backends.jax.backend import MAX_CASES, MODEL_CASES

    cases = backend.cases("jax.conv_general_dilated")
    assert 1 <= len(cases) <= MAX_CASES + MODEL_CASES
    sigs = [signature(ops, c.arg_names, c.args, c.kwargs, c.exact_sizes) for c in cases]
    assert len(set(sigs)) == len(sigs)
    assert all("window_strides=" in s and "padding=" in s and "dimension_numbers=" in s for s in sigs)
    assert cases[0].arg_names == ("lhs", "rhs")


@pytest.mark.slow  # builds two primitives' 40-odd cases (~13 s)
def test_model_programs_add_the_signatures_models_have(backend, ops):
    """jax's harnesses multiply rank-2 arrays; a model multiplies rank-3 activations by
    statistics broadcast over the last axis. The model programs add those signatures, and
    for a reshape only those that add or drop dims of 1: the sizes of one that merges or
    splits dims belong to one model."""
    from metaspmd.backends.jax.backend import MAX_CASES

    sigs = [signature(ops, c.arg_names, c.args, c.kwargs) for c in backend.cases("jax.mul")]
    assert "x:f[*,*,*] y:f[*,*,1] out_dtype=None" in sigs and len(sigs) > MAX_CASES
    reshapes = backend.cases("jax.reshape")
    assert len(reshapes) > MAX_CASES
    assert all(isinstance(c.kwargs["new_sizes"], str) for c in reshapes[MAX_CASES:])


@pytest.mark.slow  # builds two primitives' 40-odd cases (~10 s)
def test_model_signatures_include_those_a_harness_calls_too(backend, ops):
    """A causal mask selects between boolean masks, which one harness also does: the
    signature is ranked among the models' own calls, not lost to the harness's call."""
    sigs = [signature(ops, c.arg_names, c.args, c.kwargs) for c in backend.cases("jax.select_n")]
    assert "which:b[*,*] cases:[b[*,*],b[*,*]]" in sigs
    # the gradient through a layer norm's statistics (the stacked division-norm program)
    sigs = [signature(ops, c.arg_names, c.args, c.kwargs) for c in backend.cases("jax.integer_pow")]
    assert "x:f[*,*,1] y=-2" in sigs


def test_sample_covers_a_primitive_the_harnesses_miss(backend, ops):
    (case,) = backend.cases("jax.tile")[:1]
    out = case.fn(*case.args, **case.kwargs)
    assert ops.shape(out)[0] == 2 * ops.shape(case.args[0])[0]


def test_fresh_inputs_differ_and_keep_index_ranges(backend, ops):
    import numpy as np

    case = backend.cases("jax.gather")[0]
    args, kwargs = case.fresh(5)
    assert kwargs == dict(case.kwargs)
    assert [ops.shape(a) for a in args] == [ops.shape(a) for a in case.args]
    assert not ops.close(args[0], case.args[0])
    operand, indices = args
    limits = [ops.shape(operand)[d] - case.fn.params["slice_sizes"][d]
              for d in case.fn.params["dimension_numbers"].start_index_map]
    idx = np.asarray(indices)
    assert (idx >= 0).all() and (idx <= np.array(limits)).all()


@pytest.mark.slow  # ranks every primitive's program calls (~10 s)
def test_no_model_signature_is_dropped_by_the_cap(backend):
    """The sweep explores up to MODEL_CASES model signatures per primitive, in rank order:
    one past the cap would be left out of the table without a word."""
    from metaspmd.backends.jax import backend as jax_backend, program_index, programs
    from metaspmd.backends.jax.model_programs import is_model
    from metaspmd.backends.jax.params import generalizes

    index = program_index.index()
    over = {}
    for prim in sorted(index):
        calls = [o for o in index[prim] if is_model(programs.programs()[o.program])
                 and generalizes(prim, o.params, jax_backend._shapes(o))]
        n = len(jax_backend.choose(calls))
        if n > jax_backend.MODEL_CASES:
            over[prim] = n
    assert not over, f"model signatures past MODEL_CASES ({jax_backend.MODEL_CASES}): {over}"


@pytest.mark.slow  # traces every model program twice (~25 s)
@pytest.mark.parametrize("x64", [True, False], ids=["x64", "x32"])
def test_every_model_program_traces(backend, x64):
    """The index leaves out programs that do not trace (jax's harnesses hold some that do
    not): a model program that fails, in the sweep's x64 or the default x32 its users run,
    would add nothing to the table, unsaid."""
    import jax

    from metaspmd.backends.jax import programs
    from metaspmd.backends.jax.model_programs import model_programs

    failed = {}
    with jax.enable_x64(x64):
        for p in model_programs():
            try:
                programs._trace(p, 0)
            except Exception as e:
                failed[p.name] = f"{type(e).__name__}: {e}"[:200]
    assert not failed, failed
