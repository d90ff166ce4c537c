"""Rank queries (linalg_matrix_rank) verified on matrices of chosen ranks.

Random matrices have full rank, on every row block as on the whole: the ranks of row
blocks add up, and a Partial summand's rank is the whole's. So random trials passed a
row cut as reduce(sum) and a Partial input as identity. sample_data.with_low_rank fills
the special-value trials with matrices of rank 0 to full, whose blocks' ranks neither add
up to nor equal the whole's; only a cut that keeps every matrix whole holds there."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from metaspmd.backends.torch import catalog, get_backend  # noqa: E402
from metaspmd.backends.torch.backend import torch_case  # noqa: E402
from metaspmd.backends.torch import sample_data  # noqa: E402
from metaspmd.backends.torch.sample_data import with_low_rank  # noqa: E402
from metaspmd.case import SpecialValues  # noqa: E402
from metaspmd.combine import Split, partial_summands  # noqa: E402
from metaspmd.explorer import explore_case  # noqa: E402
from metaspmd.explorer.common import SPECIAL_TRIALS, TRIAL_SPLITS  # noqa: E402
from metaspmd.signature import signature  # noqa: E402
from metaspmd.spec import strategies  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore"),  # an out= call resizes its output (torch warns)
    pytest.mark.xdist_group("rank_queries"),  # its module fixture set up once, on one worker (--dist loadgroup)
]

RANK = torch.ops.aten.linalg_matrix_rank.atol_rtol_tensor
# a combine of the local ranks (one tensor per shard, of the global shape)
COMBINES = {
    "reduce(sum)": lambda r: torch.stack(r).sum(0), "reduce(max)": lambda r: torch.stack(r).amax(0),
    "reduce(min)": lambda r: torch.stack(r).amin(0), "reduce(prod)": lambda r: torch.stack(r).prod(0),
    "identity": lambda r: r[0],
}


def _strategies(entry) -> set[str]:
    return {f"{tuple(str(p) for p in s.inputs)} -> {' ; '.join(str(o) for o in s.outputs)}"
            for s in strategies(entry.shard, entry.partial, entry.combine, entry.offset)}


def _trials(x: torch.Tensor, tols: dict | None = None) -> list[tuple[torch.Tensor, dict]]:
    """The special-value trials' inputs, as the explorer draws them (k = 1 .. SPECIAL_TRIALS)."""
    out = []
    for k in range(1, SPECIAL_TRIALS + 1):
        (a,), kwargs = with_low_rank((x,), dict(tols or {}), k, seed=500 + k)
        out.append((a, kwargs))
    return out


def test_low_rank_trials_hold_ranks_from_zero_to_full_and_repeat_by_seed():
    x = torch.randn(2, 5, 5, dtype=torch.float64)
    ranks = set()
    for k, (a, _) in enumerate(_trials(x), start=1):
        assert a.shape == x.shape and a.dtype == x.dtype
        again, _ = with_low_rank((x,), {}, k, seed=500 + k)
        assert torch.equal(a, again[0])  # deterministic in its seed
        ranks |= set(torch.linalg.matrix_rank(a).tolist())
        if k % 2:  # a Hermitian rank reads one triangle: square matrices are Hermitian on odd k
            assert torch.equal(a, a.mT)
            assert torch.equal(torch.linalg.matrix_rank(a, hermitian=True), torch.linalg.matrix_rank(a))
    assert {0, 5} <= ranks and len(ranks) >= 4, ranks  # rank 0, full rank and between
    other, _ = with_low_rank((x,), {}, 1, seed=1)
    assert not torch.equal(other[0], _trials(x)[0][0])  # another seed, other matrices
    complex_, _ = with_low_rank((x.to(torch.complex128),), {}, 2, seed=2)
    assert complex_[0].dtype == torch.complex128 and complex_[0].imag.abs().sum() > 0


@pytest.mark.parametrize("shape", [(2, 5, 5), (5, 5), (4, 6), (3, 6, 4)])
@pytest.mark.parametrize("dim", [-2, -1])
def test_low_rank_trials_refute_every_combine_of_cut_ranks_on_every_split(shape, dim):
    """A row or column cut: on every split the explorer tries, each combine of the local
    ranks misses the whole's on some trial, where on random matrices (full rank) a sum of
    row blocks' ranks, or the max of column blocks' ranks of a tall matrix, holds."""
    x = torch.randn(*shape, dtype=torch.float64)
    random_holds = set()
    for split in TRIAL_SPLITS:
        bounds = split.bounds(x.shape[dim])
        refuted = set()
        for a, _ in _trials(x):
            whole = torch.linalg.matrix_rank(a)
            parts = [torch.linalg.matrix_rank(a.narrow(dim, s, n)) for s, n in bounds]
            refuted |= {name for name, f in COMBINES.items() if not torch.equal(f(parts), whole)}
        assert refuted == set(COMBINES), (split, set(COMBINES) - refuted)
        whole = torch.linalg.matrix_rank(x)
        parts = [torch.linalg.matrix_rank(x.narrow(dim, s, n)) for s, n in bounds]
        random_holds |= {name for name, f in COMBINES.items() if torch.equal(f(parts), whole)}
    assert random_holds  # the random matrix alone refutes fewer


