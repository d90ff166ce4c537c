"""Random ops made checkable: what the explorer runs in place of an op that samples.

A random op's sharding is right in distribution when every output element is drawn once,
on one rank, from the distribution the global op gives it. Three kinds can be checked:

- **fills** (``uniform_``, ``randn_like``, ``bernoulli.p``, ...): the values depend on no
  input's values, only on shapes, dtypes and scalar parameters. Like ``empty_like``, they
  are compared on shapes and dtypes (outputs zeroed).
- **ops with a deterministic limit** (``bernoulli(p)`` and ``binomial`` with p in {0, 1},
  ``native_dropout`` and ``dropout`` with p in {0, 1}, ``normal(mean, std=0)``, ``rrelu``
  with lower = upper, attention with dropout_p = 0, ``lstm``/``gru``/``rnn_*`` with
  dropout = 0, ``multinomial`` of one-hot rows with replacement): run in that limit, they
  are ordinary deterministic ops, and the explorer finds how their values depend on the
  inputs' values, element by element.
- **factories** (``rand``, ``randperm``, ...): no tensor input, nothing to shard; run with
  a fixed seed, as ranks sharing a generator seed do.

A call already at its limit in a scalar argument (``dropout(p=0)``, attention with
``dropout_p=0``, an LSTM with ``dropout=0``) draws nothing: it is explored as a
deterministic op, Partial included.

Every element of these ops is drawn independently, so only gathers rebuild their outputs
(``OpCase.random``): a reduce or Partial would add draws together and identity would need
every rank to draw the same values.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from . import catalog

Call = Callable[..., Any]


class NoLimit(ValueError):
    """This call of a random op has no deterministic limit (multinomial without replacement)."""

# Overloads whose values depend on no input's values. randint_like.Tensor* are left out:
# their bound is a tensor whose value sets the range.
FILLS = frozenset({
    "uniform", "uniform_", "normal_", "cauchy", "cauchy_", "exponential", "exponential_", "geometric",
    "geometric_", "log_normal", "log_normal_", "random", "random_", "rand_like", "randn_like", "normal_functional",
})
FILL_OVERLOADS = frozenset({
    "aten.normal.out",  # normal_functional's out=, not the Tensor-mean forms'
    "aten.bernoulli.p", "aten.bernoulli.float_out", "aten.bernoulli_.float", "aten.randint_like.default",
    "aten.randint_like.generator", "aten.randint_like.generator_out", "aten.randint_like.low_dtype",
    "aten.randint_like.low_dtype_out", "aten.randint_like.low_generator_dtype",
    "aten.randint_like.low_generator_dtype_out", "aten.randint_like.out",
})
FILL_NOTE = "random values depending on no input's values: verified on shapes and dtypes; every element drawn once"
LIMIT_NOTE = "random op: verified in its deterministic limit ({}); every element drawn once"
# Ops that draw one mask element per (batch, channel) of self and broadcast it over the
# other dims: cut along one of those, every rank would draw that channel's mask again.
FEATURE_MASKS = frozenset({"feature_dropout", "feature_dropout_", "feature_alpha_dropout", "feature_alpha_dropout_"})
FEATURE_NOTE = ("random op: verified in its deterministic limit ({}); one draw per (batch, channel), shared along "
                "the other dims, which are never cut")
FACTORY_NOTE = "random factory: replicated when every rank draws with the same generator seed"
FACTORY_SEED = 0
UNCHECKABLE = "no form the explorer can check it in (a fill, a deterministic limit, a factory) is known for it"


def _named(func, args: tuple, kwargs: dict) -> dict[str, Any]:
    names = catalog.positional_names(func)
    out = dict(zip(names, args))
    out.update(kwargs)
    return out


def _replace(func, args: tuple, kwargs: dict, **values: Any) -> tuple[tuple, dict]:
    names = catalog.positional_names(func)
    args, kwargs = list(args), dict(kwargs)
    for name, value in values.items():
        if name in names and names.index(name) < len(args):
            args[names.index(name)] = value
        else:
            kwargs[name] = value
    return tuple(args), kwargs


def _bernoulli_limit(func, args, kwargs):
    key = "p" if any(a.name == "p" for a in func._schema.arguments) else "self"  # bernoulli(self=p) or (self, p)
    p = _named(func, args, kwargs)[key]
    return _replace(func, args, kwargs, **{key: (p > 0.5).to(p.dtype)})


def _binomial_limit(func, args, kwargs):
    prob = _named(func, args, kwargs)["prob"]
    return _replace(func, args, kwargs, prob=(prob > 0.5).to(prob.dtype))


def _dropout_limit(func, args, kwargs):
    p = _named(func, args, kwargs)["p"]
    return _replace(func, args, kwargs, p=1.0 if p > 0.5 else 0.0)


def _recurrent_limit(func, args, kwargs):
    return _replace(func, args, kwargs, dropout=0.0)


def _attention_limit(func, args, kwargs):
    return _replace(func, args, kwargs, dropout_p=0.0)


def _normal_limit(func, args, kwargs):
    std = _named(func, args, kwargs).get("std", 1.0)
    return _replace(func, args, kwargs, std=torch.zeros_like(std) if isinstance(std, torch.Tensor) else 0.0)


def _rrelu_limit(func, args, kwargs):
    named = _named(func, args, kwargs)
    schema = {a.name: a.default_value for a in func._schema.arguments}
    lower, upper = named.get("lower", schema["lower"]), named.get("upper", schema["upper"])
    middle = (float(lower) + float(upper)) / 2
    return _replace(func, args, kwargs, lower=middle, upper=middle)


def _multinomial_limit(func, args, kwargs):
    named = _named(func, args, kwargs)
    if not named.get("replacement", False) and named["num_samples"] != 1:
        raise NoLimit("multinomial without replacement has no deterministic limit: the sample order is random")
    probs = named["self"]
    hot = torch.nn.functional.one_hot(probs.argmax(-1), probs.shape[-1]).to(probs.dtype) if probs.numel() else probs
    return _replace(func, args, kwargs, self=hot)


# overload name prefix -> (what the limit is, how to take it)
LIMITS: dict[str, tuple[str, Callable]] = {
    "aten.bernoulli.default": ("p rounded to 0 or 1", _bernoulli_limit),
    "aten.bernoulli.out": ("p rounded to 0 or 1", _bernoulli_limit),
    "aten.bernoulli.Tensor": ("p rounded to 0 or 1", _bernoulli_limit),
    "aten.bernoulli.Tensor_out": ("p rounded to 0 or 1", _bernoulli_limit),
    "aten.bernoulli_.Tensor": ("p rounded to 0 or 1", _bernoulli_limit),
    "aten.binomial.default": ("prob rounded to 0 or 1", _binomial_limit),
    "aten.binomial.out": ("prob rounded to 0 or 1", _binomial_limit),
    "aten.native_dropout.default": ("p rounded to 0 or 1", _dropout_limit),
    "aten.native_dropout.out": ("p rounded to 0 or 1", _dropout_limit),
    # elementwise masks
    "aten.dropout.default": ("p rounded to 0 or 1", _dropout_limit),
    "aten.dropout_.default": ("p rounded to 0 or 1", _dropout_limit),
    "aten.alpha_dropout.default": ("p rounded to 0 or 1", _dropout_limit),
    "aten.alpha_dropout_.default": ("p rounded to 0 or 1", _dropout_limit),
    # one mask element per (batch, channel), broadcast over the rest (FEATURE_MASKS)
    **{f"aten.{op}.default": ("p rounded to 0 or 1", _dropout_limit) for op in sorted(FEATURE_MASKS)},
    # dropout on the attention weights, one mask element per (query, key) pair
    "aten.scaled_dot_product_attention.default": ("dropout_p = 0", _attention_limit),
    "aten._scaled_dot_product_attention_math.default": ("dropout_p = 0", _attention_limit),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": ("dropout_p = 0", _attention_limit),
    # dropout between the layers of a multi-layer recurrent net, drawn in training only
    **{f"aten.{net}.{form}": ("dropout = 0", _recurrent_limit)
       for net in ("lstm", "gru", "rnn_tanh", "rnn_relu") for form in ("input", "data")},
    "aten.normal.Tensor_Tensor": ("std = 0", _normal_limit),
    "aten.normal.Tensor_Tensor_out": ("std = 0", _normal_limit),
    "aten.normal.Tensor_float": ("std = 0", _normal_limit),
    "aten.normal.Tensor_float_out": ("std = 0", _normal_limit),
    "aten.normal.float_Tensor": ("std = 0", _normal_limit),
    "aten.normal.float_Tensor_out": ("std = 0", _normal_limit),
    "aten.rrelu_with_noise.default": ("lower = upper", _rrelu_limit),
    "aten.rrelu_with_noise.out": ("lower = upper", _rrelu_limit),
    "aten.rrelu_with_noise_.default": ("lower = upper", _rrelu_limit),
    "aten.rrelu_with_noise_functional.default": ("lower = upper", _rrelu_limit),
    "aten.rrelu.default": ("lower = upper", _rrelu_limit),
    "aten.rrelu_.default": ("lower = upper", _rrelu_limit),
    "aten.multinomial.default": ("one-hot rows, with replacement", _multinomial_limit),
    "aten.multinomial.out": ("one-hot rows, with replacement", _multinomial_limit),
}


# Limits on a scalar argument (dropout's p, attention's dropout_p, a recurrent net's
# dropout): a call already at its limit draws nothing, and its signature holds the scalar,
# so every call a rule found there covers draws nothing too. Tensor-valued limits
# (bernoulli's p) are not read off a signature.
SCALAR_LIMIT_ARGS = ("p", "dropout_p", "dropout")
NO_DRAWS_NOTE = "random op called at its deterministic limit ({}): draws nothing, explored as a deterministic op"


def draws_nothing(func, args: tuple, kwargs: dict) -> bool:
    """This call of a random op is already at its deterministic limit, in a scalar argument."""
    name = catalog.op_name(func)
    if name not in LIMITS:
        return False
    defaults = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    named = {**defaults, **_named(func, args, kwargs)}
    scalars = [k for k in SCALAR_LIMIT_ARGS if isinstance(named.get(k), (int, float)) and not isinstance(named[k], bool)]
    if not scalars:
        return False
    limited = {**defaults, **_named(func, *LIMITS[name][1](func, tuple(args), dict(kwargs)))}
    return all(named[k] == limited.get(k) for k in scalars)


def draws(func, args: tuple, kwargs: dict) -> bool:
    """Does this call of an op draw random values (tagged so, and not at its limit)?"""
    return catalog.tagged_random(func) and not draws_nothing(func, args, kwargs)


def is_fill(func) -> bool:
    name = catalog.op_name(func)
    return name in FILL_OVERLOADS or name.split(".")[1] in FILLS


def is_factory(func) -> bool:
    """A random op with no tensor input (out arguments aside)."""
    return not any("Tensor" in str(a.type) for a in func._schema.arguments if not a.is_out)


def checkable(func) -> bool:
    """A random op the explorer can check: a fill, one with a deterministic limit, or a factory."""
    if catalog.aten_base(func) in catalog.UNINITIALIZED:
        return False
    return is_fill(func) or catalog.op_name(func) in LIMITS or is_factory(func)


def _in_limit(func, fn: Call, limit: Callable) -> Call:
    @functools.wraps(fn)
    def limited(*args, **kwargs):
        args, kwargs = limit(func, tuple(args), dict(kwargs))
        return fn(*args, **kwargs)

    return limited


def _seeded(fn: Call) -> Call:
    # Only the CPU generator is seeded (every run draws on the CPU): torch.manual_seed
    # also seeds each lazy device (cuda, xpu, mtia), formatting its caller's stack for
    # each, ~0.1 ms per run for draws the op never makes.
    def seeded(*args, **kwargs):
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(FACTORY_SEED)
            return fn(*args, **kwargs)

    return seeded


def shared_draw_dims(func, args: tuple, kwargs: dict) -> tuple[int, ...]:
    """The output dims along which this call of a random op shares one draw (``OpCase.shared_dims``)."""
    if catalog.aten_base(func) not in FEATURE_MASKS:
        return ()
    named = _named(func, args, kwargs)
    return tuple(range(2, named["input" if "input" in named else "self"].dim()))


def checked_form(func, fn: Call, args: tuple, kwargs: dict) -> tuple[Call, str]:
    """What the explorer runs for the random op ``func`` (its runner ``fn``; a fill's is
    already zeroed, like ``empty_like``'s), and the note its rules carry. NoLimit when this
    call has no checkable form (multinomial without replacement)."""
    name = catalog.op_name(func)
    if is_fill(func):
        return fn, FILL_NOTE
    if name in LIMITS:
        what, limit = LIMITS[name]
        limit(func, tuple(args), dict(kwargs))  # raises where this call has no limit
        note = FEATURE_NOTE if catalog.aten_base(func) in FEATURE_MASKS else LIMIT_NOTE
        return _in_limit(func, fn, limit), note.format(what)
    if is_factory(func):
        return _seeded(fn), FACTORY_NOTE
    raise NoLimit(f"{name}: a random op with no deterministic limit")


__all__ = [
    "FEATURE_MASKS", "FEATURE_NOTE", "FILL_NOTE", "FACTORY_NOTE", "LIMITS", "NO_DRAWS_NOTE", "NoLimit", "UNCHECKABLE",
    "checkable", "checked_form", "draws", "draws_nothing", "is_factory", "is_fill", "shared_draw_dims",
]
