"""Calling a model parallelize() planned on DTensor (fake process group + LocalTensorMode,
mesh of 4) as a training loop does: inputs laid out otherwise, train and eval modes,
dropout, an optimizer step with the returned gradients, constraints that cannot hold."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.distributed._local_tensor import LocalTensorMode  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import Partial, Shard  # noqa: E402

from metaspmd.backends.torch.parallelize import parallelize  # noqa: E402

WORLD = 4


def planned(model, x, cache, **kw):
    with LocalTensorMode(frozenset(range(WORLD))):
        return parallelize(model, DeviceMesh("cpu", list(range(WORLD))), (x,), cache=cache, **kw)


def call(p, *inputs):
    with LocalTensorMode(frozenset(range(WORLD))):
        return p(*inputs)


class Flattened(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x.reshape(-1, 16))


def test_a_permuted_input_runs_as_a_contiguous_one(fake_world, cache):
    """The graph's reshape is a view, traced on a contiguous example: a permuted input of
    the same shape is a copy in eager, and must not reach the view with its own strides."""
    torch.manual_seed(0)
    model = Flattened()
    p = planned(model, torch.randn(2, 8, 16), cache)
    permuted = torch.randn(16, 8, 2).permute(2, 1, 0)
    assert not permuted.is_contiguous()
    out, grads = call(p, permuted)
    torch.testing.assert_close(out, model(permuted))
    ref = torch.autograd.grad(model(permuted).sum(), list(model.parameters()))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r)


def test_outputs_and_gradients_are_plain_tensors(fake_world, cache):
    """Under LocalTensorMode a full tensor holds a copy per simulated rank: an SGD step with
    it outside the mode would apply once per rank."""
    torch.manual_seed(0)
    model, x = nn.Linear(16, 16), torch.randn(8, 16)
    p = planned(model, x, cache)
    out, (gw, gb) = call(p, x)
    assert type(out) is torch.Tensor and type(gw) is torch.Tensor and type(gb) is torch.Tensor
    ref = torch.autograd.grad(model(x).sum(), model.weight)[0]
    expected = model.weight.detach() - 0.1 * ref
    with torch.no_grad():
        model.weight -= 0.1 * gw
    torch.testing.assert_close(model.weight.detach(), expected)


def test_another_training_mode_is_refused_by_module_name(fake_world, cache):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Linear(32, 4)).train()
    x = torch.randn(8, 16)
    p = planned(model, x, cache)
    model.eval()
    before = model[1].running_mean.clone()
    with pytest.raises(ValueError, match=r"module 'Sequential' is in eval mode, but the plan was traced in training"):
        call(p, x)
    assert torch.equal(model[1].running_mean, before)  # nothing ran
    model.train()
    model[0].eval()  # one submodule: named
    with pytest.raises(ValueError, match=r"module '0' is in eval mode"):
        call(p, x)
    model[0].train()
    call(p, x)


def test_dropout_draws_the_mask_one_device_draws(fake_world, cache):
    """A dropout mask cut by columns is drawn whole on every rank, each keeping its shard:
    the mask one device draws from the same generator state, not one shard's mask
    repeated on every shard."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)).train(), torch.randn(8, 16)
    p = planned(model, x, cache)
    draws = [n for n in p.plan.nodes if "bernoulli" in n.name]
    assert draws, "dropout traces to a bernoulli fill"
    assert any("S(" in str(n.strategy) for n in draws), "the plan cuts the draw"
    torch.manual_seed(5)
    out, _ = call(p, x)
    torch.manual_seed(5)
    ref = model(x)
    torch.testing.assert_close(out, ref.detach())
    kept = out != 0
    assert not all(torch.equal(row[:4], row[4:8]) and torch.equal(row[:4], row[8:12]) for row in kept)


def draws_as_eager(p, model, x):
    """``p``'s outputs and gradients are eager's, drawn from the same generator state."""
    torch.manual_seed(3)
    out, grads = call(p, x)
    torch.manual_seed(3)
    ref = model(x)
    torch.testing.assert_close(out, ref.detach())
    for g, r in zip(grads, torch.autograd.grad(ref.sum(), list(model.parameters()))):
        torch.testing.assert_close(g, r)


