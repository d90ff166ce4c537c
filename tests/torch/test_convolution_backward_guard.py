"""convolution_backward is called only inside its contract: grad_output shaped as the
forward's output of input and weight. The kernel loops over input's batch reading
grad_output by it, unchecked, so a lengthened trial with two batches ("rules at other
sizes") read past grad_output, and whether its garbage came out the same twice decided
whether the trial was judged: the op's registry entry changed with the worker's history."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import catalog, get_backend  # noqa: E402
from metaspmd.backends.torch.backend import convolution_output_shape, make_runner, torch_case  # noqa: E402
from metaspmd.case import ShapeRefused  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402

OP = "aten.convolution_backward.default"
FUNC = torch.ops.aten.convolution_backward.default
PARAMS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def _forward_shape(x: tuple, w: tuple, params: dict) -> tuple | None:
    """torch's own forward on zeros of these shapes: its output shape, None where it refuses."""
    try:
        out = torch.ops.aten.convolution.default(
            torch.zeros(x, dtype=torch.float64), torch.zeros(w, dtype=torch.float64), None,
            *(params[n] for n in PARAMS))
    except RuntimeError:
        return None
    return tuple(out.shape)


def test_the_guard_shape_is_the_forwards():
    """The guard's output shape agrees with torch's forward, refusals included, over 1-3
    spatial dims, transposition, groups, strides, paddings, dilations and output paddings
    (channels that do not split into the groups, a kernel wider than the padded input, an
    output padding as wide as stride and dilation)."""
    checked = refused = 0
    for k, transposed, groups, stride, padding, dilation, extra in itertools.product(
            (1, 2, 3), (False, True), (1, 2), (1, 2, 3), (0, 1, 2), (1, 2), (0, 1, 2)):
        if extra and not transposed:
            continue
        params = dict(stride=[stride] * k, padding=[padding] * k, dilation=[dilation] * k, transposed=transposed,
                      output_padding=[extra] * k, groups=groups)
        for x_ch, w0, w1, n, kernel in ((4, 4, 2, 3, 2), (2, 2, 2, 1, 3), (3, 4, 3, 2, 4), (4, 3, 2, 5, 3)):
            x, w = (2, x_ch, *[n] * k), (w0, w1, *[kernel] * k)
            want = _forward_shape(x, w, params)
            assert convolution_output_shape(x, w, params) == want, (x, w, params)
            checked += 1
            refused += want is None
    assert refused and refused < checked  # both sides of the contract were seen


@pytest.fixture(scope="module")
def example():
    """The op's first sample: the call whose entry changed with the worker's history."""
    return next(c for c in get_backend(opinfos=()).cases(OP) if not c.reserve)


def test_a_grad_output_of_another_batch_is_refused(example):
    """A lengthened trial that the kernel took before: grad_output's batch 3, input's 7."""
    assert catalog.exact_guard(FUNC) == "conv_output"
    grad, x, w, *params = example.args
    assert len(example.fn(*example.args)) == 3  # the example itself runs
    longer = [torch.randn(s, dtype=t.dtype) for s, t in (((3, *grad.shape[1:]), grad), ((7, *x.shape[1:]), x))]
    with pytest.raises(ShapeRefused, match="grad_output not shaped"):
        example.fn(*longer, w, *params)
    with pytest.raises(ShapeRefused):
        example.fn(grad[:1], x, w, *params)  # a batch cut of grad_output alone


def test_every_call_the_search_makes_is_inside_the_contract(example):
    """Every call that reaches the kernel while the op is explored (shards, lengthened
    trials, reproductions) has grad_output of the forward's output shape, by torch's own
    forward: none reads past a tensor, so no verdict hangs on garbage."""
    calls = []
    kernel = make_runner(FUNC)

    def recording(*a, **k):
        calls.append(a)
        return kernel(*a, **k)

    case = torch_case(FUNC, example.args, dict(example.kwargs), recording, example.fresh)
    entry = explore_case(case, get_backend(opinfos=()).tensor_ops())
    assert entry.status == "ok" and calls
    names = catalog.positional_names(FUNC)
    outside = set()
    for a in calls:
        items = dict(zip(names, a))
        grad, x, w = (tuple(items[n].shape) for n in ("grad_output", "input", "weight"))
        if grad != _forward_shape(x, w, items):
            outside.add((grad, x, w))
    assert not outside, f"convolution_backward called outside its contract on {sorted(outside)}"


_EXPLORE = """
from metaspmd.backends.torch import get_backend
from metaspmd.explorer import explore_op
backend = get_backend(opinfos=())
backend.prepare()
for e in explore_op(backend, {OP!r}).entries:
    print(e.signature, e.status, e.shard, e.partial, e.combine)
"""


@pytest.mark.slow
def test_the_rules_do_not_follow_the_thread_count():
    """A kernel sums in another order on two threads than on one. A true Partial(sum)
    grad_output rule verified on one thread and not on two, where the locals nearly
    cancelled (a result of 3e-8 from summands near 1), while the tolerance was scaled to the
    result; it is now scaled to the summands (``combine.holds``), and both give one registry entry."""
    import subprocess
    import sys

    from metaspmd import reproducible

    runs = []
    for threads in ("1", "2"):
        env = {**reproducible.child_env(), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", _EXPLORE.format(OP=OP)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(done.stdout)
    assert runs[0] == runs[1]
    assert "S4(sum)" in runs[0]  # Partial(sum) grad_output rules are among them
