"""Reading Shardy's factor rules, and the cross-check built on them."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from metaspmd.backends.jax.shardy import function_factors, parse_rule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_parse_rule():
    r = parse_rule("#sdy.op_sharding_rule<([i, k], [k, j])->([i, j]) {i=4, j=5, k=6} reduction={k}>")
    assert r.operands == ((("i",), ("k",)), (("k",), ("j",))) and r.results == ((("i",), ("j",)),)
    assert r.sizes == {"i": 4, "j": 5, "k": 6} and r.sets["reduction"] == {"k"}
    merged = parse_rule("#sdy.op_sharding_rule<([i, j])->([ij]) {i=4, j=6}>")
    assert merged.results == ((("i", "j"),),)


def test_function_factors_of_matmul_and_cumsum():
    import jax.numpy as jnp
    from jax import lax

    mm = function_factors(lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ()))), [jnp.ones((4, 6)), jnp.ones((6, 5))])
    assert [(f.kind, f.inputs, f.outputs) for f in mm] == [
        ("pass-through", ((0, 0),), ((0, 0),)),
        ("reduction", ((0, 1), (1, 0)), ()),
        ("pass-through", ((1, 1),), ((0, 1),)),
    ]
    # cumsum lowers to a private function holding a reduce_window: followed through the call.
    cs = function_factors(lambda a: lax.cumsum(a, 0), [jnp.ones((4, 6))])
    assert [f.kind for f in cs] == ["permutation", "pass-through"]


def _crosscheck(ops: str, registry) -> str:
    """The jax cross-check's output on ``ops``, run as a fresh process (it asks XLA for
    several CPU devices, which only works before jax starts)."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "crosscheck.py"), "--backend", "jax", "--ops", ops, "--registry", str(registry)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow  # the CLI end to end in a subprocess; its parts are tested in process below
def test_crosscheck_cli_on_a_subset(tmp_path):
    out = _crosscheck("jax.dot_general", tmp_path)
    assert "agree  reduction[" in out  # matmul's contracted dim
    assert "Shardy shardable factors found:" in out
    summary = out[out.index("Shardy shardable factors found:"):]
    found, total = summary.split(":", 1)[1].split("(")[0].strip().split("/")
    assert int(found) == int(total) > 0  # matmul: every factor agrees
    assert "re-verified:" in out and ", 0 failed" in out
    assert "jit on CPU devices:" in out and "0 ok," not in out.split("jit on CPU devices:")[1].split("\n")[0]


def test_reverify_cuts_each_input_by_its_own_size():
    """A joint of independent parts shards dims of different sizes (optimization_barrier's
    x on a dim of 4, y on one of 6): each is cut by its own size, as the explorer does."""
    from metaspmd.backends.jax import get_backend
    from metaspmd.backends.jax.crosscheck import reverify
    from metaspmd.registry_io import load_record

    backend = get_backend()
    case = next(iter(backend.cases("jax.optimization_barrier")))
    entry = load_record(ROOT / "registry" / "jax" / "jax.optimization_barrier.yaml").entries[0]
    joints = entry.joint_strategies()
    mixed = [s for s in joints if s.label == "S1+S3"]
    assert mixed and str(mixed[0]).startswith("S1+S3: (S(0), S(0))")
    for s in joints:
        assert reverify(case, backend.tensor_ops(), s) is None, s


def test_scans_and_reversed_gathers_realise_permutation_factors_only():
    """cumsum's and rev's cut dims are Shardy permutation factors (data moves between
    shards): a scan or a reversed gather realises one; a pass-through factor needs a plain
    gather."""
    from metaspmd.backends.jax.crosscheck import match
    from metaspmd.backends.jax.shardy import Factor
    from metaspmd.spec import OutputCombine, ShardIn, Strategy

    def strategy(text):
        return Strategy("S1", (ShardIn(0),), (OutputCombine.parse(text),))

    for text in ("scan(dim=0, op=sum)", "gather(dim=0, reverse=true)", "gather(dim=0)"):
        permutation = Factor("permutation", 6, ((0, 0),), ((0, 0),), ("reduce_window",))
        assert match(permutation, [strategy(text)]) is not None, text
    passing = Factor("pass-through", 6, ((0, 0),), ((0, 0),), ("add",))
    assert match(passing, [strategy("scan(dim=0, op=sum)")]) is None
    assert match(passing, [strategy("gather(dim=0, reverse=true)")]) is None
    assert match(passing, [strategy("gather(dim=0)")]) is not None
    # the wrong dim matches nothing
    assert match(Factor("permutation", 6, ((0, 0),), ((0, 1),), ("rev",)), [strategy("scan(dim=0, op=sum)")]) is None