class TransposedThenDropped(nn.Module):
    """Dropout of a transposed activation: eager draws its noise into a tensor laid out as
    the activation (``empty_like``), in memory order."""

    def __init__(self, last: int):
        super().__init__()
        self.fc, self.drop, self.last = nn.Linear(16, 16), nn.Dropout(0.3), last

    def forward(self, x):
        y = self.fc(x).transpose(1, self.last) * 1.0
        return self.drop(y).sum(0)


@pytest.mark.parametrize("last", [2, 1])
def test_dropout_of_a_strided_activation_draws_eagers_mask(fake_world, cache, last):
    """functionalize turns the noise's bernoulli_ into bernoulli.p, which drew in index
    order into a contiguous tensor: under the same generator state another mask than
    eager's (a MultiheadAttention output's diagonal, dropped, was off by 1.26). A
    transpose of a dim with itself, contiguous, is the control."""
    torch.manual_seed(0)
    model, x = TransposedThenDropped(last).train(), torch.randn(6, 8, 16)
    draws_as_eager(planned(model, x, cache), model, x)


class AttentionThenDropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.drop = nn.MultiheadAttention(8, 1, batch_first=True), nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.attention(x, x, x, need_weights=False)[0])


def test_dropout_after_attention_is_captured_and_draws_eagers_mask(fake_world, cache):
    """The attention's output is a transposed view; the contiguous mask bernoulli.p drew
    reached a view in the backward that needs the noise's own strides, and capture failed
    with "view size is not compatible with input tensor's size and stride"."""
    torch.manual_seed(0)
    model, x = AttentionThenDropped().train(), torch.randn(4, 4, 8)
    draws_as_eager(planned(model, x, cache), model, x)


class Bernoulli(nn.Module):
    """A mask drawn from a tensor of probabilities, then dropout: on (2, 3) nothing splits
    over 4 ranks, so both draws are planned replicated."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        h = x * self.w
        return nn.functional.dropout(h * torch.bernoulli(torch.full_like(h, 0.5)), 0.5, True)


def test_a_replicated_draw_from_probabilities_moves_the_ranks_generators(fake_world, cache):
    """bernoulli of a probability tensor drew on the replicated plain tensor, from the
    process's generator, not the simulated ranks' own: the dropout after it drew from a
    state that had not moved (a wrong mask), and the next call repeated the first one's."""
    torch.manual_seed(0)
    model, x = Bernoulli(), torch.randn(2, 3)
    p = planned(model, x, cache, backward=False)
    assert all(n.strategy.label == "R" for n in p.plan.nodes if "bernoulli" in n.name), p.explain()
    torch.manual_seed(3)
    outs = [call(p, x) for _ in range(2)]
    torch.manual_seed(3)
    refs = [model(x) for _ in range(2)]
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref.detach())
    assert not torch.equal(outs[0], outs[1])


class Logged(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).log()


def test_an_output_holding_nan_comes_back_as_eagers(fake_world, cache):
    """The log of negative entries is NaN on one device and on every simulated rank alike:
    the ranks' copies agree, NaN where NaN (``LocalTensor.reconcile``, comparing with ==,
    raised "LocalTensor shards must be the same to reconcile")."""
    torch.manual_seed(0)
    model, x = Logged(), torch.randn(6, 4)
    p = planned(model, x, cache)
    out, grads = call(p, x)
    ref = model(x)
    assert ref.isnan().any()
    torch.testing.assert_close(out, ref.detach(), equal_nan=True)
    for g, r in zip(grads, torch.autograd.grad(ref.sum(), list(model.parameters()))):
        torch.testing.assert_close(g, r, equal_nan=True)


