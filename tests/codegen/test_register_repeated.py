"""register() and unregister() repeated: each call changes only what it installed, and
DTensor gets exactly its own back. A module of its own: test_dtensor_register's module
fixture keeps every table op registered while its tests run."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.tensor")

from metaspmd.backends.torch import dtensor_rules  # noqa: E402


def _dtensor_tables() -> list[dict]:
    from torch.distributed.tensor import DTensor

    dispatcher = DTensor._op_dispatcher
    p = dispatcher.sharding_propagator
    return [dict(t) for t in (p.op_strategy_funcs, p.op_to_schema_info, p.op_to_rules, p.op_single_dim_strategy_funcs,
                              dispatcher._custom_op_handlers)]


def test_register_and_unregister_repeated_change_only_what_each_call_installed():
    """A second register() installs nothing and says so; unregistering its report leaves the
    first's in place; unregistering the first twice gives DTensor back exactly its own."""
    ops = ["aten._add_relu.Tensor", "aten.fill_.Scalar", "aten.nonzero.default"]  # table, refuted, handler
    before = _dtensor_tables()
    first = dtensor_rules.register(ops)
    assert set(first.installed) == {"aten._add_relu.Tensor", "aten.fill_.Scalar"}, first
    assert "aten.nonzero.default" in first.handled, first
    installed = _dtensor_tables()
    second = dtensor_rules.register(ops)
    assert not second.installed and not second.replaced and not second.handled, second
    assert second.skipped["aten._add_relu.Tensor"] == "installed already, by an earlier register()"
    dtensor_rules.unregister(second)
    assert _dtensor_tables() == installed
    dtensor_rules.unregister(first)
    dtensor_rules.unregister(first)
    assert _dtensor_tables() == before
    with pytest.raises(TypeError, match=r"unregister takes the RegisterReport that register\(\) .* got None"):
        dtensor_rules.unregister(None)


def test_register_refuses_an_op_name_this_torch_does_not_have():
    with pytest.raises(ValueError, match=r"no op is named 'aten.mm.defualt' in this torch: .*'aten.mm.default'"):
        dtensor_rules.register(["aten.mm.default", "aten.mm.defualt"])
