#!/usr/bin/env python
"""parallelize() on JAX end to end, with a cold rule cache (every node the table lacks is
explored live) and a warm one, on 4 of 8 simulated CPU devices.

    python benchmarks/jax_runtime_bench.py         # prints one table per model
    python benchmarks/jax_runtime_bench.py --scan  # scan-over-layers GPT against unrolled

A cold cache is what a user's first run pays; how many nodes the generated table holds
decides it, since each live exploration compiles the op once per shard shape it tries.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from examples.jax_models import gpt_block, gpt_params, lm, lm_params  # noqa: E402
from metaspmd.backends.jax.parallelize import parallelize  # noqa: E402
from metaspmd.cache import RuleCache  # noqa: E402


def end_to_end(fn, params, x, mesh) -> list[tuple[str, str]]:
    cache = RuleCache(tempfile.mkdtemp())
    rows = []
    for label in ("cold cache", "warm cache"):
        start = time.perf_counter()
        p = parallelize(fn, mesh, (x,), params=params, cache=cache)
        seconds = time.perf_counter() - start
        if label == "cold cache":
            s = p.stats
            rows += [("graph nodes", f"{s.table + s.cache + s.live}"), ("table hits", f"{s.table}"),
                     ("explored live", f"{s.live}")]
        rows.append((f"parallelize, {label} (s)", f"{seconds:.1f}"))
    return rows


def table(title: str, rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    lines = [title, f"{'metric':<{width}}  value", f"{'-' * width}  -----"]
    return "\n".join(lines + [f"{k:<{width}}  {v}" for k, v in rows])


def scan_over_layers(mesh, layers=12, repeat=3) -> list[tuple[str, str]]:
    """A 12-layer GPT as JAX LMs write it (stacked [L, ...] params, lax.scan over them)
    against the same layers unrolled and one block alone, all with a warm cache (the best of
    ``repeat`` runs each): the scan's body is planned once and nothing of the model runs
    (signatures come from the traced shapes), so its planning time stays near the block's
    (the target: at most 2x), and its planned cost (the body's, times the trip count)
    should match the unrolled model's."""
    trees = [gpt_params(seed=s) for s in range(layers)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *trees)
    x = jax.random.normal(jax.random.key(1), (8, 16, 32))

    def scanned(p, h):
        return jax.lax.scan(lambda c, q: (gpt_block(q, c), None), h, p)[0]

    def unrolled(ps, h):
        for q in ps:
            h = gpt_block(q, h)
        return h

    cache = RuleCache(tempfile.mkdtemp())
    parallelize(gpt_block, mesh, (x,), params=trees[0], cache=cache)  # warm the cache
    rows, plans = [], {}
    for label, fn, params in (("one block", gpt_block, trees[0]), ("scan", scanned, stacked),
                              ("unrolled", unrolled, trees)):
        seconds = []
        for _ in range(repeat):  # the fastest of a few: the machine is shared, its load varies
            start = time.perf_counter()
            p = parallelize(fn, mesh, (x,), params=params, cache=cache)
            seconds.append(time.perf_counter() - start)
        plans[label] = (p.plan, min(seconds))
        rows += [(f"{label}: nodes", f"{len(p.captured.ir)}"), (f"{label}: planned cost (us)",
                                                                 f"{p.plan.total_cost * 1e6:.1f}"),
                 (f"{label}: parallelize, warm cache (s)", f"{plans[label][1]:.2f}")]
    cost, unrolled_cost = plans["scan"][0].total_cost, plans["unrolled"][0].total_cost
    rows += [("scan / unrolled planned cost", f"{cost / unrolled_cost:.3f}"),
             ("scan / one block parallelize time", f"{plans['scan'][1] / plans['one block'][1]:.2f}")]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scan", action="store_true", help="only the scan-over-layers GPT against unrolled")
    args = parser.parse_args(argv)
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    if args.scan:
        print(table("\n## GPT, 12 layers: scan over stacked params vs unrolled, forward + backward",
                    scan_over_layers(mesh)))
        return 0
    models = (("GPT block d=32, seq 16, batch 8", gpt_block, gpt_params(), jax.random.normal(jax.random.key(1), (8, 16, 32))),
              ("LM: embedding, GPT block, tied output, cross-entropy", lm, lm_params(),
               jax.random.randint(jax.random.key(2), (8, 16), 0, 256)))
    for name, fn, params, x in models:
        print(table(f"\n## {name}: forward + backward", end_to_end(fn, params, x, mesh)))
    return 0


if __name__ == "__main__":
    from metaspmd.cli import pipe_safe  # `| head` ends it quietly

    sys.exit(pipe_safe(main)())