def test_replicated_draws_follow_one_devices_generator_from_draw_to_draw_and_call_to_call(fake_world, cache):
    """Two dropouts planned replicated: each drew on a plain tensor, which LocalTensorMode's
    per-rank generator states never saw, so the second mask was the first again and every
    call drew the same masks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 16), nn.Dropout(0.5)).train()
    x = torch.randn(8, 16)
    p = planned(model, x, cache)
    assert any("bernoulli" in n.name and n.strategy.label == "R" for n in p.plan.nodes), p.explain()
    torch.manual_seed(5)
    outs = [call(p, x) for _ in range(2)]
    torch.manual_seed(5)
    refs = [model(x) for _ in range(2)]
    for (out, grads), ref in zip(outs, refs):
        torch.testing.assert_close(out, ref.detach())
        for g, r in zip(grads, torch.autograd.grad(ref.sum(), list(model.parameters()))):
            torch.testing.assert_close(g, r)
    assert not torch.equal(outs[0][0], outs[1][0])


def test_a_call_outside_local_tensor_mode_on_the_fake_world_is_refused(fake_world, cache):
    """The fake process group's collectives move no data: outside LocalTensorMode a plan
    that communicates would give wrong values silently."""
    model, x = nn.Linear(16, 16), torch.randn(8, 16)
    p = planned(model, x, cache)
    with pytest.raises(RuntimeError, match="fake one, whose collectives move no data: call the parallelized model "
                                           "inside LocalTensorMode"):
        p(x)


@pytest.mark.parametrize("constraints, message", [
    ({0: (Shard(1),)}, r"constraint on 0: \[S\(1\)\] cannot place its shape \(4, 3, 8, 8\) .*: dim 1 of size 3 "
                       r"does not split evenly in 4"),
    ({"2.weight": (Shard(0),)}, r"constraint on '2.weight': .*dim 0 of size 10 does not split evenly in 4"),
    ({"0.weight": (Partial(),)}, r"constraint on '0.weight': .*never as Partial summands"),
])
def test_a_constraint_that_cannot_hold_is_refused_by_its_key(fake_world, cache, constraints, message):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    with pytest.raises(ValueError, match=message):
        planned(model, torch.randn(4, 3, 8, 8), cache, constraints=constraints)


def test_parameters_and_buffers_are_read_at_each_call(fake_world, cache):
    """A parameter or buffer replaced after planning (``m.weight = nn.Parameter(w)``,
    ``w.data = ...``, a new buffer tensor) is what the next call computes with, as an
    update in place is; one of another shape, dtype or requires_grad is refused by name."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16)).train(), torch.randn(8, 16)
    p = planned(model, x, cache)
    model[0].weight = nn.Parameter(torch.randn(16, 16))
    model[0].bias.data = torch.randn(16)
    model[1].running_mean = torch.randn(16)
    expected_mean = model[1].running_mean.clone()
    out, grads = call(p, x)
    reference = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16)).train()
    reference.load_state_dict({**model.state_dict(), "1.running_mean": expected_mean})
    torch.testing.assert_close(out, reference(x).detach())
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)  # the new buffer written back
    for g, r in zip(grads, torch.autograd.grad(reference(x).sum(), list(reference.parameters()))):
        torch.testing.assert_close(g, r)
    model.double()
    with pytest.raises(ValueError, match=r"'0.weight' is now float64\[16, 16\], but the plan was traced with "
                                         r"float32\[16, 16\]: parallelize again"):
        call(p, x)
    model.float()
    model[0].bias.requires_grad_(False)
    with pytest.raises(ValueError, match=r"requires_grad changed on \['0.bias'\] since the plan was traced"):
        call(p, x)
    model[0].bias.requires_grad_(True)
    model[0].extra = nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match=r"the module's parameters are now .*'0.extra'.*: parallelize again"):
        call(p, x)


def test_a_functions_list_and_dict_outputs_come_back_as_list_and_dict(fake_world, cache):
    def parts(x):
        return {"a": [x.sum(0), x.mean(0)], "b": (x * 2,)}

    x = torch.randn(8, 16)
    p = planned(parts, x, cache)
    out = call(p, x)
    assert type(out) is dict and type(out["a"]) is list and type(out["b"]) is tuple
    out["c"] = 1  # the caller's own, as the function's eager result is
    torch.testing.assert_close(out["a"][1], x.mean(0))


