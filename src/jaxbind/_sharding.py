"""The sharding rule as a value: what ``sharding=`` and ``reduction=`` declare, parsed once.

An op's declaration is one `Sharding` (the option's value, ``Options.sharding``): a rule
given as text is parsed where the options are declared; a rule given as a function is
called once per call's shapes and keyword arguments (`Sharding.for_call` keeps the
answer). Either way a call's rule is a `ShardingRule`, in the einsum-like notation of
Shardy and custom_partitioning, from which everything else follows:

- each role's rule (`ShardingRule.for_role`): a transpose, JVP or VJP takes f's groups
  in its own argument layout (`to_role`; its inverse, `to_f`, finds f's arguments among
  a role's, as a rule function wants them);
- vmap's batch axes, as factors of their own (`with_batch`), as JAX's rule builder takes
  leading batch axes (its BATCHING factors); an op without a rule is marked for the
  batch partitioner by the same value: every axis its own factor, kept whole
  (`replicated`), with the batch factors added;
- the program's copy, as plain data (`to_config`; its Shardy form is written by
  _rules.partitioning.to_sdy, with JAX's rule builder).

Like the other values at the bottom of the package (_roles, _options), this module
imports none of jaxbind's.

A factor of a rule is one of three classes in each role: split where its arguments are
split, its results alike (pass-through: in arguments and results); split, with the
devices' partial results summed (reduction: in arguments only); or whole on every device
(need-replication). Which factors may be split at all is the op's declaration, the same
for every role (`splittable`); the class follows from where a factor appears in the
role's arguments and results.

What a call decides with its rule (whether it is partitioned, its checks, its results'
types) is in _rules.partitioning.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

__all__ = ["CONFIG_VERSION", "RuleError", "Sharding", "ShardingRule", "to_f", "to_role"]

CONFIG_VERSION = 1  # of ShardingRule.to_config, inside the call's attributes

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

Group = tuple[str, ...]  # the factors of one array's axes, in order
T = TypeVar("T")


class RuleError(ValueError):
    """A rule that cannot be: the text says what, without naming the op (the caller
    does)."""


def _show(groups: Sequence[Group]) -> str:
    return ", ".join(" ".join(m) for m in groups)


# --- the role layouts: f's arrays among a role's, and back -------------------------------


def _role(role: str) -> tuple[str, int | None]:
    """A role's base and index ("T3": ("T", 3)); the role is one of the op's (_roles.Role)."""
    if role[:1] == "T" and role[1:].isdigit():
        return "T", int(role[1:])
    if role not in ("f", "T", "jvp", "vjp"):
        raise LookupError(f"there is no role {role!r}")
    return role, None


def _involution(base: str, fixed: int, ops: tuple, res: tuple) -> tuple[tuple, tuple] | None:
    """The layouts that are their own inverse: f's (itself) and T's (the fixed arguments
    and f's results trade places with the arguments after them); None for the others."""
    if base == "f":
        return ops, res
    if base == "T":
        return ops[:fixed] + res, ops[fixed:]
    return None


def _layouts(role: str, fixed: int, args: Sequence, results: Sequence) -> tuple:
    """What both directions start from: the role's base and index, the arrays as tuples,
    and the layout itself where it is its own inverse (else None)."""
    ops, res = tuple(args), tuple(results)
    base, i = _role(role)
    return base, i, ops, res, (_involution(base, fixed, ops, res) if i is None else None)


def to_role(
    role: str, fixed: int, args: Sequence[T], results: Sequence[T]
) -> tuple[tuple[T, ...], tuple[T, ...]]:
    """A role's arguments and results, from f's (`args`, `results`: anything per array,
    a rule's groups or shapes) for an op with `fixed` fixed arguments (_roles.Args):

    - T: the fixed arguments, then cotangents of f's results; results: f's arguments
      after the fixed ones;
    - T<i> (multilinear): f's arguments but the i-th, then the cotangents; result: f's
      argument i;
    - jvp: all primals, then tangents of the arguments after the fixed ones; results:
      f's;
    - vjp: all primals, then cotangents of f's results; results: f's arguments after the
      fixed ones."""
    base, i, ops, res, same = _layouts(role, fixed, args, results)
    if same is not None:
        return same
    if i is not None:  # T<i>
        return ops[:i] + ops[i + 1 :] + res, (ops[i],)
    if base == "jvp":
        return ops + ops[fixed:], res
    return ops + res, ops[fixed:]  # vjp


def to_f(
    role: str, fixed: int, args: Sequence[T], results: Sequence[T], n_args: int
) -> tuple[tuple[T, ...], tuple[T, ...]]:
    """The inverse of `to_role`: f's arguments and results from a role's, for an op
    whose f takes `n_args` arguments (a JVP's tangents of the arguments are dropped:
    they repeat the primals')."""
    base, i, ops, res, same = _layouts(role, fixed, args, results)
    if same is not None:
        return same
    if i is not None:  # T<i>
        lead = ops[: n_args - 1]
        return lead[:i] + res[:1] + lead[i:], ops[n_args - 1 :]
    if base == "jvp":
        return ops[:n_args], res
    return ops[:n_args], ops[n_args:]  # vjp


# --- one call's rule ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShardingRule:
    """A sharding rule of one role of an op, as a value (frozen, hashable).

    Attributes:
      operands: the factors of each argument's axes, in order (fixed arguments included).
      results: the factors of each result's axes.
      splittable: the factors the op allows to be split (sorted): those of f that are in
        its arguments and in every result, and its reduction factors. The same set for
        every role.
    """

    operands: tuple[Group, ...]
    results: tuple[Group, ...]
    splittable: tuple[str, ...]

    @staticmethod
    def parse(text: str, reduction: Sequence[str] = ()) -> ShardingRule:
        """f's rule from its declaration; RuleError says what is wrong."""
        return _parse(text, tuple(reduction))

    @staticmethod
    def replicated(in_ranks: Sequence[int], out_ranks: Sequence[int]) -> ShardingRule:
        """The rule of an op that declares none: every axis its own factor, none split
        (with vmap's batch factors added, the batch partitioner's rule)."""
        ops = tuple(tuple(f"i{k}_{d}" for d in range(r)) for k, r in enumerate(in_ranks))
        res = tuple(tuple(f"o{k}_{d}" for d in range(r)) for k, r in enumerate(out_ranks))
        return ShardingRule(ops, res, ())

    @property
    def text(self) -> str:
        return f"{_show(self.operands)} -> {_show(self.results)}"

    def __str__(self) -> str:
        return self.text

    @property
    def factors(self) -> tuple[str, ...]:
        """Every factor, in order of first appearance."""
        return tuple(dict.fromkeys(f for m in self.operands + self.results for f in m))

    def _in(self, side: tuple[Group, ...]) -> set[str]:
        return {f for m in side for f in m}

    @property
    def pass_through(self) -> tuple[str, ...]:
        """Split factors on both sides: each device computes its part of the results."""
        both = self._in(self.operands) & self._in(self.results)
        return tuple(f for f in self.splittable if f in both)

    @property
    def reduction(self) -> tuple[str, ...]:
        """Split factors in the arguments only: each device's results are partial sums."""
        out = self._in(self.results)
        inside = self._in(self.operands)
        return tuple(f for f in self.splittable if f in inside and f not in out)

    def summed(self, result: int, split: Sequence[str]) -> tuple[str, ...]:
        """Of the factors that are `split`, those over which result `result` is a sum of
        the devices' partial results: the ones it lacks (a reduction factor; in a
        transpose or VJP, also a pass-through factor of f that this cotangent lacks, as
        when A's and x's cotangents of ``"n k, k -> n"`` are split over n)."""
        return tuple(f for f in split if f not in self.results[result])

    @property
    def need_replication(self) -> tuple[str, ...]:
        """Factors that stay whole on every device (results only, or not splittable)."""
        split = set(self.pass_through) | set(self.reduction)
        return tuple(f for f in self.factors if f not in split)

    def for_role(self, role: str, fixed: int) -> ShardingRule:
        """The rule of another role of the op whose f has this rule and `fixed` fixed
        arguments, its groups laid out by `to_role`. A factor keeps being splittable;
        where it now appears decides its class (a reduction factor of f that a transpose
        returns is pass-through there, a pass-through factor that the transpose sums over
        is a reduction). RuleError if the role cannot get a rule."""
        return _for_role(self, role, fixed)

    def with_batch(self, batch_axes: Any, out_batch_axes: Any) -> ShardingRule:
        """The rule of the call batched by vmap (`batch_axes`, `out_batch_axes`: the
        call's _spec.BatchAxes): a factor per vmap level, at each array's batch axes
        (wherever they are: jaxbind's loop puts them first, a vectorized op where
        its abstract function says), splittable and so pass-through."""
        levels = (batch_axes + out_batch_axes).levels
        if levels == 0:
            return self
        taken = set(self.factors)
        names: list[str] = []
        k = 0
        while len(names) < levels:
            if f"b{k}" not in taken:
                names.append(f"b{k}")
            k += 1

        def place(group: Group, axes: tuple[int, ...]) -> Group:
            rank = len(group) + len(axes)
            at = {a: names[j] for j, a in enumerate(axes)}
            core = iter(group)
            return tuple(at[d] if d in at else next(core) for d in range(rank))

        return ShardingRule(
            tuple(place(m, ax) for m, ax in zip(self.operands, batch_axes)),
            tuple(place(m, ax) for m, ax in zip(self.results, out_batch_axes)),
            tuple(sorted(set(self.splittable) | set(names))),
        )

    def to_config(self) -> dict[str, Any]:
        """The rule as plain data, as the program carries it (see from_config)."""
        return {
            "version": CONFIG_VERSION,
            "operands": [list(m) for m in self.operands],
            "results": [list(m) for m in self.results],
            "splittable": list(self.splittable),
        }

    @staticmethod
    def from_config(config: object) -> ShardingRule:
        """The rule a program carries (it may come from a file: every value checked)."""

        def groups(value: object) -> tuple[Group, ...]:
            if not isinstance(value, list) or not all(
                isinstance(m, list) and all(isinstance(f, str) and _NAME.match(f) for f in m)
                for m in value
            ):
                raise ValueError(f"malformed sharding rule in the program: {config!r}")
            return tuple(tuple(m) for m in value)

        if not isinstance(config, dict) or config.get("version") != CONFIG_VERSION:
            raise ValueError(
                f"the program's sharding rule is not of version {CONFIG_VERSION}: {config!r}; "
                "it was made by another jaxbind, load it with that one"
            )
        split = config.get("splittable")
        if not isinstance(split, list) or not all(isinstance(f, str) for f in split):
            raise ValueError(f"malformed sharding rule in the program: {config!r}")
        return ShardingRule(
            groups(config.get("operands")), groups(config.get("results")), tuple(split)
        )


@functools.lru_cache(maxsize=256)
def _parse(text: str, reduction: tuple[str, ...]) -> ShardingRule:
    if text.count("->") != 1:
        raise RuleError('it needs exactly one "->" between the arguments and the results')
    left, right = text.split("->")

    def side(part: str, what: str) -> tuple[Group, ...]:
        if not part.strip():  # "-> g": one scalar (an op has an argument and a result)
            return ((),)
        groups = []
        for k, group in enumerate(part.split(",")):
            names = tuple(group.split())
            for f in names:
                if not _NAME.match(f):
                    raise RuleError(
                        f"{what} {k} has the factor {f!r}; factor names start with a letter "
                        "and hold letters, digits and _ (Shardy's rule); ellipses and "
                        "compound factors are not supported"
                    )
            twice = [f for f in names if names.count(f) > 1]
            if twice:
                raise RuleError(
                    f"{what} {k} names the factor {twice[0]!r} twice; each axis of an array "
                    "needs its own factor"
                )
            groups.append(names)
        return tuple(groups)

    operands, results = side(left, "argument"), side(right, "result")
    inside = {f for m in operands for f in m}
    out = {f for m in results for f in m}
    for f in reduction:
        if not _NAME.match(f):
            raise RuleError(f"reduction names {f!r}, which is no factor name")
        if f not in inside and f not in out:
            raise RuleError(
                f"reduction names {f!r}, which the rule does not have (its factors: "
                f"{', '.join(sorted(inside | out))})"
            )
        if f in out:
            raise RuleError(
                f"reduction factor {f!r} appears in a result; the function sums over a "
                "reduction factor, so no result has it. Drop it from reduction= (a factor "
                "in arguments and results is split as the arguments are), or give the "
                "result's axis another name"
            )
    # A factor some results have and others lack stays whole: the declaration does not
    # say that those others are sums over it (in f; its transposes do sum over it).
    every = set.intersection(*(set(m) for m in results))
    splittable = (inside & every) | set(reduction)
    return ShardingRule(operands, results, tuple(sorted(splittable)))


@functools.lru_cache(maxsize=1024)
def _for_role(rule: ShardingRule, role: str, fixed: int) -> ShardingRule:
    base, i = _role(role)
    ops = rule.operands
    if len(ops) <= fixed:
        raise RuleError(
            f"it declares {len(ops)} argument(s), but the op has {fixed} fixed one(s) and needs "
            "at least one more"
        )
    if base == "T" and i is not None and not fixed <= i < len(ops):
        raise RuleError(
            f"the transpose with respect to argument {i} has no argument {i} among the "
            f"rule's {len(ops)} (after {fixed} fixed)"
        )
    operands, results = to_role(role, fixed, ops, rule.results)
    return replace(rule, operands=operands, results=results)


# --- the declaration: the option's value --------------------------------------------------


# A rule function's answers kept per declaration (shapes and keyword arguments: the
# call's), so that every rule of one call reads one answer.
_MEMO_SIZE = 256


@dataclass(frozen=True, slots=True)
class Sharding:
    """An op's ``sharding=`` (and ``reduction=``), the value of ``Options.sharding``.

    Attributes:
      text: the rule as written, its spacing normalized ("" for a function).
      reduction: the reduction factors declared with it.
      rule: f's rule, parsed from `text` (None for a function).
      function: the rule function (called with the shapes of f's arguments and the call's
        keyword arguments, it returns the rule, (rule, reduction) or None), or None.
    """

    text: str = ""
    reduction: tuple[str, ...] = ()
    rule: ShardingRule | None = None
    function: Callable[..., Any] | None = None
    _memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @staticmethod
    def declare(value: str | Callable[..., Any], reduction: Sequence[str] = ()) -> Sharding:
        """The declaration: a text parsed now (RuleError says what is wrong), or a
        function kept for the calls."""
        if callable(value):
            return Sharding(function=value)
        text = " ".join(value.split())
        factors = tuple(dict.fromkeys(reduction))
        return Sharding(text, factors, ShardingRule.parse(text, factors))

    def for_call(
        self,
        shapes: Sequence[Sequence[Any]],
        kwargs: Mapping[str, Any],
        where: str,
        key: Hashable = None,
    ) -> Sharding | None:
        """This call's rule, as a text declaration (itself, for a text): a function is
        called with the shapes of f's arguments (unbatched) and the keyword arguments,
        its answer parsed; None: no rule for this call. `where` starts each message (it
        names the op); `key`: the keyword arguments, hashable, to keep the answer for
        the next rule of the same call (None: call the function again)."""
        if self.function is None:
            return self
        shapes = tuple(tuple(s) for s in shapes)
        memo = (shapes, key) if key is not None else None
        if memo is not None and memo in self._memo:
            return self._memo[memo]
        found = self._call(shapes, dict(kwargs), where)
        if memo is not None:
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            self._memo[memo] = found
        return found

    def _call(self, shapes: tuple, kwargs: dict[str, Any], where: str) -> Sharding | None:
        assert self.function is not None
        shown = self.describe()
        try:
            value = self.function(*shapes, **kwargs)
        except Exception as exc:
            raise TypeError(
                f"{where}: {shown} raised {type(exc).__name__}: {exc}; the function gets "
                f"the shapes of f's arguments, one positional argument each, and the call's "
                f"keyword arguments ({', '.join(kwargs) or 'none'}), and returns the rule, or "
                "(rule, reduction)"
            ) from exc
        if value is None:  # this call has no rule: it runs whole, as without one
            return None
        text: Any = value
        reduction: Any = ()
        if isinstance(value, tuple) and len(value) == 2:
            text, reduction = value
            reduction = (reduction,) if isinstance(reduction, str) else reduction
        if not isinstance(text, str) or "->" not in text:
            raise TypeError(
                f"{where}: {shown} returned {value!r}; return the rule in einsum-like "
                'notation (e.g. "m d, m -> g"), or (rule, reduction) (e.g. ("m d, m -> g", '
                '("m",))), or None for a call that has none'
            )
        try:
            return Sharding.declare(text, tuple(str(f) for f in reduction))
        except (RuleError, TypeError) as exc:
            raise ValueError(f"{where}: {shown} returned {value!r}: {exc}") from None

    def record(self) -> list:
        """A text declaration as a program's definition records it: [text, reduction]."""
        return [self.text, list(self.reduction)]

    def describe(self, call: Sharding | None = None) -> str:
        """The declaration as the user wrote it, for messages; `call`: the rule a
        function gave this call, shown with it."""
        if self.function is not None:
            shown = f"sharding={getattr(self.function, '__qualname__', self.function)!s}"
            return shown + (
                f" (giving {call.rule.text!r} for this call)" if call and call.rule else ""
            )
        return f"sharding={self.text!r}" + (
            f", reduction={self.reduction!r}" if self.reduction else ""
        )