# A cross-check process each (tens of seconds): the slow job. The CLI, Shardy's factors and
# the jit run on devices stay in the default run (test_crosscheck_cli_on_a_subset), as do the
# matching these rely on (permutation, Partial) and argreduce's collective.
@pytest.mark.slow
def test_scans_and_reversed_gathers_run_as_collectives_on_cpu_devices(tmp_path):
    """cumsum over a cut axis runs as local scans plus a carry of edge slices, rev as one
    collective permute: their strategies agree with Shardy's permutation factors and give
    the unsharded result under jit + shard_map."""
    out = _crosscheck("jax.cumsum,jax.cumlogsumexp,jax.rev", tmp_path)
    assert "agree  permutation[" in out and "MISS" not in out, out[-3000:]
    jit = out.split("jit on CPU devices:")[1].split("\n")[0]
    assert " 0 failed" in jit and int(jit.split(" ok")[0]) >= 6, jit


@pytest.mark.slow  # a cross-check process, see above
def test_index_offsets_and_widened_halos_realise_shardy_factors(tmp_path):
    """scatter along an indexed operand dim: each shard offsets the positions by its start
    and the op drops the rest, so the operand gathers (run for real under jit + shard_map);
    reduce_window along dims too short for three shards: halos proven on lengthened dims."""
    out = _crosscheck("jax.scatter-add,jax.reduce_window_max", tmp_path)
    summary = out[out.index("Shardy shardable factors found:"):]
    # Left out: the CNN program's pooling, a 2x2 window of stride 2 (non-overlapping), whose
    # spatial factors the explorer does not find yet (a cut of any length splits a window;
    # the cross-check says "needs neighbour exchange beyond a halo"): a gap, not a false rule
    entries = [e for e in re.split(r"\n(?=jax\.)", out) if "window_strides=[1,1,2,2]" not in e]
    missed = [e for e in entries if "MISS   pass-through" in e or "MISS   permutation" in e]
    assert not missed, missed
    scatter = out[out.index("jax.scatter-add"):]
    assert "agree  pass-through[" in scatter and "agree  permutation[" in out[:out.index("jax.scatter-add")]
    assert "re-verified:" in summary and ", 0 failed" in summary
    jit = summary.split("jit on CPU devices:")[1].split("\n")[0]
    assert " 0 failed" in jit, jit


@pytest.mark.slow  # a cross-check process, see above
def test_arg_reductions_xor_and_identity_inits_realise_reduction_factors(tmp_path):
    """argmax over a cut axis: each device's (value, position) pair, all-gathered, names the
    winner (run for real under jit + shard_map); reduce_xor folds by xor; reduce with its
    init set to the computation's identity sums the cut reduced dim; scatter-add with cut
    updates counts its operand once by taking it as Partial, a local step from replicated."""
    out = _crosscheck("jax.argmax,jax.argmin,jax.reduce_xor,jax.reduce,jax.scatter-add", tmp_path)
    assert "MISS   reduction" not in out, out[-3000:]
    assert "argmax" in out and "agree  reduction[" in out[out.index("jax.argmax"):out.index("jax.argmin")]
    assert "(with an input Shardy keeps replicated made Partial, a local step)" in out
    summary = out[out.index("Shardy shardable factors found:"):]
    assert ", 0 failed" in summary.split("re-verified:")[1].split("\n")[0]
    assert " 0 failed" in summary.split("jit on CPU devices:")[1].split("\n")[0]


def test_a_partial_input_beside_a_factor_counts_for_reductions_only():
    from metaspmd.backends.jax.crosscheck import match
    from metaspmd.backends.jax.shardy import Factor
    from metaspmd.spec import OutputCombine, PartialInput, Replicate, ShardIn, Strategy

    beside = Strategy("S1", (PartialInput(), ShardIn(0)), (OutputCombine.parse("reduce(sum)"),))
    assert match(Factor("reduction", 4, ((1, 0),), (), ("scatter",)), [beside]) is beside
    # Partial in the factor's own input, or a factor that keeps its outputs sharded: no
    assert match(Factor("reduction", 4, ((0, 0),), (), ("scatter",)), [beside]) is None
    gathered = Strategy("S1", (PartialInput(), ShardIn(0)), (OutputCombine.parse("gather(dim=0)"),))
    assert match(Factor("pass-through", 4, ((1, 0),), ((0, 0),), ("add",)), [gathered]) is None
    plain = Strategy("S2", (Replicate(), ShardIn(0)), (OutputCombine.parse("reduce(sum)"),))
    assert match(Factor("reduction", 4, ((1, 0),), (), ("scatter",)), [beside, plain]) is plain  # plain first


_ARG_REDUCE_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from metaspmd.backends.jax.collectives import AXIS, arg_reduce
from metaspmd.spec import ArgReduce

x = jnp.asarray(np.random.default_rng(0).integers(-2, 3, (8, 5)).astype(np.float32))  # ties across devices
x = x.at[5, 1].set(jnp.nan)  # NaN wins, as argmax has it
mesh = Mesh(np.array(jax.devices()[:4]), (AXIS,))
for op, fn in (("max", jnp.argmax), ("min", jnp.argmin)):
    local = lambda xs: arg_reduce(ArgReduce(op, 0), fn(xs, axis=0), xs, 0)
    run = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(AXIS),), out_specs=P(), check_vma=False))
    got, want = np.asarray(run(x)), np.asarray(fn(x, axis=0))
    assert np.array_equal(got, want), (op, got, want)
