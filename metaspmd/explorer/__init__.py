"""The ShardCombine explorer (MetaDist Algorithm 1, improved) and its verifier.

For one example call of an op:

1. Enumerate groups: one dim per input (or none), all of the same size, so the inputs can
   be cut at the same boundaries (mm: {A.1, B.0}); input halos for single-input groups
   (convolution); Partial(sum) inputs, alone (linear ops) or added to a group that failed
   (addmm's bias while the contraction dim is sharded); a dim of another input cut in
   proportion to a group that failed (a window op's operand beside its per-window input).
2. Explore each group on the example with 2 shards: run the op on every shard, and keep
   every combine (gather with halo/block, reduce, identity, scan, argreduce) that rebuilds
   each output.
3. Verify the survivors on fresh inputs: 2, 3 and 4 shards and a skewed uneven split,
   each with new data from the sample's own generator, and shards one element wide. Only
   combines that hold on every trial stay; reduce(avg) is checked on equal shards only,
   order picks (max, min, argmax, argmin) on data with repeated values too, and an output
   empty on every trial at other sizes where it has elements.

Soundness guards: an op whose global output differs between two identical calls is
nondeterministic; an output that does not change across fresh inputs cannot tell combines
apart, so the entry gets no strategy; shards of an input must really differ.

The stages, each taking and returning explicit records (``explore_case`` runs them in turn):
``Context.of`` (the case, ops, settings, seed and leaf names, fixed for the call);
``baseline.draw_baseline`` (a frozen ``Baseline`` of the trials to judge rules on, or a
``Verdict`` that ends the call: failed, nondeterministic, nothing to shard);
``core.Explorer(context, trials).search`` (a frozen ``Found``: the strategies that held and
how they were verified; each group's verification gives a ``verify.Verified``); and
``core.entry_of`` (the registry entry).

The search's parts: ``trials`` (running the op), ``groups``, ``shards``, ``verify``,
``sizes`` (rules at other sizes), ``widening`` and ``independence``; ``common`` holds what
they share.
"""

from .common import SPECIAL_TRIALS, ExploreConfig
from .core import explore_case, explore_op, failed_entry, holds_at_call, holds_at_other_sizes

__all__ = ["SPECIAL_TRIALS", "ExploreConfig", "explore_case", "explore_op", "failed_entry", "holds_at_call",
           "holds_at_other_sizes"]