def test_a_parameter_written_by_the_forward_is_refused_by_name(fake_world, cache):
    """nn.Embedding(max_norm=...) renormalizes its weight in place in the forward: the plan
    writes buffers back, not parameters, so the weight would drift from eager's."""
    model = nn.Sequential(nn.Embedding(32, 8, max_norm=1.0), nn.Linear(8, 4))
    with pytest.raises(ValueError, match=r"the forward writes parameter '0.weight' in place \(aten.embedding_renorm_"):
        planned(model, torch.randint(0, 32, (4, 6)), cache)

    class Halving(nn.Module):  # any other write names no Embedding
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            with torch.no_grad():
                self.fc.weight.mul_(0.5)
            return self.fc(x)

    with pytest.raises(ValueError, match=r"writes parameter 'fc.weight' in place \(aten.mul_.Tensor\), which a plan "
                                         r"does not write back .* keep the value in a buffer") as caught:
        planned(Halving(), torch.randn(2, 4), cache)
    assert "max_norm" not in str(caught.value)


def test_loss_fn_for_a_function_is_refused(fake_world, cache):
    with pytest.raises(TypeError, match="loss_fn applies to a module"):
        planned(lambda x: x * 2, torch.randn(4, 4), cache, loss_fn=lambda out: out.sum())


