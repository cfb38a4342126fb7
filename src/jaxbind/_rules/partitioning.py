"""Sharding, per call: how XLA may split one jaxbind call across devices.

The rule itself is a value (jaxbind._sharding: the op's declaration, parsed once; each
role's rule; vmap's batch factors). Here are the decisions each call makes with it, and
`rule_mark` decides which of two ways a call takes:

- **A declared rule** (``sharding=``, ``reduction=``): in a program that XLA partitions
  automatically over several devices, such a call lowers to a partitioned row of the
  target table (.targets: ``jaxbind_partitioned``, or ``jaxbind_cuda_kernel_partitioned``
  for a CUDA kernel), whose partitioner (.spmd) gives each device the ordinary call of
  the row's per-device target on its part of the arguments, then sums partial results
  over the devices that split a reduction factor.
- **Batch partitioning**, for ops without a rule: batch elements of a vmapped op are
  independent, so a call whose batch axes lead every input and output can run on each
  device's shard of the batch. Such calls are marked for both of JAX's partitioners: the
  FFI target is registered as batch partitionable, and the call carries the frontend
  attribute ``num_batch_dims``; under Shardy it also carries the rule in which the batch
  axes are shared factors and every other axis is replicated (`ShardingRule.replicated`
  with batch factors). Calls that do not qualify (an unbatched fixed argument, vectorized
  batch axes that are not leading) are not marked: XLA gathers their inputs and runs
  them replicated, which is correct but not parallel. Nor, under Shardy, are calls whose
  result shapes are symbolic.

Besides: the declaration checked against the op at its creation (`check_declaration`),
every call against its rule at trace time (`check_call`), and the results of a forward
call typed by it in JAX's explicit sharding mode (`typed_results`).
"""

from __future__ import annotations

from collections.abc import Sequence
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
from .._roles import Role, RoleDef
from .._sharding import RuleError, Sharding, ShardingRule, to_f
from .._spec import BatchAxes, CallSpec

__all__ = [
    "CallRule",
    "RuleMark",
    "call_rule",
    "check_call",
    "check_declaration",
    "declared",
    "f_shapes",
    "mark_batch_partitionable",
    "num_batch_dims",
    "rule_mark",
    "to_sdy",
    "typed_results",
]


def declared(
    options: Options,
    kwargs: dict[str, Any] | None = None,
    name: str = "",
    shapes: Sequence[tuple[Any, ...]] = (),
) -> ShardingRule | None:
    """f's rule of an op's call with keyword arguments `kwargs` and f's argument shapes
    `shapes` (unbatched): None if the op declares none or its function gives none."""
    if options.sharding is None:
        return None
    found = options.sharding.for_call(shapes, dict(kwargs or {}), about(name))
    return None if found is None else found.rule


def f_shapes(
    spec: CallSpec, avals: Sequence[Any], outs: Sequence[Any]
) -> tuple[tuple[Any, ...], ...]:
    """The shapes of f's arguments (without batch axes) at a call of any role, from the
    role's arguments `avals` and results `outs` (_sharding.to_f)."""
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
    fixed = spec.binding.options.fixed
    n_args = (
        {
            "f": len(ins),
            "T": fixed + len(res),
            "jvp": spec.n_fixed,  # all primals first
            "vjp": spec.n_fixed,
        }[role.base]
        if role.index is None
        else spec.n_lead + 1
    )
    return to_f(spec.role, fixed, ins, res, n_args)[0]


class CallRule(NamedTuple):
    """The rule of one call: the declaration it came from (a function's answer for this
    call, as text), its role's rule, and the shapes of f's arguments it was worked out
    for."""

    declared: Sharding
    rule: ShardingRule
    shapes: tuple[tuple[Any, ...], ...]


def call_rule(spec: CallSpec, avals: Sequence[Any], outs: Sequence[Any]) -> CallRule | None:
    """The rule of this call's role, unbatched (None: the op declares none, or the role
    is a JAX function, whose code JAX partitions itself). A rule function is called once
    for the call's shapes and keyword arguments: every rule of the call (its checks, its
    results' types, its lowering, its record) reads that one answer."""
    sharding = spec.binding.options.sharding
    if sharding is None or spec.entry.kind.traced:
        return None
    shapes = f_shapes(spec, avals, outs) if sharding.function is not None else ()
    found = sharding.for_call(shapes, spec.kwargs.to_dict(), about(spec.name), key=spec.kwargs)
    if found is None or found.rule is None:
        return None
    return CallRule(found, found.rule.for_role(spec.role, spec.binding.options.fixed), shapes)


