"""The model programs' calls: extra samples at the signatures models call ops with."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # the OpInfo database needs it

from metaspmd.backends.torch import get_backend, model_programs  # noqa: E402
from metaspmd.backends.torch.samples import call_signature  # noqa: E402
from metaspmd.explorer import explore_op  # noqa: E402

OPINFOS = ("nn.functional.gelu", "t")


@pytest.fixture(scope="module")
def backend():
    return get_backend(opinfos=OPINFOS)


def _signatures(func, cases) -> list[str]:
    return [call_signature(func, c.args, c.kwargs) for c in cases if not c.reserve]


def test_programs_give_the_same_calls_on_every_run():
    first, second = model_programs.program_calls(), model_programs.program_calls()
    assert first.keys() == second.keys() and "aten.addmm.default" in first
    for op in first:
        for (a1, k1), (a2, k2) in zip(first[op], second[op]):
            leaves = zip(torch.utils._pytree.tree_leaves((a1, k1)), torch.utils._pytree.tree_leaves((a2, k2)))
            assert all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in leaves), op


def test_a_captured_graph_gives_the_calls_eager_code_never_makes(backend):
    """A captured ConvNet trains its BatchNorm with the functional kernel, which no eager
    program calls: its signature comes from the programs' captured graphs, and its
    channel cut is explored."""
    op = "aten._native_batch_norm_legit_functional.default"
    func = torch.ops.aten._native_batch_norm_legit_functional.default
    assert op in model_programs.captured_calls() and op not in model_programs.model_calls(
        list(model_programs.MODEL_PROGRAMS.values()), frozenset({"aten"}), "test", composite=True)
    sig = ("input:f[*,*,*,*] weight:f[*] bias:f[*] running_mean:f[*] running_var:f[*] training=True "
           "momentum=0.1 eps=1e-05")
    assert sig in _signatures(func, backend.cases(op))
    entry = next(e for e in explore_op(backend, op).entries if e.signature == sig)
    assert entry.status == "ok" and [str(s.inputs[0]) for s in entry.strategies()] == ["S(1)"]


def test_a_model_signature_joins_the_opinfo_ones(backend):
    """gelu of rank-3 activations: its OpInfo samples are matrices."""
    func = torch.ops.aten.gelu.default
    signatures = _signatures(func, backend.cases("aten.gelu.default"))
    assert "self:f[*,*,*]" in signatures and len(signatures) == len(set(signatures))
    without = get_backend(opinfos=OPINFOS, model_programs=False)
    assert "self:f[*,*,*]" not in _signatures(func, without.cases("aten.gelu.default"))
    record = explore_op(backend, "aten.gelu.default")
    entry = next(e for e in record.entries if e.signature == "self:f[*,*,*]")
    assert entry.status == "ok" and str(entry.combine).count("gather") == 3


def test_a_spare_opinfo_case_of_a_model_signature_is_explored_instead(backend):
    """Where a spare OpInfo case has a program's signature, the program's call makes it
    primary (it regenerates) instead of adding its own."""
    func = torch.ops.aten.t.default
    x = torch.randn(3, 4, dtype=torch.float64)
    spare = dataclasses.replace(backend._example_case(func, (x,), {}), reserve=True, fresh=lambda seed: ((x,), {}))
    got = backend._with_model_calls(func, "aten.t.default", [spare])
    assert len(got) == 1 and not got[0].reserve and got[0].fresh is spare.fresh
    added = backend._with_model_calls(func, "aten.t.default", [])
    assert [call_signature(func, c.args, c.kwargs) for c in added] == ["self:f[*,*]"]


def test_ops_whose_arguments_name_the_programs_sizes_are_left_out(backend):
    calls = backend.program_calls
    assert "aten.view.default" not in calls and "aten.expand.default" not in calls  # size=[2, 6, 8]
    assert "aten.ones.default" not in calls  # a factory: no tensor input
    assert "aten.native_layer_norm.default" in calls and "aten.t.default" in calls


def test_composite_overloads_are_recorded_and_explored_only_where_opinfo_reaches_none(backend):
    """The recurrent program's lstm and lstm_cell decompose above the dispatch mode; they
    are recorded by the composite pass. linear, which it calls too, has OpInfo samples: a
    composite op never reaches DTensor or a captured graph, so its program calls are left
    out there."""
    calls = backend.program_calls
    assert {"aten.lstm.input", "aten.lstm_cell.default", "aten.gru_cell.default"} <= calls.keys()
    assert "aten.mkldnn_rnn_layer.default" in calls  # the CPU kernel lstm runs, seen by the plain pass
    func = torch.ops.aten.lstm.input
    (args, kwargs), = calls["aten.lstm.input"]
    assert args[5] == 0.0 and call_signature(func, args, kwargs).startswith("input:f[*,*,*] hx:[f[*,*,*],f[*,*,*]]")
    linear = torch.ops.aten.linear.default
    assert "aten.linear.default" in calls
    opinfo_case = backend._example_case(linear, (torch.randn(3, 4), torch.randn(2, 4)), {})
    assert backend._with_model_calls(linear, "aten.linear.default", [opinfo_case]) == [opinfo_case]
    added = backend._with_model_calls(func, "aten.lstm.input", [])
    assert [call_signature(func, c.args, c.kwargs) for c in added] == [call_signature(func, args, kwargs)]


def test_programs_reach_kernels_no_opinfo_sample_calls(backend):
    """The layers program (weight norm, a packed-sequence LSTM) and the inference program
    (eval mode, nothing requiring grad: the encoder layer's and attention's fast paths)."""
    calls = backend.program_calls
    assert {"aten._weight_norm_interface.default", "aten._weight_norm_interface_backward.default",
            "aten._pack_padded_sequence.default", "aten._pad_packed_sequence.default", "aten.lstm.data",
            "aten._transformer_encoder_layer_fwd.default", "aten._native_multi_head_attention.default"} <= calls.keys()
    (args, kwargs), = calls["aten._weight_norm_interface.default"]
    assert [tuple(t.shape) for t in args[:2]] == [(model_programs.V, model_programs.D), (model_programs.V, 1)]


def test_an_out_overload_takes_its_functional_ops_program_calls_where_opinfo_has_none(backend):
    func = torch.ops.aten._weight_norm_interface.default
    (args, kwargs), = backend.program_calls["aten._weight_norm_interface.default"]
    cases = backend.cases("aten._weight_norm_interface.out")
    assert len(cases) == 1 and [tuple(t.shape) for t in cases[0].args[:2]] == [tuple(t.shape) for t in args[:2]]
    assert cases[0].args[0].dtype == torch.float64 and call_signature(func, args, kwargs).startswith("v:f[*,*] g:f[*,1]")
