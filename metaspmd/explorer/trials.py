"""Trials: the op run on the example and on fresh, blind, special-value or rebuilt
inputs. Which of them the rules are judged on is the baseline stage's call (``baseline``)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import pytree
from ..case import OutOfMemory, out_of_memory
from ..tensor_ops import FLOAT, INT, largest_finite, largest_integer
from .common import (BLIND_TRIALS, FIRST_SCALED_TRIAL, REACH_SCALE, SCALED_SIDES, SIDE_FLOOR, SPECIAL_TRIALS,
                     TRIAL_SPLITS, Context, Trial, one_values)


def _not_container(x: Any) -> bool:
    return not isinstance(x, (list, tuple, dict))


class Trials:
    """Runs the op and draws trials, on a fixed ``Context`` (the base of ``Explorer``, and
    the runner of the baseline stage)."""

    def __init__(self, context: Context):
        self.context = context
        self.case, self.ops, self.config, self.seed = context.case, context.ops, context.config, context.seed
        self.leaf_names, self.fixed = context.leaf_names, context.fixed

    def _flatten_out(self, out: Any) -> tuple[list[Any], list[Any]]:
        """The output's tensor leaves and its other leaves, each in order (one walk)."""
        is_tensor = self.ops.is_tensor
        if is_tensor(out):  # most ops: one tensor, no walk
            return [out], []
        flat = pytree.leaves(out, _not_container)
        tensors = [x for x in flat if is_tensor(x)]
        return tensors, [x for x in flat if not is_tensor(x)] if len(tensors) < len(flat) else []

    def _call(self, leaves: Sequence[Any], trial: Trial, drop: bool = False,
              local: dict[int, tuple[int, int, int, int]] | None = None) -> tuple[list[Any], list[Any]]:
        args, kwargs = self._fill(trial)(leaves)
        try:
            if self.config.isolate_calls is not None:
                return self.config.isolate_calls(lambda: self._flatten_out(self.case.call(args, kwargs, drop, local)))
            return self._flatten_out(self.case.call(args, kwargs, drop, local))
        except Exception as e:
            if out_of_memory(e):  # every caller would read it as the strategy failing
                raise OutOfMemory(f"{self.case.op}: a run of the op failed to allocate memory: {e}") from e
            raise

    def _fill(self, trial: Trial) -> Callable[[Sequence[Any]], Any]:
        """The trial's arguments rebuilt around new leaves, by a template made once per
        trial (``Trial.template``): the op runs on every shard of every group."""
        held = trial.template
        if not held or held[0] is not trial.args or held[1] is not trial.kwargs:
            held[:] = [trial.args, trial.kwargs, pytree.template((trial.args, dict(trial.kwargs)), self.ops.is_tensor)]
        return held[2]

    def _trial(self, args: tuple, kwargs: dict, index: int = 0, special: bool = False, blind: bool = False,
               like: Trial | None = None, leaves: list[Any] | None = None, scale: float = 1.0) -> Trial:
        """The op run on ``args``, ``kwargs``; ``like``: a trial whose arguments they are with
        other ``leaves`` (its template fills them alike, and its data's scale stands)."""
        template = [args, kwargs, like.template[2]] if like is not None else []
        scale = like.scale if like is not None else scale
        if leaves is None:
            leaves = pytree.leaves((args, kwargs), self.ops.is_tensor)
        bare = Trial(args, kwargs, leaves, [], [], index, special, template=template)
        outputs, others = self._call(leaves, bare)
        nonfinite = bool(outputs) and all(self.ops.one_nonfinite_value(o) for o in outputs)
        return Trial(args, kwargs, leaves, outputs, others, index, special, nonfinite,
                     one_values(self.ops, outputs) if blind else None, scale, bare.template)

    def _fresh_trial(self, k: int, first: Trial) -> Trial:
        """Trial ``k`` on fresh inputs. A sample generator that ignores its seed (OpInfo's
        bool samples) repeats the example (``first``), which tests nothing new: blind data
        stands in where the op takes it."""
        trial = self._trial(*self._fresh_inputs(k), index=k)
        if all(self.ops.close(x, y) for x, y in zip(trial.leaves, first.leaves)):
            try:
                return self._trial(*self._fresh_inputs(k, blind=True), index=k, blind=True)
            except Exception:
                pass  # the op rejects unconstrained inputs: its generator's data stands
        return trial

    def _fresh_inputs(self, k: int, blind: bool = False) -> tuple[tuple, dict]:
        drawn = self.context.drawn.get((k, blind))
        if drawn is None:
            drawn = self.context.drawn[k, blind] = self._draw_inputs(k, blind)
        args, kwargs = drawn
        return tuple(args), dict(kwargs)

    def _draw_inputs(self, k: int, blind: bool) -> tuple[tuple, dict]:
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

    def _scaled_trials(self, values: tuple[float, ...]) -> list[Trial]:
        """Trials on fresh inputs whose float and integer data (indices and other fixed
        inputs aside) lies past and at the call's value arguments ``values`` (a fill value,
        a bound; ``OpCase.value_args``), of largest magnitude ``reach``: all above it
        (``reach * (1 + |x|)``), all below minus it, then both sides (``x`` times
        ``REACH_SCALE * reach``, 1 at least) with a third of the elements at one of the
        values or their negatives; the first two only where ``reach`` is ``SIDE_FLOOR`` or
        more (unit data crosses smaller values, and data all near an ``eps`` of 1e-5 is a
        regime of its own, where a batch norm's true rules round apart). A rule that holds
        on one side of a fill or bound only (a max of index_fill's shards, where self stays
        under the fill value), or off it (a Partial ``x`` of ``hardshrink_backward`` at
        ``lambd=0``, whose zeros random data never holds), is refuted there. A tensor whose
        dtype cannot hold such values keeps its own; an op that refuses the data (a domain
        bound) keeps the trials drawn before."""
        reach = max(abs(v) for v in values)
        scale = max(REACH_SCALE * reach, 1.0)
        planted = np.array(sorted({v for value in values for v in (value, -value)}), dtype=np.float64)
        trials: list[Trial] = []
        for j, side in enumerate(SCALED_SIDES):
            if side and reach < SIDE_FLOOR:
                continue  # unit data crosses it; data all near a small eps is another regime
            k = FIRST_SCALED_TRIAL + j
            args, kwargs = self._fresh_inputs(k)
            leaves = pytree.leaves((args, kwargs), self.ops.is_tensor)
            rng = np.random.default_rng(self.seed * 1000 + k)

            def moved(x: Any) -> Any:
                v = np.asarray(self.ops.to_numpy(x), dtype=np.float64)
                if side:
                    return self.ops.from_numpy(side * reach * (1 + np.abs(v)), x)
                at = rng.random(v.shape) < 1 / 3
                return self.ops.from_numpy(np.where(at, rng.choice(planted, v.shape), v * scale), x)

            scaled = [moved(x) if name not in self.fixed and self._holds(x, 8 * scale) else x
                      for x, name in zip(leaves, self.leaf_names)]
            args, kwargs = pytree.replace((args, kwargs), self.ops.is_tensor, scaled)
            try:
                trials.append(self._trial(tuple(args), dict(kwargs), index=k, leaves=scaled, scale=scale))
            except Exception:
                break
        return trials

    def _holds(self, x: Any, magnitude: float) -> bool:
        """Is ``x`` a float or integer tensor whose dtype holds values of ``magnitude``?"""
        kind = self.ops.dtype_kind(x)
        if kind not in (FLOAT, INT):
            return False
        largest = largest_finite(self.ops.dtype_name(x)) if kind == FLOAT else largest_integer(self.ops.dtype_name(x))
        return largest is None or magnitude < largest

    def _special_trials(self) -> list[Trial] | None:
        """``SPECIAL_TRIALS`` trials with special-value inputs, or None when the op rejects
        them (an index input that became invalid)."""
        trials = []
        try:
            for k in range(1, SPECIAL_TRIALS + 1):
                fresh = self._fresh_inputs(k)
                args, kwargs = self.case.specials.special(*fresh, k, self.seed * 1000 + 500 + k)
                args, kwargs = self._keep_fixed(fresh, (tuple(args), dict(kwargs)))
                trials.append(self._trial(tuple(args), dict(kwargs), index=k, special=True))
        except Exception:
            return None
        return trials

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

    def _rebuilt_trials(self, leaf: Callable[[Trial, int, Any], Any], trials: Sequence[Trial]) -> list[Trial] | None:
        """``trials`` (special ones left out) with each tensor leaf ``x`` at ``i`` replaced by
        ``leaf(trial, i, x)`` and the op run again; None where it refuses one: the op ties a
        length to something else (another input, a param)."""
        out = []
        for trial in trials:
            if trial.special:
                continue
            leaves = [leaf(trial, i, x) for i, x in enumerate(trial.leaves)]
            args, kwargs = self._fill(trial)(leaves)
            try:
                out.append(self._trial(tuple(args), dict(kwargs), index=trial.index, like=trial, leaves=leaves))
            except Exception:
                return None
        return out

    def _lengthen(self, x: Any, d: int, length: int, seed: int, copies: bool = False) -> Any:
        """``x`` with dim ``d`` lengthened to ``length`` by fresh random data (``copies``: by
        copies of its own elements along ``d``)."""
        size = self.ops.shape(x)[d]
        extra = length - size  # x's own first elements where it has enough of them
        room = (self.ops.narrow(x, d, 0, extra) if extra <= size
                else self.ops.narrow(self.ops.concat([x] * -(-length // size), d), d, 0, extra))
        return self.ops.concat([x, room if copies else self.ops.random_like(room, self.seed * 7919 + seed)], d)
