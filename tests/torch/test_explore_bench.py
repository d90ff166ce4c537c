"""benchmarks/explore_bench.py: its table on two calls, and its refusals."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCHMARKS)
    try:
        import explore_bench
    finally:
        sys.path.remove(BENCHMARKS)
    return explore_bench


def test_table_gives_both_sides_per_call(bench, capsys):
    assert bench.main(["--ops", "relu,mm", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "RE-IMPLEMENTED" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["mm"], ["relu"])}
    assert set(rows) == {"mm", "relu"}
    for name, (_, ms, strats, runs, status, ref_ms, ref_strats, ref_runs, ratio, op_only, _) in rows.items():
        assert status == "ok" and int(strats) >= 2 and float(ms) > 0 and float(ref_ms) > 0
        assert 0 < float(op_only) < float(ms)  # the op's own runs are a part of the exploration
        assert int(ref_strats) >= 1  # the reference finds the row cut at least
        # verification runs the op on fresh trials, other splits and sizes: more than discovery's
        assert int(runs) > int(ref_runs) >= 3
    assert int(rows["mm"][2]) > int(rows["mm"][6])  # metaspmd keeps more of mm's strategies (Partial ones)
    # relu: the global call, then each of its two dims cut in two, one run per shard
    assert int(rows["relu"][7]) == 5
    assert "ms per run: metaspmd" in out
    assert "op-only: metaspmd's runs of the op replayed" in out


def test_op_runs_counts_every_run_of_the_op(bench):
    # relu: the reference runs the global call and two shards per dim; metaspmd's
    # verification many more. Counting changes neither the inputs nor the explored entry.
    import torch

    name, fn, args, kwargs = next(c for c in bench.calls() if c[0] == "relu")
    case = bench.metaspmd_case(fn, args, kwargs)
    before = case.args[0].clone()
    runs, ref_runs = bench.op_runs(case)
    assert ref_runs == 5 and runs > 2 * 5
    assert torch.equal(case.args[0], before)  # the counting pass leaves the inputs as they were
    assert repr(bench.explore(case)) == repr(bench.explore(bench.metaspmd_case(fn, args, kwargs)))


def test_op_only_replays_every_run(bench):
    """The floor replays each recorded run of the op once: as many as op_runs counts."""
    name, fn, args, kwargs = next(c for c in bench.calls() if c[0] == "relu")
    case = bench.metaspmd_case(fn, args, kwargs)
    record = bench.RunRecord()
    bench.explore(bench.counted_case(case, record.wrap))
    assert len(record.calls) == bench.op_runs(case)[0]
    replayed = bench.RunCount()
    bench.replay([(replayed.wrap(f), a, k) for f, a, k in record.calls])
    assert replayed.n == len(record.calls)


def test_refuses_bad_arguments(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--repeat", "0"])
    assert e.value.code == 2 and "--repeat: expected an integer >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.main(["--ops", "no_such_call"])
    assert e.value.code == 2 and "no call's name contains" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a typo beside a good word timed the good one alone
        bench.main(["--ops", "mm,no_such_call"])
    assert e.value.code == 2 and "no call's name contains 'no_such_call'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # pstats' own sort keys only, checked before any call runs
        bench.main(["--ops", "mm", "--profile", "mm", "--sort", "bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--sort: invalid choice: 'bogus'" in err and "tottime" in err


def test_stages_split_every_run_of_the_op(bench, capsys):
    """--stages: each run counted toward one stage; their sum is op_runs' count, and relu's
    discovery is its two dims cut in two (four shard runs) plus its Partial look."""
    name, fn, args, kwargs = next(c for c in bench.calls() if c[0] == "relu")
    runs = bench.stage_runs(bench.metaspmd_case(fn, args, kwargs))
    assert list(runs) == list(bench.STAGES)
    assert sum(runs.values()) == bench.op_runs(bench.metaspmd_case(fn, args, kwargs))[0]
    assert runs["baseline"] > 0 and runs["discovery"] >= 4 and runs["fresh trials"] > runs["discovery"]
    assert bench.main(["--ops", "relu,mm", "--stages"]) == 0
    lines = capsys.readouterr().out.splitlines()
    relu = next(line.split() for line in lines if line.startswith("relu "))
    assert [int(n) for n in relu[1:]] == [*runs.values(), sum(runs.values())]
    share = next(line for line in lines if line.startswith("share"))
    assert share.count("%") == len(bench.STAGES)