def _blocks(a: torch.Tensor, dim: int, bounds, halo: int) -> list[torch.Tensor]:
    """The shards of a cut along ``dim``, each widened by ``halo`` on both sides."""
    size = a.shape[dim]
    return [a.narrow(dim, max(0, s - halo), min(size, s + n + halo) - max(0, s - halo)) for s, n in bounds]


@pytest.mark.parametrize("shape", [(m, n) for m in (2, 3, 5, 6) for n in (2, 3, 5, 6)])
@pytest.mark.parametrize("dim", [-2, -1])
def test_every_combine_of_cut_ranks_is_refuted_within_the_trials_of_one_matrix(shape, dim):
    """A single matrix of any size (no batch to vary its rank along) meets every matrix
    shape within SPECIAL_TRIALS trials: on every split each combine of the blocks' ranks
    misses the whole's on some trial, and with a halo of 1 on some split. The trials
    chose a rank and a shape from a cycle too short for small matrices: a 2 x 6 matrix met
    no two nonzero parallel rows (a row cut passed as reduce(sum)), and a 3 x 6 one no full
    rank held by columns far apart (a column cut with a halo passed as reduce(max))."""
    x = torch.randn(*shape, dtype=torch.float64)
    trials = [a for a, _ in _trials(x)]
    for k, a in enumerate(trials, start=1):  # ranks are exact: the factors have full column rank
        rank, _ = sample_data._rank_and_shape(*shape, k - 1)
        assert int(torch.linalg.matrix_rank(a)) == rank, (k, a)
    halo_refuted = set()
    for split in TRIAL_SPLITS:
        bounds = split.bounds(x.shape[dim])
        if bounds is None:
            continue
        for halo, refuted in ((0, set()), (1, halo_refuted)):
            for a in trials:
                whole = torch.linalg.matrix_rank(a)
                parts = [torch.linalg.matrix_rank(b) for b in _blocks(a, dim, bounds, halo)]
                refuted |= {name for name, f in COMBINES.items() if not torch.equal(f(parts), whole)}
            if halo == 0:
                assert refuted == set(COMBINES), (split, set(COMBINES) - refuted)
    if x.shape[dim] >= 5:  # shorter, a halo of 1 widens some block to the whole matrix, whose
        # rank every combine of it returns; the explorer verifies halos at lengthened sizes too
        assert halo_refuted == set(COMBINES), set(COMBINES) - halo_refuted


@pytest.mark.parametrize("shape", [(2, 6), (6, 2), (2, 3), (3, 6), (4, 6), (5, 5)])
@pytest.mark.parametrize("overload, args", [
    (torch.ops.aten.linalg_matrix_rank.default, (0.5,)),
    (torch.ops.aten.linalg_matrix_rank.atol_rtol_float, ()),
    (torch.ops.aten.linalg_matrix_rank.atol_rtol_tensor, ()),
])
def test_live_exploration_of_one_matrix_keeps_it_whole(shape, overload, args):
    """The runtime's exploration of a call on one matrix: no cut of it holds (a rank is no
    combine of its blocks' ranks), so the call runs replicated. A 2 x 6 matrix's row cut
    came out as reduce(sum), a 3 x 6 one's column cut with a halo as reduce(max)."""
    from metaspmd.backends.torch.rules_at_runtime import call_case

    ops = get_backend(opinfos=()).tensor_ops()
    e = explore_case(call_case(overload, (torch.randn(*shape), *args), {}), ops)
    assert e.status == "replicate-only", _strategies(e)


def test_low_rank_trials_refute_a_partial_matrix():
    """Parts of a matrix (fractions of each element, as the explorer splits a Partial(sum)
    input beside special values) have full rank: neither one part's rank (identity) nor
    their sum is the whole's once the whole is rank deficient."""
    ops = get_backend(opinfos=()).tensor_ops()
    for split in (Split(2), Split(3)):
        refuted = set()
        for k, (a, _) in enumerate(_trials(torch.randn(2, 5, 5, dtype=torch.float64)), start=1):
            parts = partial_summands(ops, a, split.n, seed=k, aligned=True)
            assert torch.allclose(sum(parts), a)
            whole = torch.linalg.matrix_rank(a)
            ranks = [torch.linalg.matrix_rank(p) for p in parts]
            refuted |= {name for name, f in COMBINES.items() if not torch.equal(f(ranks), whole)}
        assert refuted == set(COMBINES)


