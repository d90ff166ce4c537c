"""The sweep's summary table, its check-mode change list and its timings file."""

from __future__ import annotations

import json

from .engine import TIMED_OUT, SweepReport

# Summary rows, in print order: op statuses (metaspmd.rules.OP_STATUSES).
SUMMARY_STATUSES = ("ok", "derived", "replicate-only", "nondeterministic", "no-sample", "composite", "skipped", "failed")
FAILED_NAMED = 20  # failed ops named in the summary; the rest counted


def format_summary(report: SweepReport) -> str:
    counts = report.counts()
    failed = [r for r in report.results if r.status == "failed"]
    crashes = sum(r.reason.startswith("crashed") for r in failed)
    rows = [("backend", report.backend), ("ops", str(len(report.results)))]
    if report.resumed:
        rows.append(("resumed (skipped)", str(len(report.resumed))))
    for status in SUMMARY_STATUSES:
        if status in ("composite", "skipped") and not counts[status]:
            continue
        value = str(counts[status])
        if status == "failed" and failed:  # by name: a crash can be the op's new behaviour
            names = [r.op for r in failed]
            shown = ", ".join(names[:FAILED_NAMED]) + (f", ... {len(names) - FAILED_NAMED} more" if len(names) > FAILED_NAMED
                                                      else "")
            value += f"  ({f'crashes {crashes}; ' if crashes else ''}{shown})"
        rows.append((status if status != "ok" else "with rules (ok)", value))
    # An op out of time (or killed by SIGKILL, or out of memory) on both tries gets no record: its file, if any,
    # stays as it was.
    kinds = {"killed": "killed (SIGKILL)", "out of memory": "out of memory"}
    for what in ("timed out", *kinds.values()):
        group = [r for r in report.timed_out()
                 if what == next((kinds[k] for k in kinds if r.reason.startswith(k)), "timed out")]
        kept = [r.op for r in group if r.kept]
        if kept:
            rows.append((f"{what}, kept previous file", f"{len(kept)}  ({', '.join(kept)})"))
        if len(kept) < len(group):
            rows.append((f"{what}, no previous file", f"{len(group) - len(kept)}  "
                                                       f"({', '.join(r.op for r in group if not r.kept)})"))
    retried = [r for r in report.results if r.retried]
    if retried:  # a crash or time limit that a second try got past was the machine's, not the op's
        passed = [r.op for r in retried if r.status not in ("failed", TIMED_OUT)]
        rows.append(("retried", f"{len(retried)}  (passed on the second try {len(passed)}: {', '.join(passed) or '-'})"))
    if report.not_swept:  # the sweep was interrupted
        rows.append(("not swept (interrupted)", f"{len(report.not_swept)}"
                     + ("" if report.check else "  (--resume sweeps them and skips the ops done)")))
    if report.left:
        shown = ", ".join(report.left[:5]) + (", ..." if len(report.left) > 5 else "")
        rows.append(("files of no op, left", f"{len(report.left)}  ({shown}; delete them: --check reports them removed)"))
    rows += [("wall time", f"{report.wall_s:.1f} s"), ("ops/s", f"{report.ops_per_s:.2f}")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


# Diff lines shown per changed file; the rest is counted, so one large change cannot bury the others.
DIFF_LINES = 40


def format_changes(report: SweepReport) -> str:
    by_op = {r.op: r for r in report.results}
    out = []
    for kind, name in report.changes():
        out.append(f"{kind:<8} {name}")
        if kind != "changed":
            continue
        result = by_op[name]
        out[-1] += f"  (now {result.status}{': ' + result.reason if result.reason else ''})"
        if result.after:
            # Ops go to workers in name order, so these --ops replay the worker's sequence.
            replay = ",".join((*result.after, name))
            out.append(f"    explored after {', '.join(result.after)} in its worker (replay: --jobs 1 --ops {replay})")
        lines = result.diff.splitlines()
        out += [f"    {line}" for line in lines[:DIFF_LINES]]
        if len(lines) > DIFF_LINES:
            out.append(f"    ... {len(lines) - DIFF_LINES} more diff line(s)")
    return "\n".join(out)


def timings_json(report: SweepReport, jobs: int) -> str:
    """Per-op timings, kept out of the registry so its files stay byte-identical."""
    data = {
        "backend": report.backend,
        "jobs": jobs,
        "wall_s": round(report.wall_s, 3),
        "ops": {r.op: {"seconds": round(r.seconds, 4), "status": r.status} for r in report.results},
    }
    if report.not_swept:  # an interrupted sweep's
        data["not_swept"] = list(report.not_swept)
    return json.dumps(data, indent=1, sort_keys=True) + "\n"