class Counted(nn.Module):
    """Writes its buffer through views: an element (``__setitem__``) and a slice."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, x):
        with torch.no_grad():
            self.seen[0] += x.shape[0]
            self.seen[1:].add_(x.detach().abs().mean())
        return self.fc(x)


def test_a_buffer_written_through_a_view_is_written_back(fake_world, cache):
    torch.manual_seed(0)
    model, x = Counted(), torch.randn(8, 16)
    reference = Counted()
    reference.load_state_dict(model.state_dict())
    p = planned(model, x, cache)
    for _ in range(2):
        call(p, x)
        reference(x)
    torch.testing.assert_close(model.seen, reference.seen)
    assert model.seen[0] == 16


def written_inputs(a, parts):
    """Writes its first input, and the second through a view inside a dict."""
    a.add_(1)
    parts["b"][0].mul_(2)
    return a * parts["b"].sum(0)


class WritesItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        x.mul_(2)
        return self.fc(x)


def test_inputs_written_in_place_are_written_back_and_the_example_is_left_alone(fake_world, tmp_path):
    """As eager leaves them: the caller's inputs hold the model's writes after a call, and
    planning (which traces and, on a cold cache, runs the graph) writes none of them."""
    from metaspmd.cache import RuleCache

    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(4, 16)
    example = (a.clone(), {"b": b.clone()})
    with LocalTensorMode(frozenset(range(WORLD))):
        p = parallelize(written_inputs, DeviceMesh("cpu", list(range(WORLD))), example, cache=RuleCache(tmp_path))
    assert torch.equal(example[0], a) and torch.equal(example[1]["b"], b)
    given, eager = (a.clone(), {"b": b.clone()}), (a.clone(), {"b": b.clone()})
    torch.testing.assert_close(call(p, *given), written_inputs(*eager))
    torch.testing.assert_close(given, eager)

    model, x = WritesItsInput(), torch.randn(8, 16)
    p = planned(model, x.clone(), RuleCache(tmp_path / "module"))
    given, eager = x.clone(), x.clone()
    out, grads = call(p, given)
    reference = model(eager)
    torch.testing.assert_close(out, reference.detach())
    torch.testing.assert_close(given, eager)
    for g, r in zip(grads, torch.autograd.grad(reference.sum(), list(model.parameters()))):
        torch.testing.assert_close(g, r)


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.mask = torch.ones(16)  # a plain attribute: the trace holds it as a constant

    def forward(self, x):
        return self.fc(x) * self.mask


def test_a_constant_replaced_after_planning_is_refused_by_name(fake_world, cache):
    """The graph holds a module's plain tensor attribute, or a tensor a function closes
    over, as a constant: changed in place it is still what the graph reads; replaced, the
    plan would compute with the old one, so the call is refused, naming it."""
    model, x = Masked(), torch.randn(8, 16)
    p = planned(model, x, cache)
    model.mask[:8] = 0  # in place: the same tensor
    out, _ = call(p, x)
    torch.testing.assert_close(out, model(x).detach())
    model.mask = torch.zeros(16)
    with pytest.raises(ValueError, match=r"attribute 'mask' was replaced since the plan was traced"):
        call(p, x)

    scale = torch.full((16,), 2.0)

    def scaled(x):
        return x * scale

    p = planned(scaled, x, cache)
    torch.testing.assert_close(call(p, x), x * 2)
    scale = torch.full((16,), 3.0)  # noqa: F841 - rebinds the variable the function reads
    with pytest.raises(ValueError, match=r"the variable 'scale' the function reads was replaced"):
        call(p, x)


class KeepsItsOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.last = torch.zeros(8, 16)  # written by the forward, never read

    def forward(self, x):
        y = self.fc(x)
        self.last = y.detach()
        return y


def test_an_attribute_the_forward_only_writes_is_no_constant_and_tracing_leaves_it(fake_world, cache):
    """Planning left the trace's fake tensor in the attribute, and the constant check
    must not refuse what the graph never reads."""
    model, x = KeepsItsOutput(), torch.randn(8, 16)
    before = model.last
    p = planned(model, x, cache)
    assert model.last is before
    out, _ = call(p, x)
    torch.testing.assert_close(out, model.fc(x).detach())


def test_inputs_of_another_structure_are_refused_where_they_differ(fake_world, cache):
    """The refusal printed both TreeSpecs over several lines, naming no input."""
    import collections

    Pair = collections.namedtuple("Pair", "left right")

    def pairs(x):
        return x["a"][0] + x["a"][1] * x["b"].left - x["b"].right

    a, b = torch.randn(4, 4), torch.randn(4, 4)
    p = planned(pairs, {"a": (a, b), "b": Pair(a, b)}, cache)
    torch.testing.assert_close(call(p, {"a": (a, b), "b": Pair(a, b)}), pairs({"a": (a, b), "b": Pair(a, b)}))
    cases = (({"a": [a, b], "b": Pair(a, b)}, r"input 0\['a'\] is a list of 2, but the plan is for a tuple of 2"),
             ({"a": (a, b, b), "b": Pair(a, b)}, r"input 0\['a'\] is a tuple of 3, but the plan is for a tuple of 2"),
             ({"a": (a, (b,)), "b": Pair(a, b)}, r"input 0\['a'\]\[1\] is a tuple of 1, but the plan is for one value"),
             ({"a": (a, b), "b": (a, b)}, r"input 0\['b'\] is a tuple of 2, but the plan is for a Pair"),
             ({"a": (a, b), "c": Pair(a, b)},
              r"input 0 is a dict with keys \['a', 'c'\], but the plan is for a dict with keys \['a', 'b'\]"))
    for given, message in cases:
        with pytest.raises(TypeError, match=message):
            call(p, given)


def test_inputs_passed_by_keyword_are_refused_by_name(fake_world, cache):
    p = planned(nn.Linear(4, 4), torch.randn(2, 4), cache)
    with pytest.raises(TypeError, match=r"the plan takes its inputs by position, in example_inputs' order; got "
                                        r"keyword argument 'input'"):
        with LocalTensorMode(frozenset(range(WORLD))):
            p(input=torch.randn(2, 4))


def test_a_constraint_key_that_names_nothing_lists_the_names_a_key_may_take(fake_world, cache):
    """A nested input's own position names no single value: it was listed among the names."""
    from torch.distributed.tensor import Shard

    a = torch.randn(4, 4)
    with pytest.raises(KeyError, match=r"constraint on 'input 0\[5\]': no such value \(inputs are 'input 0\[0\]', "
                                       r"'input 0\[1\]', or name a graph var\)"):
        planned(lambda pair: pair[0] * pair[1], (a, a), cache, constraints={"input 0[5]": (Shard(0),)})
