"""Sharding: how XLA may split a jaxbind call across devices.

Two ways, and `marking` decides which a call takes:

- **A declared rule** (``sharding=``, ``reduction=``): the op says how its axes relate,
  in the einsum-like notation of Shardy and custom_partitioning. Its value is a
  `Partitioning`: f's rule, each role's (`for_role`: a transpose, JVP or VJP gets the
  rule that follows from f's), vmap's batch axes added (`with_batch`), written as a
  Shardy rule (`to_sdy`) and as data in the program (`to_config`). In a program that XLA
  partitions automatically over several devices, such a call lowers to jaxbind's target
  ``jaxbind_partitioned`` (see .lowering), whose partitioner (.spmd) gives each device
  the ordinary call on its part of the arguments, then sums partial results over the
  devices that split a reduction factor.
- **Batch partitioning**, for ops without a rule: batch elements of a vmapped op are
  independent, so a call whose batch axes lead every input and output can run on each
  device's shard of the batch. Such calls are marked for both of JAX's partitioners: the
  FFI target is registered as batch partitionable, and the call carries the frontend
  attribute ``num_batch_dims``; under Shardy it also carries a rule in which the batch
  axes are shared factors and every other axis must be replicated. Calls that do not
  qualify (an unbatched fixed argument, native batch axes that are not leading) are not
  marked: XLA gathers their inputs and runs them replicated, which is correct but not
  parallel. Nor, under Shardy, are calls whose result shapes are symbolic.

A factor of a rule is one of three classes in each role: split where its arguments are
split, its results alike (pass-through: in arguments and results); split, with the
devices' partial results summed (reduction: in arguments only); or whole on every device
(need-replication). Which factors may be split at all is the op's declaration, the same
for every role (`splittable`); the class follows from where a factor appears in the
role's arguments and results.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from .._compat import (
    auto_partitioned_devices,
    config_use_shardy,
    explicit_mesh,
    explicit_spec,
    explicitly_sharded,
    ir,
    sdy_sharding_rule,
)
from .._errors import about, words
from .._options import Options
from .._roles import Body, Role, RoleDef, describe_role
from .._spec import BatchAxes, CallSpec

__all__ = [
    "PARTITIONED_TARGET",
    "Marking",
    "Partitioning",
    "check_call",
    "check_declaration",
    "declared",
    "mark_batch_partitionable",
    "marking",
    "num_batch_dims",
    "typed_results",
]

# The custom call of a call partitioned by its declared rule (see .spmd, .lowering).
PARTITIONED_TARGET = "jaxbind_partitioned"
CONFIG_VERSION = 1  # of Partitioning.to_config, inside the call's attributes

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

Mapping = tuple[str, ...]  # the factors of one array's axes, in order


class RuleError(ValueError):
    """A rule that cannot be: the text says what, without naming the op (the caller
    does)."""


def _show(mappings: Sequence[Mapping]) -> str:
    return ", ".join(" ".join(m) for m in mappings)


@dataclass(frozen=True, slots=True)
class Partitioning:
    """A sharding rule of one role of an op, as a value (frozen, hashable).

    Attributes:
      operands: the factors of each argument's axes, in order (fixed arguments included).
      results: the factors of each result's axes.
      splittable: the factors the op allows to be split (sorted): those of f that are in
        its arguments and in every result, and its reduction factors. The same set for
        every role.
    """

    operands: tuple[Mapping, ...]
    results: tuple[Mapping, ...]
    splittable: tuple[str, ...]

    @staticmethod
    def parse(text: str, reduction: Sequence[str] = ()) -> Partitioning:
        """f's rule from its declaration; RuleError says what is wrong."""
        return _parse(text, tuple(reduction))

    @property
    def text(self) -> str:
        return f"{_show(self.operands)} -> {_show(self.results)}"

    def __str__(self) -> str:
        return self.text

    @property
    def factors(self) -> tuple[str, ...]:
        """Every factor, in order of first appearance."""
        return tuple(dict.fromkeys(f for m in self.operands + self.results for f in m))

    def _in(self, side: tuple[Mapping, ...]) -> set[str]:
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

    def for_role(self, role: str, fixed: int) -> Partitioning:
        """The rule of another role of the op whose f has this rule and `fixed` fixed
        arguments, through the role's argument layout (_roles.Args):

        - T: the fixed arguments keep their factors, the cotangents take f's results',
          the results take those of f's arguments after the fixed ones;
        - T<i> (multilinear): f's arguments but the i-th, then the cotangents; the
          result takes argument i's factors;
        - jvp: all primals, then tangents of the arguments after the fixed ones; the
          results are f's;
        - vjp: all primals, then cotangents of f's results; the results take the factors
          of f's arguments after the fixed ones.

        A factor keeps being splittable; where it now appears decides its class (a
        reduction factor of f that a transpose returns is pass-through there, a
        pass-through factor that the transpose sums over is a reduction). RuleError if
        the role cannot get a rule."""
        return _for_role(self, role, fixed)

    def with_batch(self, batch_axes: BatchAxes, out_batch_axes: BatchAxes) -> Partitioning:
        """The rule of the call batched by vmap: a factor per vmap level, at each array's
        batch axes (wherever they are: jaxbind's loop puts them first, a natively
        batching op where its abstract function says), splittable and so pass-through."""
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

        def place(mapping: Mapping, axes: tuple[int, ...]) -> Mapping:
            rank = len(mapping) + len(axes)
            at = {a: names[j] for j, a in enumerate(axes)}
            core = iter(mapping)
            return tuple(at[d] if d in at else next(core) for d in range(rank))

        return Partitioning(
            tuple(place(m, ax) for m, ax in zip(self.operands, batch_axes)),
            tuple(place(m, ax) for m, ax in zip(self.results, out_batch_axes)),
            tuple(sorted(set(self.splittable) | set(names))),
        )

    def to_sdy(self, operand_types: Sequence[ir.Type], result_types: Sequence[ir.Type]) -> Any:
        """The ``sdy.sharding_rule`` attribute of the call (reduction and need-replication
        factors declared where JAX's rule builder takes them: jax 0.10 and newer), each
        list in the order of the factors' first appearance, as Shardy numbers them (its
        verifier refuses unsorted indices: "indices of special factors must be sorted")."""
        reduction = tuple(f for f in self.factors if f in self.reduction)
        return sdy_sharding_rule(
            self.text, self.need_replication, operand_types, result_types, reduction
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
    def from_config(config: object) -> Partitioning:
        """The rule a program carries (it may come from a file: every value checked)."""

        def mappings(value: object) -> tuple[Mapping, ...]:
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
        return Partitioning(
            mappings(config.get("operands")), mappings(config.get("results")), tuple(split)
        )


@functools.lru_cache(maxsize=256)
def _parse(text: str, reduction: tuple[str, ...]) -> Partitioning:
    if text.count("->") != 1:
        raise RuleError('it needs exactly one "->" between the arguments and the results')
    left, right = text.split("->")

    def side(part: str, what: str) -> tuple[Mapping, ...]:
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
    return Partitioning(operands, results, tuple(sorted(splittable)))


@functools.lru_cache(maxsize=1024)
def _for_role(rule: Partitioning, role: str, fixed: int) -> Partitioning:
    parsed = Role.parse(role)
    ops, res = rule.operands, rule.results
    if len(ops) <= fixed:
        raise RuleError(
            f"it declares {len(ops)} argument(s), but the op has {fixed} fixed one(s) and needs "
            "at least one more"
        )
    if parsed.base == "f":
        return rule
    if parsed.base == "T" and parsed.index is None:
        new = (ops[:fixed] + res, ops[fixed:])
    elif parsed.base == "T":
        i = parsed.index
        assert i is not None
        if not fixed <= i < len(ops):
            raise RuleError(
                f"{describe_role(role)} has no argument {i} among the rule's {len(ops)} "
                f"(after {fixed} fixed)"
            )
        new = (ops[:i] + ops[i + 1 :] + res, (ops[i],))
    elif parsed.base == "jvp":
        new = (ops + ops[fixed:], res)
    else:  # vjp
        new = (ops + res, ops[fixed:])
    return replace(rule, operands=new[0], results=new[1])


def declared(
    options: Options,
    kwargs: dict[str, Any] | None = None,
    name: str = "",
    shapes: Sequence[tuple[Any, ...]] = (),
) -> Partitioning | None:
    """f's rule of an op's call with keyword arguments `kwargs` (None: none declared).
    A rule given as text is checked at the op's creation; one given as a function is
    called with the shapes of f's arguments (`shapes`, unbatched) and the call's keyword
    arguments, and checked here, each error naming the op (`name`); it may return None:
    this call has no rule."""
    if options.sharding is None:
        return None
    if not callable(options.sharding):
        return _parse(options.sharding, options.reduction)
    return _from_function(name, options.sharding, tuple(shapes), dict(kwargs or {}))


def f_shapes(
    spec: CallSpec, avals: Sequence[Any], outs: Sequence[Any]
) -> tuple[tuple[Any, ...], ...]:
    """The shapes of f's arguments (without batch axes) at a call of any role, from the
    role's arguments `avals` and results `outs` (see _roles.Args)."""
    batch = spec.batch_axes or BatchAxes.none(len(avals))
    out_batch = spec.out_batch_axes or BatchAxes.none(len(outs))
    ins = [
        batch.core_shape(a.shape, k) if len(batch) > k else tuple(a.shape)
        for k, a in enumerate(avals)
    ]
    res = [
        out_batch.core_shape(o.shape, k) if len(out_batch) > k else tuple(o.shape)
        for k, o in enumerate(outs)
    ]
    role = Role.parse(spec.role)
    if role.base == "f":
        return tuple(ins)
    if role.base in ("jvp", "vjp"):  # all primals first
        return tuple(ins[: spec.n_fixed])
    if role.index is None:  # "T": the fixed arguments, then cotangents; results: the inputs'
        return tuple(ins[: spec.binding.options.fixed] + res)
    lead = ins[: spec.n_lead]  # "T<i>": f's arguments but the i-th
    return tuple(lead[: role.index] + res[:1] + lead[role.index :])


def _from_function(
    name: str, fn: Any, shapes: tuple[Any, ...], kwargs: dict[str, Any]
) -> Partitioning | None:
    shown = f"sharding={getattr(fn, '__qualname__', fn)!s}"
    try:
        value = fn(*shapes, **kwargs)
    except Exception as exc:
        raise TypeError(
            f"{about(name)}: {shown} raised {type(exc).__name__}: {exc}; the function gets "
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
            f"{about(name)}: {shown} returned {value!r}; return the rule in einsum-like "
            'notation (e.g. "m d, m -> g"), or (rule, reduction) (e.g. ("m d, m -> g", '
            '("m",))), or None for a call that has none'
        )
    try:
        return _parse(" ".join(text.split()), tuple(reduction))
    except (RuleError, TypeError) as exc:
        raise ValueError(f"{about(name)}: {shown} returned {value!r}: {exc}") from None


def _given(options: Options, rule: Partitioning) -> str:
    """The declaration as the user wrote it, for messages (a function's rule shown)."""
    if callable(options.sharding):
        fn = getattr(options.sharding, "__qualname__", options.sharding)
        return f"sharding={fn!s} (giving {rule.text!r} for this call)"
    return f"sharding={options.sharding!r}"


def check_declaration(name: str, options: Options, roles: dict[str, RoleDef]) -> None:
    """Refuse, at the op's creation, a rule that cannot be (its syntax, its reduction
    factors), one that the op's other options make unsound, and a role that can get no
    rule; every message names the op, says what is wrong and what to write."""
    if options.sharding is None:
        return
    per_call = callable(options.sharding)
    given = (
        f"sharding={getattr(options.sharding, '__qualname__', options.sharding)!s}"
        if per_call
        else f"sharding={options.sharding!r}"
    ) + (f", reduction={options.reduction!r}" if options.reduction else "")
    rule = None
    if not per_call:
        try:
            rule = _parse(options.sharding, options.reduction)
        except RuleError as exc:
            raise ValueError(f"{about(name)}: {given}: {exc}") from None
    if options.effect is not None:
        flag = "ordered=True" if options.effect == "ordered" else "has_side_effect=True"
        raise TypeError(
            f"{about(name)}: {given} lets XLA run the op on every device's part of its "
            f"arguments, but it has side effects ({flag}), which jaxbind runs once, on one "
            f"device. Drop sharding= (or {flag})"
        )
    if options.aliases:
        raise TypeError(
            f"{about(name)}: {given} with input_output_aliases: a device's part of an "
            "aliased input cannot hold a result that devices sum or that is whole on each. "
            "Drop input_output_aliases (or sharding=)"
        )
    if rule is None:  # a function: its rules are checked at every call
        return
    fixed = options.fixed
    if len(rule.operands) <= fixed:
        raise ValueError(
            f"{about(name)}: {given} declares {len(rule.operands)} argument(s), but "
            f"{words(options).fixed}={fixed}: the rule has one group of factor names per "
            "argument, the fixed ones included, and the op needs one argument after them"
        )
    for entry in roles.values():
        if entry.body is None or entry.kind is Body.JAX:  # traced: JAX partitions its code
            continue
        try:
            rule.for_role(entry.role.text, fixed)
        except RuleError as exc:
            raise ValueError(
                f"{about(name, entry.role.text)}: {given}: no rule follows for it: {exc}"
            ) from None


def rule_of(spec: CallSpec, avals: Sequence[Any], outs: Sequence[Any]) -> Partitioning | None:
    """The rule of this call's role, unbatched (None: the op declares none, or the role
    is a JAX function, whose code JAX partitions itself); `avals` and `outs`: the call's
    arguments and results (a rule function gets f's argument shapes from them)."""
    options = spec.binding.options
    if options.sharding is None or spec.entry.kind is Body.JAX:
        return None
    shapes = f_shapes(spec, avals, outs) if callable(options.sharding) else ()
    rule = declared(options, spec.kwargs.to_dict(), spec.name, shapes)
    if rule is None:
        return None
    return rule.for_role(spec.role, spec.binding.options.fixed)


def check_call(spec: CallSpec, avals: Sequence[Any], outs: Sequence[Any]) -> None:
    """A call's arguments and results against its role's rule (at trace time): as many
    as the rule has groups, each with as many axes (batch axes aside) as its group has
    factors, and each factor one size wherever it appears."""
    rule = rule_of(spec, avals, outs)
    if rule is None:
        return
    options = spec.binding.options
    shapes = f_shapes(spec, avals, outs) if callable(options.sharding) else ()
    f_rule = declared(options, spec.kwargs.to_dict(), spec.name, shapes)
    where = f"{about(spec.name, spec.role)}: {_given(options, f_rule or rule)}"
    if spec.role != "f":
        where += f" gives it the rule {rule.text!r}"
    batch = spec.batch_axes or BatchAxes.none(len(avals))
    out_batch = spec.out_batch_axes or BatchAxes.none(len(outs))
    for what, arrays, mappings in (
        ("argument", avals, rule.operands),
        ("result", outs, rule.results),
    ):
        if len(arrays) != len(mappings):
            raise TypeError(
                f"{where}, with {len(mappings)} {what}(s), but the call has {len(arrays)}; "
                f"write one group of factor names per {what} (fixed arguments and pytree "
                "leaves included, in order)"
            )
    sizes: dict[str, tuple[int, str]] = {}
    for what, arrays, mappings, axes in (
        ("argument", avals, rule.operands, batch),
        ("result", outs, rule.results, out_batch),
    ):
        for k, (aval, mapping) in enumerate(zip(arrays, mappings)):
            shape = axes.core_shape(aval.shape, k) if len(axes) > k else aval.shape
            if len(shape) != len(mapping):
                raise TypeError(
                    f"{where}: {what} {k} has shape {tuple(shape)} ({len(shape)} axes), but "
                    f"the rule gives it {len(mapping)} factor(s) ({' '.join(mapping) or 'none'})"
                    "; write one factor name per axis"
                )
            for f, size in zip(mapping, shape):
                if not isinstance(size, int):
                    continue  # symbolic (shape polymorphism): such calls are not partitioned
                seen = sizes.setdefault(f, (size, f"{what} {k}"))
                if seen[0] != size:
                    raise TypeError(
                        f"{where}: factor {f!r} has size {seen[0]} in {seen[1]} but {size} in "
                        f"{what} {k}; one factor has one size. Give the axes different names "
                        "if they are not the same axis"
                    )


def typed_results(spec: CallSpec, avals: Sequence[Any], outs: Sequence[Any]) -> tuple[Any, ...]:
    """The results of a forward call (f, a JVP) in JAX's explicit sharding mode, typed by
    its rule: a pass-through factor takes the mesh axes of the first argument axis that
    is sharded along it (a mesh axis that one result would use twice is left out the
    second time). A result left whole keeps its untyped aval, as do the results of
    transposes and VJPs (JAX checks a cotangent's type against its primal's, which the
    call cannot see), and every result in auto mode, in shard_map, or without a rule."""
    rule = rule_of(spec, avals, outs)
    if rule is None or Role.parse(spec.role).base not in ("f", "jvp"):
        return tuple(outs)
    mesh = explicit_mesh(avals)
    if mesh is None:
        return tuple(outs)
    if spec.batch_axes is not None and spec.out_batch_axes is not None:
        rule = rule.with_batch(spec.batch_axes, spec.out_batch_axes)
    where: dict[str, Any] = {}
    for mapping, aval in zip(rule.operands, avals):
        for f, entry in zip(mapping, explicit_spec(aval, mesh)):
            if f in rule.pass_through and entry is not None:
                where.setdefault(f, entry)
    typed = []
    for mapping, out in zip(rule.results, outs):
        entries: list[Any] = []
        used: set[str] = set()
        for f in mapping:
            entry = where.get(f)
            names = {entry} if isinstance(entry, str) else set(entry or ())
            if entry is None or names & used:
                entries.append(None)
            else:
                entries.append(entry)
                used |= names
        split = any(e is not None for e in entries)
        typed.append(explicitly_sharded(out, mesh, entries) if split else out)
    return tuple(typed)


class Marking(NamedTuple):
    """How a call is lowered for XLA's partitioners (see `marking`)."""

    rule: Partitioning | None  # declared: the call lowers to PARTITIONED_TARGET with it
    batch_dims: int  # else: leading batch axes the batch partitioner may split (0: none)


def marking(ctx: Any, spec: CallSpec, n_outputs: int) -> Marking:
    """The one decision: does this call carry its declared rule (an op with a rule, in a
    program partitioned automatically over several devices, with concrete shapes), a
    batch marking, or neither? One device, or inside a fully manual shard_map: as
    without a rule."""
    if (
        spec.binding.options.sharding is not None
        and n_outputs > 0
        and auto_partitioned_devices(ctx) > 1
        and all(isinstance(d, int) for a in (*ctx.avals_in, *ctx.avals_out) for d in a.shape)
        and (rule := rule_of(spec, ctx.avals_in, ctx.avals_out)) is not None
    ):
        if spec.batch_axes is not None and spec.out_batch_axes is not None:
            rule = rule.with_batch(spec.batch_axes, spec.out_batch_axes)
        return Marking(rule, 0)
    return Marking(None, num_batch_dims(spec, n_outputs))


def num_batch_dims(spec: CallSpec, n_outputs: int) -> int:
    """How many leading axes of every input and output are batch axes (0: none or not all)."""
    if spec.batch_axes is None or spec.out_batch_axes is None or n_outputs == 0:
        return 0
    axes = spec.batch_axes + spec.out_batch_axes
    return axes.levels if axes.all_leading else 0


def mark_batch_partitionable(
    op: ir.Operation, n: int, in_ranks: Sequence[int], out_ranks: Sequence[int]
) -> None:
    """Annotate a lowered jaxbind custom call so that XLA can split its `n` leading
    batch axes."""
    if n == 0:
        return
    attrs = {"num_batch_dims": ir.StringAttr.get(str(n))}
    op.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(attrs)
    # Symbolic result shapes (jax.export) add shape operands, which JAX's shape
    # refinement removes again before compiling: no Shardy rule can name both forms,
    # so such calls carry none (correct, but replicated under Shardy).
    if config_use_shardy() and len(op.operands) == len(in_ranks):
        batch = [f"b{k}" for k in range(n)]
        rest, mappings = [], []
        for which, ranks in (("i", in_ranks), ("o", out_ranks)):
            for index, rank in enumerate(ranks):
                own = [f"{which}{index}_{d}" for d in range(n, rank)]
                rest += own
                mappings.append(" ".join(batch + own) or "")
        n_in = len(in_ranks)
        rule = ", ".join(mappings[:n_in]) + " -> " + ", ".join(mappings[n_in:])
        op.attributes["sdy.sharding_rule"] = sdy_sharding_rule(
            rule, tuple(rest), [v.type for v in op.operands], [r.type for r in op.results]
        )