def check_declaration(name: str, options: Options, roles: dict[str, RoleDef]) -> None:
    """Refuse, at the op's creation, a rule that cannot be (its syntax, its reduction
    factors), one that the op's other options make unsound, and a role that can get no
    rule; every message names the op, says what is wrong and what to write."""
    if options.sharding is None:
        return
    given = options.sharding.describe()
    rule = options.sharding.rule  # parsed at declaration (None: a function's, per call)
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
        if entry.body is None or entry.kind.traced:  # traced: JAX partitions its code
            continue
        try:
            rule.for_role(entry.role.text, fixed)
        except RuleError as exc:
            raise ValueError(
                f"{about(name, entry.role.text)}: {given}: no rule follows for it: {exc}"
            ) from None


def check_call(spec: CallSpec, avals: Sequence[Any], outs: Sequence[Any]) -> None:
    """A call's arguments and results against its role's rule (at trace time): as many
    as the rule has groups, each with as many axes (batch axes aside) as its group has
    factors, and each factor one size wherever it appears."""
    found = call_rule(spec, avals, outs)
    if found is None:
        return
    sharding, rule = spec.binding.options.sharding, found.rule
    assert sharding is not None
    where = f"{about(spec.name, spec.role)}: {sharding.describe(found.declared)}"
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
    found = call_rule(spec, avals, outs)
    if found is None or Role.parse(spec.role).base not in ("f", "jvp"):
        return tuple(outs)
    rule = found.rule
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


class RuleMark(NamedTuple):
    """How a call is lowered for XLA's partitioners (see `rule_mark`)."""

    rule: CallRule | None  # declared: the call lowers to a partitioned target with it
    batch_dims: int  # else: leading batch axes the batch partitioner may split (0: none)

    @property
    def partitioned(self) -> ShardingRule | None:
        """The rule the program carries: the role's, with vmap's batch factors."""
        return None if self.rule is None else self.rule.rule


def rule_mark(ctx: Any, spec: CallSpec, n_outputs: int) -> RuleMark:
    """The one decision: does this call carry its declared rule (an op with a rule, in a
    program partitioned automatically over several devices, with concrete shapes), a
    batch marking, or neither? One device, or inside a fully manual shard_map: as
    without a rule."""
    if (
        spec.binding.options.sharding is not None
        and n_outputs > 0
        and auto_partitioned_devices(ctx) > 1
        and all(isinstance(d, int) for a in (*ctx.avals_in, *ctx.avals_out) for d in a.shape)
        and (found := call_rule(spec, ctx.avals_in, ctx.avals_out)) is not None
    ):
        if spec.batch_axes is not None and spec.out_batch_axes is not None:
            found = found._replace(rule=found.rule.with_batch(spec.batch_axes, spec.out_batch_axes))
        return RuleMark(found, 0)
    return RuleMark(None, num_batch_dims(spec, n_outputs))


def num_batch_dims(spec: CallSpec, n_outputs: int) -> int:
    """How many leading axes of every input and output are batch axes (0: none or not all)."""
    if spec.batch_axes is None or spec.out_batch_axes is None or n_outputs == 0:
        return 0
    axes = spec.batch_axes + spec.out_batch_axes
    return axes.levels if axes.all_leading else 0


NOT_MARKED = RuleMark(None, 0)


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
        core = ShardingRule.replicated([r - n for r in in_ranks], [r - n for r in out_ranks])
        rule = core.with_batch(
            BatchAxes.leading(n, len(in_ranks)), BatchAxes.leading(n, len(out_ranks))
        )
        op.attributes["sdy.sharding_rule"] = to_sdy(
            rule, [v.type for v in op.operands], [r.type for r in op.results]
        )


def to_sdy(rule: ShardingRule, operand_types: Sequence[Any], result_types: Sequence[Any]) -> Any:
    """The ``sdy.sharding_rule`` attribute of a call with `rule` (reduction and
    need-replication factors declared where JAX's rule builder takes them: jax 0.10 and
    newer), each list in the order of the factors' first appearance, as Shardy numbers
    them (its verifier refuses unsorted indices: "indices of special factors must be
    sorted")."""
    reduction = tuple(f for f in rule.factors if f in rule.reduction)
    return sdy_sharding_rule(
        rule.text, rule.need_replication, operand_types, result_types, reduction
    )
