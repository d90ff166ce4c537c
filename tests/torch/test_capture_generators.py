"""Capturing a model leaves the program's random generator where it was: tracing and
recording the example's values run its dropout, and a program that plans before it trains
must draw the same masks as one that does not."""

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch.capture import capture  # noqa: E402


def test_capture_and_its_recorded_values_leave_the_generator():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    torch.manual_seed(0)
    expected = torch.rand(3)  # the program's next draw, had it not captured anything
    torch.manual_seed(0)
    captured = capture(model, (x,))
    # the values are recorded on this first access, dropout included
    assert any("dropout" in str(captured.nodes[n].target) or "bernoulli" in str(captured.nodes[n].target)
               for n in captured.values)
    assert torch.equal(torch.rand(3), expected)
