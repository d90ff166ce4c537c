"""Re-verify the registry's rules on calls the sweep did not explore.

The sweep verifies a rule on one example call per signature; the runtime then applies it
at every call of that signature, at whatever sizes the signature leaves open (``*``).
This check takes up to N more OpInfo calls of each signature, at other tensor shapes
(``TorchBackend.cases_at_other_sizes``), and re-verifies every rule of the signature's
entry that the runtime applies there (``target.lined_up``: a label's dims of one
length) with the cross-check's own numerics (``crosscheck_numerics.reverify``: 4, 3 and 2
shards, uneven cuts, blind random inputs, cancelling and special values).

    python tools/crosscheck.py --backend torch --other-calls 4 --ops 'aten.mm*'
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from metaspmd import pytree
from metaspmd.rules import OpRecord
from metaspmd.signature import signature

from .crosscheck_notation import NO_EXAMPLES, our_rules
from .crosscheck_numerics import FreshInputs, reverify


@dataclass
class Recheck:
    """One of our rules re-verified on a call of its signature at other shapes."""

    op: str
    signature: str
    shapes: str  # the call's tensor shapes, in argument order
    rule: str
    verdict: str  # as crosscheck_numerics.reverify: ok | failed | data-dependent | vacuous | unchecked
    detail: str = ""


def recheck_op(backend, op: str, record: OpRecord | None, per_signature: int, seed: int, result):
    """``result`` (the op's crosscheck.OpResult, which imports this module) filled with the
    rechecks of ``record``'s rules on up to ``per_signature`` more calls of each of its
    signatures."""
    start = time.perf_counter()
    if record is None or record.status in NO_EXAMPLES:
        return result
    ops = backend.tensor_ops()
    try:
        cases = backend.cases_at_other_sizes(op, per_signature)
    except Exception as e:  # the op's OpInfo samples fail to build: nothing to check on
        result.notes.append(f"no calls at other sizes: {type(e).__name__}: {str(e)[:120]}")
        cases = []
    for case in cases:
        sig = signature(ops, case.arg_names, case.args, case.kwargs, case.exact_sizes)
        entry = record.entry(sig)
        every = our_rules(entry)
        if not every:
            continue  # a signature the registry has no rule for: explored live at run time
        result.examples += 1
        shapes = [tuple(ops.shape(x)) for x in pytree.leaves((tuple(case.args), dict(case.kwargs)), ops.is_tensor)]
        shown = " ".join(str(list(shape)) for shape in shapes)
        applied = our_rules(entry, shapes)  # the rules the runtime applies at this call
        result.not_applied += len(every) - len(applied)
        fresh = FreshInputs(case, ops)
        for rule in applied:
            verdict, detail = reverify(fresh, rule.placements, rule.combines, seed)
            result.rechecks.append(Recheck(op, sig, shown, rule.text(), verdict, detail))
    result.seconds = time.perf_counter() - start
    return result