print("ok")
"""


def test_arg_reduce_collective_matches_argmax_on_cpu_devices():
    """argreduce's collective on 4 CPU devices (a fresh process: jax takes the device count
    only before it starts), on data with ties and a NaN across devices."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _ARG_REDUCE_SCRIPT], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


@pytest.mark.slow  # CI's crosscheck --other-calls runs the same check on every rule
def test_other_calls_reverify_the_rules_of_their_signature(capsys):
    """``--other-calls``: the registry's transpose rules re-verified on more program calls of
    their signatures at other shapes; a wrong combine there fails."""
    import dataclasses

    from metaspmd.backends.jax import get_backend
    from metaspmd.backends.jax.crosscheck import recheck_other_calls
    from metaspmd.registry_io import load_record
    from metaspmd.signature import signature
    from metaspmd.spec import CombineSpec

    backend = get_backend()
    ops = backend.tensor_ops()
    cases = backend.cases_at_other_sizes("jax.transpose", 1)
    explored = {signature(ops, c.arg_names, c.args, c.kwargs, c.exact_sizes): [ops.shape(x) for x in c.args]
                for c in backend.cases("jax.transpose")}
    assert cases
    for c in cases:  # never the explored call of a signature again
        assert explored.get(signature(ops, c.arg_names, c.args, c.kwargs, c.exact_sizes)) != [ops.shape(x) for x in c.args]
    record = load_record(ROOT / "registry" / "jax" / "jax.transpose.yaml")
    assert recheck_other_calls(backend, ["jax.transpose"], {"jax.transpose": record}, 1) == 0
    out = capsys.readouterr().out
    assert ", 0 failed" in out and " 0 calls" not in out
    sig = signature(ops, cases[0].arg_names, cases[0].args, cases[0].kwargs, cases[0].exact_sizes)
    entry = record.entry(sig)
    labels = [label for label, _ in entry.combine.by_label]
    wrong = dataclasses.replace(entry, combine=CombineSpec.parse(
        "{" + ", ".join(f"{label}: identity" for label in labels) + "}"))
    bad = dataclasses.replace(record, entries=(wrong,))
    assert recheck_other_calls(backend, ["jax.transpose"], {"jax.transpose": bad}, 1) == 1
    assert "FAILED jax.transpose" in capsys.readouterr().out


@pytest.mark.slow  # the whole cross-check twice (~10 s each)
@pytest.mark.parametrize("other_calls", [0, 1])
def test_a_case_whose_check_raises_is_shown_counted_and_fails_the_exit_status(monkeypatch, capsys, other_calls):
    """One case whose check raised ended the whole run with a traceback, and the cases
    before it were never summarized; it is now shown, counted, and the exit status is 3 (a
    check that could not run; 1 is a rule that fails)."""
    from metaspmd.backends.jax import crosscheck

    def raises_on_neg(real):
        def check(*args):
            if args[0] == "jax.neg" or getattr(args[0], "op", "") == "jax.neg":
                raise RuntimeError("boom")
            return real(*args)
        return check

    monkeypatch.setattr(crosscheck, "check_case", raises_on_neg(crosscheck.check_case))
    monkeypatch.setattr(crosscheck, "reverify", raises_on_neg(crosscheck.reverify))
    argv = ["--ops", "jax.neg,jax.exp", "--devices", "0", "--registry", str(ROOT / "registry")]
    assert crosscheck.main(argv + ["--other-calls", "1"] * other_calls) == 3
    out = capsys.readouterr().out
    if other_calls:
        assert "FAILED jax.neg" in out and "the check raised RuntimeError: boom" in out
    else:
        assert "CHECK FAILED, nothing checked: RuntimeError: boom" in out
        assert "cases whose check FAILED, none of their rules checked: " in out and "(jax.neg)" in out
        assert "jax.exp  " in out  # the check went on to the next op


@pytest.mark.slow  # builds the cases of two ops from the program index: 19 s
def test_an_interrupted_check_summarizes_the_ops_it_checked(monkeypatch, capsys):
    """Ctrl-C ended the run with one line: the summary of the ops checked before it was lost."""
    from metaspmd.backends.jax import crosscheck

    seen, real = [], crosscheck.check_case

    def check(op, *args):
        if seen and op != seen[0]:
            raise KeyboardInterrupt
        seen.append(op)
        return real(op, *args)

    monkeypatch.setattr(crosscheck, "check_case", check)
    argv = ["--ops", "jax.neg,jax.exp", "--devices", "0", "--no-reverify", "--registry", str(ROOT / "registry")]
    assert crosscheck.main(argv) == 130
    out, err = capsys.readouterr()
    assert "interrupted: 1 op(s) not checked; the counts above are of the 1 checked" in out, out
    assert f"{seen[0]}  " in out and "interrupted; 1 op(s) not done" in err, err
