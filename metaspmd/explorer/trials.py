"""Trials: the op run on the example and on fresh, blind, special-value or rebuilt
inputs, and what the trials' data shows about the sample (constant outputs, one-signed
or integer inputs, data the same along a dim)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .. import pytree
from ..signature import arg_items
from ..tensor_ops import BOOL, COMPLEX, FLOAT, INT
from .common import (
    BLIND_TRIALS, FIRST_RESERVE_TRIAL, RESERVE_TRIALS, SPECIAL_TRIALS, TRIAL_SPLITS, Trial, bitwise_equal,
    flat_along, one_values,
)


class Trials:
    """Runs the op and draws the trials the explorer judges rules on (a part of ``Explorer``)."""

    def _leaf_names(self) -> list[str]:
        names = []
        for name, value in arg_items(self.case.arg_names, self.case.args, self.case.kwargs):
            names += [name] * len(pytree.leaves(value, self.ops.is_tensor))
        return names

    def _flatten_out(self, out: Any) -> tuple[list[Any], list[Any]]:
        tensors = pytree.leaves(out, self.ops.is_tensor)
        others = pytree.leaves(out, lambda x: not self.ops.is_tensor(x) and not isinstance(x, (list, tuple, dict)))
        return tensors, others

    def _call(self, leaves: Sequence[Any], trial: Trial, drop: bool = False,
              local: dict[int, tuple[int, int, int, int]] | None = None) -> tuple[list[Any], list[Any]]:
        args, kwargs = pytree.replace((trial.args, dict(trial.kwargs)), self.ops.is_tensor, list(leaves))
        if self.config.isolate_calls is not None:
            return self.config.isolate_calls(lambda: self._flatten_out(self.case.call(args, kwargs, drop, local)))
        return self._flatten_out(self.case.call(args, kwargs, drop, local))

    def _trial(self, args: tuple, kwargs: dict, index: int = 0, special: bool = False, blind: bool = False) -> Trial:
        leaves = pytree.leaves((args, kwargs), self.ops.is_tensor)
        trial = Trial(args, kwargs, leaves, [], [], index, special)
        trial.outputs, trial.others = self._call(leaves, trial)
        trial.nonfinite = bool(trial.outputs) and all(self.ops.one_nonfinite_value(o) for o in trial.outputs)
        trial.one_value = one_values(self.ops, trial.outputs) if blind else None
        return trial

    def _fresh_trial(self, k: int) -> Trial:
        """Trial ``k`` on fresh inputs. A sample generator that ignores its seed (OpInfo's
        bool samples) repeats the example, which tests nothing new: blind data stands in
        where the op takes it."""
        trial = self._trial(*self._fresh_inputs(k), index=k)
        first = self.trials[0]
        if all(self.ops.close(x, y) for x, y in zip(trial.leaves, first.leaves)):
            try:
                return self._trial(*self._fresh_inputs(k, blind=True), index=k, blind=True)
            except Exception:
                pass  # the op rejects unconstrained inputs: its generator's data stands
        return trial

    def _reserve_trials(self) -> Iterator[Trial]:
        """Up to ``RESERVE_TRIALS`` more fresh trials, drawn when first needed and kept for
        the other groups; fewer where the op rejects fresh inputs."""
        for n in range(RESERVE_TRIALS):
            if n == len(self._reserve):
                try:
                    self._reserve.append(self._fresh_trial(FIRST_RESERVE_TRIAL + n))
                except Exception:
                    return
            yield self._reserve[n]

    def _fresh_inputs(self, k: int, blind: bool = False) -> tuple[tuple, dict]:
        seed = self.seed * 1000 + k
        example = pytree.leaves((self.case.args, self.case.kwargs), self.ops.is_tensor)
        if self.case.fresh is not None and not blind:
            try:
                args, kwargs = self.case.fresh(seed)
                leaves = pytree.leaves((args, kwargs), self.ops.is_tensor)
                if [self.ops.shape(x) for x in leaves] == [self.ops.shape(x) for x in example]:
                    return tuple(args), dict(kwargs)
            except Exception:
                pass  # fall back to refilling the example
        new = [
            x if name in self.fixed or self.ops.dtype_kind(x) == "o" else self.ops.random_like(x, seed * 131 + i)
            for i, (x, name) in enumerate(zip(example, self.leaf_names))
        ]
        args, kwargs = pytree.replace((self.case.args, dict(self.case.kwargs)), self.ops.is_tensor, new)
        return args, kwargs

    def _blind_trials(self) -> list[Trial]:
        """Trials on blind random inputs for a case with a sample generator, where the op
        takes them: an output constant on the generator's data (the minimum of integers
        drawn from [-9, 9]) makes that data suspect, and every shard's minimum can equal the
        global one by luck. An op that rejects unconstrained inputs keeps its sample's."""
        trials: list[Trial] = []
        if self.case.fresh is None:
            return trials
        for k in range(len(TRIAL_SPLITS) + 1, len(TRIAL_SPLITS) + 1 + BLIND_TRIALS):
            try:
                trials.append(self._trial(*self._fresh_inputs(k, blind=True), index=k, blind=True))
            except Exception:
                break
        return trials

    def _special_trials(self) -> list[Trial] | None:
        """``SPECIAL_TRIALS`` trials with special-value inputs, or None when the op rejects
        them (an index input that became invalid)."""
        trials = []
        try:
            for k in range(1, SPECIAL_TRIALS + 1):
                fresh = self._fresh_inputs(k)
                args, kwargs = self.case.special(*fresh, k, self.seed * 1000 + 500 + k)
                args, kwargs = self._keep_fixed(fresh, (tuple(args), dict(kwargs)))
                trials.append(self._trial(tuple(args), dict(kwargs), index=k, special=True))
        except Exception:
            return None
        return trials

    def _resampled_index_trials(self) -> list[Trial]:
        """The random trials with each fixed input that holds the same values on all of them
        redrawn from its own values, with repeats: an output constant only because that
        input never varied (an index_fill whose index covers every column) then varies. A
        trial the op refuses is left out."""
        first = self.trials[0]
        frozen = {i for i, name in enumerate(self.leaf_names) if name in self.fixed
                  and all(bitwise_equal(self.ops, t.leaves[i], first.leaves[i]) for t in self.trials[1:])}

        def redrawn(trial: Trial, i: int, x: Any) -> Any:
            if i not in frozen:
                return x
            values = np.asarray(self.ops.to_numpy(x))
            rng = np.random.default_rng(self.seed * 7919 + 31 * trial.index + i)
            return self.ops.from_numpy(rng.choice(values.ravel(), values.shape), x)

        return [t for base in self.trials if frozen for t in self._rebuilt_trials(redrawn, base) or ()]

    def _keep_fixed(self, fresh: tuple[tuple, dict], special: tuple[tuple, dict]) -> tuple[tuple, dict]:
        """``special`` with the ``fixed`` arguments (indices, offsets) put back from ``fresh``:
        special values would take them out of range."""
        if not self.fixed:
            return special
        kept = pytree.leaves(fresh, self.ops.is_tensor)
        leaves = [k if name in self.fixed else s
                  for k, s, name in zip(kept, pytree.leaves(special, self.ops.is_tensor), self.leaf_names)]
        args, kwargs = pytree.replace((special[0], special[1]), self.ops.is_tensor, leaves)
        return tuple(args), dict(kwargs)

    def _rebuilt_trials(self, leaf: Callable[[Trial, int, Any], Any], only: Trial | None = None) -> list[Trial] | None:
        """The trials (special ones left out; ``only``: that one) with each tensor leaf ``x``
        at ``i`` replaced by ``leaf(trial, i, x)`` and the op run again; None where it
        refuses one: the op ties a length to something else (another input, a param)."""
        out = []
        for trial in [only] if only is not None else self.trials:
            if trial.special:
                continue
            leaves = [leaf(trial, i, x) for i, x in enumerate(trial.leaves)]
            args, kwargs = pytree.replace((trial.args, dict(trial.kwargs)), self.ops.is_tensor, leaves)
            try:
                out.append(self._trial(tuple(args), dict(kwargs), index=trial.index))
            except Exception:
                return None
        return out

    def _lengthen(self, x: Any, d: int, length: int, seed: int, copies: bool = False) -> Any:
        """``x`` with dim ``d`` lengthened to ``length`` by fresh random data (``copies``: by
        copies of its own elements along ``d``)."""
        size = self.ops.shape(x)[d]
        room = self.ops.narrow(self.ops.concat([x] * -(-length // size), d), d, 0, length - size)
        return self.ops.concat([x, room if copies else self.ops.random_like(room, self.seed * 7919 + seed)], d)

    @contextlib.contextmanager
    def _on_trials(self, trials: list[Trial]):
        saved, self.trials = self.trials, trials
        try:
            yield
        finally:
            self.trials = saved

    def _constant_outputs(self) -> list[int]:
        """Non-empty outputs that are the same on every trial."""
        first = self.trials[0]
        return [
            j for j in range(len(first.outputs))
            if 0 not in self.ops.shape(first.outputs[j])
            and all(self.ops.close(t.outputs[j], first.outputs[j]) for t in self.trials[1:])
        ]

    def _one_valued_blind(self) -> bool:
        """Some blind trial leaves every output one value throughout, or NaN throughout
        (``ndtri`` of random integers: its domain [0, 1] holds two of them)."""
        return any(t.one_value is not None or (t.nonfinite and not t.special) for t in self.trials)

    def _whole_tensor_predicates(self) -> bool:
        """Some output is a single bool (a predicate of whole inputs)."""
        return any(self.ops.shape(o) == () and self.ops.dtype_kind(o) == BOOL for o in self.trials[0].outputs)

    def _constant_inputs(self) -> bool:
        """Some float input with elements, not fixed, is the same on every trial."""
        first = self.trials[0]
        return any(
            self.ops.dtype_kind(x) in (FLOAT, COMPLEX) and 0 not in self.ops.shape(x) and name not in self.fixed
            and all(self.ops.close(t.leaves[i], x) for t in self.trials[1:])
            for i, (x, name) in enumerate(zip(first.leaves, self.leaf_names))
        )

    def _one_signed_inputs(self) -> bool:
        """Some real float input, not fixed, is positive throughout on every random trial
        (or negative throughout)."""
        ops, first = self.ops, self.trials[0]

        def one_signed(x: Any) -> bool:
            try:
                a = ops.to_numpy(x)
            except Exception:
                return False
            return bool((a > 0).all() or (a < 0).all())

        return any(
            ops.dtype_kind(x) == FLOAT and 0 not in ops.shape(x) and name not in self.fixed
            and all(one_signed(t.leaves[i]) for t in self.trials if not t.special)
            for i, (x, name) in enumerate(zip(first.leaves, self.leaf_names))
        )

    def _flat_along_a_dim(self) -> bool:
        """Some float input, not fixed, is the same along one of its dims on every trial (an
        expanded sample): its equal shards there prove nothing, so no cut of it is proposed."""
        ops, first = self.ops, self.trials[0]
        return any(
            ops.dtype_kind(x) in (FLOAT, COMPLEX) and 0 not in ops.shape(x) and name not in self.fixed
            and any(all(flat_along(ops, t.leaves[i], d) for t in self.trials) for d in range(len(ops.shape(x))))
            for i, (x, name) in enumerate(zip(first.leaves, self.leaf_names))
        )

    def _integer_data(self) -> bool:
        """Some integer or bool input is data (not an index kept fixed)."""
        return any(self.ops.dtype_kind(x) in (INT, BOOL) and name not in self.fixed
                   for x, name in zip(self.trials[0].leaves, self.leaf_names))

    def _empty_outputs(self) -> bool:
        """Some output has no elements on every trial."""
        return any(all(0 in self.ops.shape(t.outputs[j]) for t in self.trials) for j in range(len(self.trials[0].outputs)))
