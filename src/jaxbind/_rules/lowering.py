"""Lowering of the jaxbind primitive to the trampoline's FFI custom call.

Each call carries the attributes of the call format (see _callformat, with the
``definition`` record of _definition) and calls one row of the target table (.targets,
registered with XLA at import), chosen by `lower` with `pick`; every call takes the same
steps, whichever row. Calls of bindings with
input_output_aliases alias those operands and results; calls with side effects
(_rules.effects) are marked has_side_effect, and ordered ones pass JAX's token through
as their first operand and result; in a program partitioned over several devices they
run once, on one device (under Shardy as JAX's host callback: see _hosted). Roles
computed by JAX functions are inlined instead (see .jaxfn).

On jaxlib 0.7, CPU calls may need another form: see .jaxlib07.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import jax
import numpy as np

from .._callformat import CallAttributes
from .._compat import (
    abstract_token,
    auto_partitioned_devices,
    config_use_shardy,
    emit_host_callback,
    ffi,
    for_export,
    mlir,
    run_once_sharding,
    set_sharding,
)
from .._definition import inlined, record
from .._errors import ExportedDefaultNameWarning
from .._kwargs import data_blob, is_local, localized, not_data_reason
from .._primitive import eager
from .._references import mode
from .._roles import Body
from .._spec import CallSpec
from .._where import runs
from .effects import ORDERED
from .jaxfn import lower_by_reference
from .jaxlib07 import cpu_root_call_form
from .partitioning import (
    NOT_MARKED,
    RuleMark,
    mark_batch_partitionable,
    num_batch_dims,
    rule_mark,
    to_sdy,
)
from .targets import TARGETS, Target, pick, row

__all__ = ["CPU_TARGET", "CUDA_KERNEL_TARGET", "CUDA_TARGET", "lower"]

# The plain rows' names (tests and tools call them directly)
CPU_TARGET = pick("cpu", Body.CALLABLE, effect=False, partitioned=False).name
CUDA_TARGET = pick("cuda", Body.CALLABLE, effect=False, partitioned=False).name
CUDA_KERNEL_TARGET = pick("cuda", Body.CUDA_KERNEL, effect=False, partitioned=False).name
# Keyword arguments whose encoding is larger than this are not copied into programs
# that stay in this process: the program names them by digest (exports carry them).
_EMBED_LIMIT = 16 * 1024

# The plain lowering of each target (one per name: a name's rows share its attributes)
_lower_ffi = {t.name: ffi.ffi_lowering(t.name) for t in TARGETS if t.custom_call}


def _suffix_warning(name: str) -> str:
    base = name.rsplit("#", 1)[0]
    return (
        f"jaxbind: exporting '{name}', a default name: several different bindings were "
        f"made from callables named '{base}' (closures, for example), and the suffix "
        "counts them in the order they were made. A process that loads this program "
        f"binds it to whichever binding it made as '{name}', which need not be the same "
        "one. Give each binding its own name (name=...) when it is meant to be exported"
    )


def lower(platform: str, ctx: mlir.LoweringRuleContext, *args, spec: CallSpec):
    """A call of a role whose body is a callable or a kernel, lowered for `platform`, by
    what jaxbind._where.runs says computes it: the target table's reference row (the op's
    JAX reference inlined, by .jaxfn), JAX's host callback (`_hosted`), or the
    trampoline's custom call, by one path: the call's attributes, its operands in the
    form the row's platform needs (.jaxlib07), the custom call, then what its row and
    marking add (the rule, the batch marking, the run-once sharding of effects, the
    token)."""
    binding = spec.binding
    binding.body(spec.role)  # a role the op was given no body for: say so now, not when run
    effect = None if spec.hosted else binding.options.effect
    spread = effect is not None and config_use_shardy() and auto_partitioned_devices(ctx) > 1
    where = runs(binding, spec.role, platform, switch=mode(), spread=spread, hosted=spec.hosted)
    where.refusal()
    if where.row == "reference":  # the REFERENCE row
        return lower_by_reference(ctx, *args, spec=spec)
    exporting = for_export(ctx)
    if exporting and binding.default_name and "#" in binding.name:
        warnings.warn(_suffix_warning(binding.name), ExportedDefaultNameWarning, stacklevel=2)
    blob = _embedded(ctx, spec.call_kwargs(), exporting, binding.name, "its keyword arguments")
    trees = b""
    if spec.trees is not None:
        trees = _embedded(ctx, spec.trees, exporting, binding.name, "its pytree structure")
    # The program names the binding by string; this keeps the binding (and so
    # its callables) alive for as long as the compiled program exists. Exported
    # programs can have no keep-alives: the loading process keeps its bindings.
    if not exporting:
        ctx.module_context.add_keepalive(binding)
    if exporting and effect is not None:
        raise TypeError(
            f"jaxbind: cannot export '{binding.name}': it has side effects "
            f"({'ordered' if effect == 'ordered' else 'has_side_effect=True'}), and jax.export "
            "cannot load programs with effects that are not JAX's own. Export a variant "
            "without has_side_effect/ordered"
        )
    if where.row == "hosted":
        return _hosted(ctx, args, spec)
    aliases = dict(binding.options.aliases) if spec.role == "f" else {}
    token = ctx.tokens_in.get(ORDERED) if effect == "ordered" else None
    outer = ctx
    if token is not None:  # the token goes through the call as its first operand and result
        ctx = dataclasses.replace(
            ctx,
            avals_in=[abstract_token, *ctx.avals_in],
            avals_out=[abstract_token, *ctx.avals_out],
        )
        args = (token, *args)
        aliases = {i + 1: k + 1 for i, k in aliases.items()}
    # effects and aliases refuse a rule, and calls with effects are never split
    mark = rule_mark(ctx, spec, len(ctx.avals_out)) if effect is None else NOT_MARKED
    target = pick(platform, where.kind, effect=effect is not None, partitioned=bool(mark.rule))
    args, nested = cpu_root_call_form(
        target,
        ctx,
        args,
        token=token,
        exporting=exporting,
        aliases=aliases,
        has_side_effect=effect is not None,
        keeps_rule=bool(mark.rule) or num_batch_dims(spec, len(ctx.avals_out)) > 0,
    )
    if nested is not None:  # jaxlib 0.7's form: a tuple-typed call carries no marking
        assert not target.partitioner, target
        mark = NOT_MARKED
    call = CallAttributes.of_call(
        binding.name,
        spec.role,
        blob,
        spec.loop,
        len(args) - (token is not None),
        spec.n_fixed,
        trees,
        definition=_definition(spec, mark, where.kind.calls == "kernel"),
    )
    attributes = call.ffi_attributes()
    if mark.rule is not None:
        attributes["partitioning"] = _partitioning(mark, target)
    if nested is not None:
        lower = nested
    elif aliases or effect is not None:
        lower = ffi.ffi_lowering(
            target.name, operand_output_aliases=aliases or None, has_side_effect=effect is not None
        )
    else:
        lower = _lower_ffi[target.name]
    if not exporting:  # the program owns the site it will make (see _sites)
        ctx.module_context.add_keepalive(binding.sites.holder(call.digest))
    results = lower(ctx, *args, **attributes)
    if effect is not None and results and auto_partitioned_devices(outer) > 1:
        # Runs once, on one device, as io_callback does: never split over a batch that
        # XLA partitions (padding rows would reach the callable), never replicated.
        sharding = run_once_sharding(outer, ctx.avals_out)
        if sharding is not None:
            op = results[0].owner
            for _ in range(2):  # nested results: get_tuple_element of get_tuple_element
                if op.name == "stablehlo.custom_call":
                    break
                op = op.operands[0].owner
            set_sharding(outer, op, sharding)
    if token is not None:
        token_out, *results = results
        outer.set_tokens_out(outer.tokens_in.update_tokens(mlir.TokenSet({ORDERED: token_out})))
    elif results and mark.partitioned is not None and config_use_shardy():
        results[0].owner.attributes["sdy.sharding_rule"] = to_sdy(
            mark.partitioned, [a.type for a in args], [r.type for r in results]
        )
    elif results and nested is None:  # a tuple-typed call has no rule
        mark_batch_partitionable(
            results[0].owner,
            mark.batch_dims,
            [a.ndim for a in ctx.avals_in],
            [a.ndim for a in ctx.avals_out],
        )
    return results


def _definition(spec: CallSpec, mark: RuleMark, cuda_kernel: bool) -> str:
    """The call's ``definition`` attribute (see jaxbind._definition): the op's options
    the program bakes in, and the rule of a call partitioned by it (with the shapes of
    f's arguments it was worked out for)."""
    binding = spec.binding
    if mark.rule is None:
        return record(binding.options, cuda_kernel, inlined=inlined(binding))
    declared = mark.rule.declared
    return record(
        binding.options,
        cuda_kernel,
        declared.record(),
        mark.rule.shapes,
        inlined=inlined(binding),
    )


def _partitioning(mark: RuleMark, target: Target) -> str:
    """The ``partitioning`` attribute of a call of a partitioned row, which its
    partitioner (.spmd) reads with the call's own attributes (the same as any call's: so
    that the row's handlers run it whole where no partitioner splits it, a program
    compiled for one device): the rule, the platform, and the target of each device's
    part of the call (the row's per_device; a CUDA kernel's keeps command buffers)."""
    assert mark.partitioned is not None
    per_device = row(target.per_device, target.platform).name
    config = {"rule": mark.partitioned.to_config(), "platform": target.platform}
    config["target"] = per_device
    return json.dumps(config, sort_keys=True)


# Programs for the calls that host callbacks run (see _hosted), one per call.
HOSTED_CALLS: dict = {}


def _hosted(ctx: mlir.LoweringRuleContext, args, spec: CallSpec):
    """An effectful call in a program that Shardy partitions over several devices.

    Such a call must run once, on one device, over the whole logical arrays: never on
    every device, never on a shard or on padding rows of a batch. Shardy keeps a custom
    call on one device only if it is JAX's own host callback (XLA's import keeps the
    shardings of that target and drops those of others), so the call lowers to that
    callback, placed as io_callback places its own, with the ordered token passed through
    it. The callback runs the call itself, without the effect the callback already
    carries, as a one-device program on the host: the same trampoline, kernels and batch
    loop as any other call, so under vmap the body runs once per real batch element.
    """
    binding = spec.binding  # (on the CPU: jaxbind._where.runs refuses other platforms)
    program = eager(HOSTED_CALLS, dataclasses.replace(spec, hosted=True))
    host = jax.devices("cpu")[0]

    def run(*arrays):
        return tuple(np.asarray(out) for out in program(*jax.device_put(arrays, host)))

    run.__name__ = run.__qualname__ = binding.name
    ctx.module_context.add_keepalive(binding)
    token = ctx.tokens_in.get(ORDERED) if binding.options.effect == "ordered" else None
    sharding = run_once_sharding(ctx, ctx.avals_out)
    results, token_out = emit_host_callback(ctx, run, token, args, sharding)
    if token is not None:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({ORDERED: token_out})))
    return results


def _embedded(ctx, dump, exporting: bool, name: str, what: str) -> bytes:
    """What a program carries for an encoded dump (keyword arguments, pytree structure).

    An export carries the data itself, so the dump must be plain data. A program that
    stays in this process carries a digest instead where the data is large or not data
    (the process keeps it, for as long as the program lives).
    """
    if exporting:
        reason = not_data_reason(dump)
        if reason is not None:
            raise TypeError(
                f"jaxbind: cannot export '{name}': {what} must be plain data (numbers, "
                "strings, bytes, bools, None, NumPy scalars and arrays, tuples, lists, sets, "
                f"dicts) to be stored in the artifact, but {reason}. Pass data instead (an "
                "enum's value, an object's settings), or call it under jax.jit in this "
                "process, which holds such values"
            )
        return data_blob(dump)
    if not is_local(dump) and len(dump.blob) > _EMBED_LIMIT:
        dump = localized(dump)  # a digest in the program, the data in this process
    if is_local(dump):  # process-local data lives as long as the program
        ctx.module_context.add_keepalive(dump)
    return dump.blob
