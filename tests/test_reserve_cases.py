"""Spare samples (OpCase.reserve): explored only where the op's first samples give no
strategy, and kept only for a rule that cuts a dim."""

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from metaspmd.case import OpCase
from metaspmd.explorer import explore_op

sys.path.insert(0, str(Path(__file__).parent))  # the fake backend's numpy TensorOps
from fake_backend.numpy_ops import NumpyOps  # noqa: E402


def _var_case(shape, axis, reserve=False):
    def inputs(seed):
        return (np.random.default_rng(seed).standard_normal(shape),), {"axis": axis}

    args, kwargs = inputs(0)
    return OpCase("np.var", np.var, args, kwargs, ("self",), fresh=lambda seed: inputs(seed + 1), reserve=reserve)


class _Backend:
    name = "fake"

    def __init__(self, cases):
        self._cases = cases

    def tensor_ops(self):
        return NumpyOps()

    def list_ops(self):
        return ["np.var"]

    def cases(self, op):
        return list(self._cases)


def _signatures(cases):
    return [(e.signature, e.status) for e in explore_op(_Backend(cases), "np.var").entries]


def test_a_spare_sample_is_explored_where_the_first_give_no_strategy():
    full = _var_case((4, 6), None)  # var of everything: no combine rebuilds it
    rows = _var_case((4, 6), 1, reserve=True)  # var of each row: the rows gather
    assert _signatures([full, rows]) == [("self:f[*,*] axis=1", "ok"), ("self:f[*,*] axis=None", "replicate-only")]


def test_a_spare_sample_is_not_explored_beside_a_rule():
    rows = _var_case((4, 6), 1)
    cols = _var_case((4, 6), 0, reserve=True)
    assert _signatures([rows, cols]) == [("self:f[*,*] axis=1", "ok")]


def test_a_spare_sample_without_a_rule_is_dropped():
    full = _var_case((4, 6), None)
    also_full = replace(_var_case((3, 5, 2), None), reserve=True)
    assert _signatures([full, also_full]) == [("self:f[*,*] axis=None", "replicate-only")]
