"""Hand samples explored in place of OpInfo's (hand_samples.LEADING): ctc_loss's OpInfo
samples give every sequence all the steps, so a cut of input_lengths has equal shards,
which prove nothing, and its batch cut was never verified."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import catalog, hand_samples  # noqa: E402
from metaspmd.backends.torch.backend import make_runner, torch_case  # noqa: E402
from metaspmd.backends.torch.samples import call_signature  # noqa: E402
from metaspmd.backends.torch.tensor_ops import TorchOps  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402

CTC = "aten.ctc_loss.Tensor"


def _explore(func, build):
    args, kwargs = build(0)
    return explore_case(torch_case(func, args, kwargs, make_runner(func), build), TorchOps())


@pytest.mark.parametrize("key,combine", [("ctc_loss:none", "gather(dim=0)"), ("ctc_loss:mean", "reduce(avg)")])
def test_ctc_loss_batch_cut_verifies_on_lengths_of_its_own(key, combine):
    func = catalog.resolve(CTC)
    guess = hand_samples.HandGuess(key, hand_samples.LEADING[CTC][key][1])
    args, _ = hand_samples.inputs(func, guess, 0)
    assert len(set(args[2].tolist())) > 1 and len(set(args[3].tolist())) > 1  # lengths vary by sequence
    entry = _explore(func, lambda seed: hand_samples.inputs(func, guess, seed))
    assert entry.status == "ok", entry.reason
    assert str(entry.shard) == "[[N, S1, N], [S1, N], [S1], [S1]]" and str(entry.combine) == "{S1: " + combine + "}"


@pytest.mark.parametrize("guess", hand_samples.leading(catalog.resolve(CTC)), ids=str)
def test_a_leading_sample_runs_on_every_seed_with_its_shapes(guess):
    func = catalog.resolve(CTC)
    first = hand_samples.inputs(func, guess, 0)
    for seed in range(1, 17):
        args, kwargs = hand_samples.inputs(func, guess, seed)
        assert kwargs == first[1] and args[4:] == first[0][4:]
        assert [x.shape for x in args[:4]] == [x.shape for x in first[0][:4]]
        assert not torch.equal(args[0], first[0][0])
        assert bool((args[2] >= 2 * args[3] + 1).all())  # long enough for every label and blank
        func(*args, **kwargs)


def test_ctc_loss_with_every_sequence_full_length_proves_nothing():
    # OpInfo's case: the same call with input_lengths all T is replicate-only
    func = catalog.resolve(CTC)
    guess = hand_samples.HandGuess("ctc_loss:none", "float64")

    def full(seed):
        args, kwargs = hand_samples.inputs(func, guess, seed)
        return (args[0], args[1], torch.full_like(args[2], args[0].shape[0]), *args[3:]), kwargs

    entry = _explore(func, full)
    assert entry.status == "replicate-only" and entry.reason == "no strategy holds", entry


def test_leading_hand_samples_stand_in_for_opinfo_at_their_signatures():
    from metaspmd.backends.torch.backend import TorchBackend

    func = catalog.resolve(CTC)
    none = hand_samples.inputs(func, hand_samples.HandGuess("ctc_loss:none", "float64"), 0)[0]
    # OpInfo's calls as the index gives them: every sequence full length, at a signature a
    # hand sample has (reduction none) and at one none has (sum)
    full = (none[0], none[1], torch.full_like(none[2], none[0].shape[0]), none[3])
    opinfo = [torch_case(func, (*full, 0, r), {}, make_runner(func)) for r in (0, 2)]
    cases = TorchBackend(model_programs=False)._with_hand_leads(func, opinfo)
    leads = hand_samples.leading(func)
    signatures = [call_signature(func, c.args, c.kwargs) for c in cases]
    assert len(cases) == len(leads) + 1 and len(set(signatures)) == len(cases)
    assert all(len(set(c.args[2].tolist())) > 1 for c in cases[: len(leads)])  # the hand samples first
    assert cases[-1] is opinfo[1]  # OpInfo's call at the hand sample's signature dropped, the other kept
    assert TorchBackend(model_programs=False)._with_hand_leads(catalog.resolve("aten.mm.default"), opinfo) is opinfo


def test_repeat_interleave_counts_cut_with_positions_offset():
    # OpInfo's counts are the same on every trial: the output never varied
    func = catalog.resolve("aten.repeat_interleave.Tensor")
    (guess,) = hand_samples.leading(func)
    entry = _explore(func, lambda seed: hand_samples.inputs(func, guess, seed))
    assert entry.status == "ok", entry.reason
    assert str(entry.combine) == "{S1: gather(dim=0, positions)}"  # each shard's positions moved by its start
    fixed = hand_samples.inputs(func, guess, 0)
    assert _explore(func, lambda seed: fixed).status == "replicate-only"


@pytest.mark.parametrize("op,shard,combine", [
    ("aten.linalg_matrix_rank.default", "[[S1, N, N]]", "{S1: gather(dim=0)}"),
    ("aten.nuclear_norm.default", "[[S1, N, N]]", "{S1: gather(dim=0)}"),
    ("aten.vander.default", "[[S1]]", "{S1: gather(dim=0)}"),
])
def test_a_lead_with_a_batch_or_a_fixed_width_gets_the_rules_opinfo_calls_lack(op, shard, combine):
    """OpInfo calls these on one matrix, or with the width following len(x): no strategy
    holds there, and the op was called replicate-only, which is not true of it."""
    func = catalog.resolve(op)
    (guess,) = hand_samples.leading(func)
    entry = _explore(func, lambda seed: hand_samples.inputs(func, guess, seed))
    assert (entry.status, str(entry.shard), str(entry.combine)) == ("ok", shard, combine)


def test_histogramdd_with_a_range_sums_the_shards_counts():
    """Without a range each shard's bins are its own data's; with one they are the input's."""
    func = catalog.resolve("aten.histogramdd.int_bins")
    (guess,) = hand_samples.leading(func)
    entry = _explore(func, lambda seed: hand_samples.inputs(func, guess, seed))
    assert entry.status == "ok" and str(entry.shard) == "[[S1, N]]"
    assert str(entry.combine).startswith("{S1: [reduce(sum), ")


def test_an_out_overload_is_led_by_its_functional_ops_hand_samples():
    """repeat_interleave.Tensor_out had only OpInfo's counts, the same on every trial, and
    was replicate-only ("output 0 does not vary") where the functional op has its rule."""
    from metaspmd.backends.torch.backend import TorchBackend

    func = catalog.resolve("aten.repeat_interleave.Tensor_out")
    (case,) = TorchBackend(model_programs=False)._with_hand_leads(func, [])
    entry = explore_case(case, TorchOps())
    assert entry.status == "ok" and str(entry.combine) == "{S1: gather(dim=0, positions)}"
