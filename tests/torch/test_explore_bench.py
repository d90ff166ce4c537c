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
    for name, (_, ms, strats, status, ref_ms, ref_strats, ratio) in rows.items():
        assert status == "ok" and int(strats) >= 2 and float(ms) > 0 and float(ref_ms) > 0
        assert int(ref_strats) >= 1  # the reference finds the row cut at least
    assert int(rows["mm"][2]) > int(rows["mm"][5])  # metaspmd keeps more of mm's strategies (Partial ones)


def test_refuses_bad_arguments(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--repeat", "0"])
    assert e.value.code == 2 and "--repeat: expected an integer >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench.main(["--ops", "no_such_call"])
    assert e.value.code == 2 and "no call's name contains" in capsys.readouterr().err