def test_tolerances_are_positive_and_decide_ranks():
    """The tolerance tensors (atol, rtol) are positive, spread over the singular values
    (rtol as a fraction of the largest), so a Partial tolerance (its parts smaller than it)
    changes some rank: identity is refuted."""
    x = torch.randn(2, 5, 5, dtype=torch.float64)
    ops = get_backend(opinfos=()).tensor_ops()
    for name in ("atol", "rtol"):
        changed = 0
        for k, (a, kwargs) in enumerate(_trials(x, {name: torch.ones(2, dtype=torch.float64)}), start=1):
            tol = kwargs[name]
            assert tol.shape == (2,) and bool((tol > 0).all())
            part = partial_summands(ops, tol, 2, seed=k, aligned=True)[0]
            changed += not torch.equal(torch.linalg.matrix_rank(a, **{name: part}),
                                       torch.linalg.matrix_rank(a, **{name: tol}))
        assert changed, name


def test_rank_queries_verify_on_low_rank_special_values():
    case = torch_case(RANK, (torch.randn(3, 4, 4, dtype=torch.float64),), {}, RANK)
    assert case.special is with_low_rank and case.special_always
    assert catalog.no_rule_reason(torch.ops.aten.linalg_matrix_rank.atol_rtol_float) is None


@pytest.mark.parametrize("hermitian", [False, True])
def test_a_batched_rank_keeps_its_batch_cut_alone(hermitian):
    """Default tolerances: random matrices leave every rank full, constant, so no combine
    could be verified; on low-rank trials the batch cut (each matrix whole on one shard)
    verifies and the row, column and Partial cuts do not. A Hermitian rank reads one
    triangle: Partial parts of a low-rank Hermitian matrix are not Hermitian, and their
    triangles have full rank."""
    def sample(seed: int) -> tuple[tuple, dict]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 5, 5 if hermitian else 3, generator=g, dtype=torch.float64)
        return (x + x.mT if hermitian else x,), {"hermitian": hermitian}

    ops = get_backend(opinfos=()).tensor_ops()
    case = torch_case(RANK, *sample(0), RANK, fresh=sample)
    e = explore_case(case, ops)
    assert e.status == "ok" and _strategies(e) == {"('S(0)',) -> gather(dim=0)"}, _strategies(e)
    off = explore_case(dataclasses.replace(case, specials=SpecialValues()), ops)
    assert off.status == "replicate-only" and "does not vary" in off.reason


@pytest.fixture(scope="module")
def opinfo_cases():
    backend = get_backend(opinfos=("linalg.matrix_rank",))
    ops = backend.tensor_ops()
    return ops, {signature(ops, c.arg_names, c.args, c.kwargs, c.exact_sizes): c
                 for c in backend.cases("aten.linalg_matrix_rank.atol_rtol_tensor")}


@pytest.mark.parametrize("sig, wrong, right", [
    # OpInfo's relative tolerance is ones; blind trials redraw it signed, and a negative one
    # counts every singular value: full rank everywhere, where a sum of row blocks' ranks
    # and a batch cut beside the whole tolerance passed
    ("input:f[*,*,*] rtol:f[*]", {"('S(0)', 'R') -> identity", "('S(1)', 'R') -> reduce(sum)"},
     {"('S(0)', 'S(0)') -> gather(dim=0)"}),
    ("input:f[*,*] rtol:f[]", {"('P(sum)', 'R') -> identity", "('S(0)', 'R') -> reduce(sum)",
                               "('S(1)', 'R') -> reduce(sum)"}, set()),
])
def test_wrong_combines_pass_random_trials_and_fail_low_rank_ones(opinfo_cases, sig, wrong, right):
    ops, cases = opinfo_cases
    case = cases[sig]
    assert case.special is with_low_rank and case.special_always
    off = explore_case(dataclasses.replace(case, specials=SpecialValues()), ops)
    assert off.status == "ok" and wrong <= _strategies(off), _strategies(off)
    on = explore_case(case, ops)
    assert (_strategies(on) if on.status == "ok" else set()) == right


def test_tolerance_tensors_are_cut_with_their_matrices_never_partial(opinfo_cases):
    """A tolerance tensor holds one value per matrix of the batch: it is cut with the batch,
    never replicated beside a cut batch, and never Partial (a rank is a step function of it)."""
    ops, cases = opinfo_cases
    for sig in ("input:f[*,*,*] atol:f[*]", "input:f[*,*,*] atol:f[*] rtol:f[*]"):
        e = explore_case(cases[sig], ops)
        n = sig.count(":f[")
        assert e.status == "ok" and _strategies(e) == {f"{('S(0)',) * n} -> gather(dim=0)"}, (sig, _strategies(e))


def test_every_rank_overload_gets_low_rank_trials():
    for name in catalog.all_overloads():
        func = catalog.resolve(name)
        if catalog.aten_base(func) in catalog.RANK_QUERIES:
            assert catalog.aten_base(func) in catalog.SPECIAL_VALUE_SENSITIVE
            assert catalog.no_rule_reason(func) is None, name

