"""Lowering of the jaxbind primitive to the trampoline's FFI custom call.

Each call carries the attributes of call format 2 (see _callformat); the CPU and
CUDA targets are registered with XLA at import. Calls of bindings with
input_output_aliases alias those operands and results; calls with side effects
(_effects) are marked has_side_effect, and ordered ones pass JAX's token through
as their first operand and result. Roles computed by JAX functions (_jaxfn) are
inlined instead of becoming a custom call.

On jaxlib < 0.8, XLA's CPU compiler aborts the process ("Could not convert JSON
string to proto ... xla.cpu.BackendConfig") when a typed-FFI custom call fed by a
bare concatenate is the root of a computation: it reads the root's
backend_config as its own JSON proto without checking. JAX lowers each primitive
into a function of its own before inlining it, so the lowering cannot see what
feeds the call. There, CPU calls therefore take one of two forms:
- the results as a tuple nested in a one-element tuple, so that the root is a
  get-tuple-element (_lower_nested). A tuple-typed call can carry no sharding
  rule, so this is the form of calls that XLA could not split anyway;
- calls that XLA may split along a batch (see _partitioning) keep the plain form
  and their rule. XLA aborts only on concatenates under 256 KiB, so their
  operands under twice that pass through a reduce_precision to their own format
  (_guard): exact, and fused with a concatenate that feeds it, which then is not
  bare. It is not free (about 1 GB/s on XLA's CPU), hence the size bound. A
  small operand of another dtype (int, bool) gives the call the nested form.
Newer jaxlibs always get the plain form.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax.numpy as jnp
import numpy as np

from . import _ext
from ._callformat import FORMAT, site_digest
from ._compat import (
    XLA_CPU_ROOT_CALL_ABORTS,
    abstract_token,
    auto_partitioned_devices,
    config_use_shardy,
    ffi,
    for_export,
    hlo,
    ir,
    mlir,
    mlir_internal,
    register_batch_partitionable,
    run_once_sharding,
    set_sharding,
)
from ._effects import ORDERED
from ._errors import ExportedDefaultNameWarning, about
from ._jaxfn import batched_function
from ._kwargs import data_blob, is_local, localized, not_data_reason
from ._partitioning import mark_batch_partitionable, num_batch_dims
from ._spec import CallSpec

__all__ = ["CPU_TARGET", "CUDA_TARGET", "lower_cpu", "lower_cuda", "register_targets"]

CPU_TARGET = "jaxbind_cpu"
CUDA_TARGET = "jaxbind_cuda"
# Calls with side effects use the same handlers under names that are not batch
# partitionable: XLA runs them once, on one device (see _lower), never per shard.
EFFECT_TARGETS = {CPU_TARGET: "jaxbind_cpu_effect", CUDA_TARGET: "jaxbind_cuda_effect"}
# Keyword arguments whose encoding is larger than this are not copied into programs
# that stay in this process: the program names them by digest (exports carry them).
_EMBED_LIMIT = 16 * 1024

_lower_ffi = {CPU_TARGET: ffi.ffi_lowering(CPU_TARGET), CUDA_TARGET: ffi.ffi_lowering(CUDA_TARGET)}


def lower_cpu(ctx: mlir.LoweringRuleContext, *args, spec: CallSpec):
    return _lower(CPU_TARGET, ctx, *args, spec=spec)


def lower_cuda(ctx: mlir.LoweringRuleContext, *args, spec: CallSpec):
    return _lower(CUDA_TARGET, ctx, *args, spec=spec)


def _suffix_warning(name: str) -> str:
    base = name.rsplit("#", 1)[0]
    return (
        f"jaxbind: exporting '{name}', a default name: several different bindings were "
        f"made from callables named '{base}' (closures, for example), and the suffix "
        "counts them in the order they were made. A process that loads this program "
        f"binds it to whichever binding it made as '{name}', which need not be the same "
        "one. Give each binding its own name (name=...) when it is meant to be exported"
    )


def _lower(target: str, ctx: mlir.LoweringRuleContext, *args, spec: CallSpec):
    binding = spec.binding
    if binding.jax_function_for(spec.role) is not None:  # JAX code: inlined, no custom call
        return mlir.lower_fun(batched_function(spec), multiple_results=True)(ctx, *args)
    kwargs = spec.call_kwargs()
    exporting = for_export(ctx)
    if exporting:
        reason = not_data_reason(kwargs)
        if reason is not None:
            raise TypeError(
                f"jaxbind: cannot export '{binding.name}': its keyword arguments must be plain "
                f"data (numbers, strings, bools, None, tuples, lists, dicts, NumPy arrays) to be "
                f"stored in the artifact, but {reason}"
            )
        if binding.default_name and "#" in binding.name:
            warnings.warn(_suffix_warning(binding.name), ExportedDefaultNameWarning, stacklevel=2)
    blob = data_blob(kwargs) if exporting else kwargs.blob
    # The program names the binding by string; this keeps the binding (and so
    # its callables) alive for as long as the compiled program exists. Exported
    # programs can have no keep-alives: the loading process keeps its bindings.
    if not exporting:
        ctx.module_context.add_keepalive(binding)
        if not is_local(kwargs) and len(kwargs.blob) > _EMBED_LIMIT:
            kwargs = localized(kwargs)  # a digest in the program, the data in this process
            blob = kwargs.blob
        if is_local(kwargs):  # process-local kwargs live as long as the program
            ctx.module_context.add_keepalive(kwargs)
    effect = binding.options.effect
    if exporting and effect is not None:
        raise TypeError(
            f"jaxbind: cannot export '{binding.name}': it has side effects "
            f"({'ordered' if effect == 'ordered' else 'has_side_effect=True'}), and jax.export "
            "cannot load programs with effects that are not JAX's own. Export a variant "
            "without has_side_effect/ordered"
        )
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
    loop, n_fixed = spec.loop, spec.n_fixed
    flags = loop.flags(len(args) - (token is not None))
    nested = False
    if XLA_CPU_ROOT_CALL_ABORTS and target == CPU_TARGET and not exporting:
        guarded = None
        if token is None and num_batch_dims(spec, len(ctx.avals_out)) > 0:
            guarded = _guarded(args, ctx.avals_in)  # keeps the sharding rule
        nested = guarded is None
        args = args if nested else guarded
    if effect is not None:
        target = EFFECT_TARGETS[target]
        devices = auto_partitioned_devices(ctx)
        if devices > 1 and config_use_shardy():
            raise TypeError(
                f"{about(binding.name)} has side effects "
                f"({'ordered=True' if effect == 'ordered' else 'has_side_effect=True'}) and is "
                f"called in a program that XLA partitions over {devices} devices. Under Shardy "
                "(JAX's default partitioner) XLA cannot run a custom call with side effects "
                "once, on one device; on every device its effects would repeat (and run on "
                "padding). Call it inside jax.shard_map (once per shard), outside the sharded "
                "program, or with jax_use_shardy_partitioner=False (then once, on device 0)"
            )
    if nested:
        lower = functools.partial(_lower_nested, target, aliases, effect is not None)
    elif aliases or effect is not None:
        lower = ffi.ffi_lowering(
            target, operand_output_aliases=aliases or None, has_side_effect=effect is not None
        )
    else:
        lower = _lower_ffi[target]
    digest = site_digest(binding.name, spec.role, blob, loop.levels, flags, n_fixed)
    if not exporting:  # the program owns the site it will resolve (see Binding.keep_site)
        ctx.module_context.add_keepalive(binding.holder(digest))
    results = lower(
        ctx,
        *args,
        jaxbind_format=np.int32(FORMAT),
        site=np.int64(digest),
        binding=binding.name,
        role=spec.role,
        kwargs=np.frombuffer(blob, dtype=np.uint8),
        loop_levels=np.int32(loop.levels),
        loop_batched=np.frombuffer(flags, dtype=np.uint8),
        n_fixed=np.int32(n_fixed),
    )
    if effect is not None and results and auto_partitioned_devices(outer) > 1:
        # Runs once, on one device, as io_callback does: never split over a batch that
        # XLA partitions (padding rows would reach the callable), never replicated.
        sharding = run_once_sharding(outer, ctx.avals_out)
        if sharding is not None:
            call = results[0].owner
            for _ in range(2):  # nested results: get_tuple_element of get_tuple_element
                if call.name == "stablehlo.custom_call":
                    break
                call = call.operands[0].owner
            set_sharding(outer, call, sharding)
    if token is not None:
        token_out, *results = results
        outer.set_tokens_out(outer.tokens_in.update_tokens(mlir.TokenSet({ORDERED: token_out})))
    elif results and not nested and effect is None:  # a tuple-typed call has no rule
        mark_batch_partitionable(
            results[0].owner, spec, [a.ndim for a in ctx.avals_in], [a.ndim for a in ctx.avals_out]
        )
    return results


def _lower_nested(
    target: str,
    aliases: dict[int, int],
    has_side_effect: bool,
    ctx: mlir.LoweringRuleContext,
    *args,
    **attributes,
) -> list:
    """The custom call with its results as ((r0, r1, ...),), unpacked by get-tuple-element.

    XLA's tuple simplifier folds tuple(gte(c, 0), gte(c, 1)) back into c, but not
    gte(c, 0) of a nested tuple, so the call itself is never the root. The FFI
    handler sees the same flat list of result buffers. Without layout attributes
    (a tuple result cannot carry them) XLA gives custom calls row-major layouts.
    """
    types = [mlir_internal.aval_to_ir_type(a) for a in ctx.avals_out]
    inner = ir.TupleType.get_tuple(types)
    call = mlir_internal.custom_call(
        target,
        result_types=[ir.TupleType.get_tuple([inner])],
        operands=list(args),
        backend_config={k: mlir_internal.ir_attribute(v) for k, v in attributes.items()},
        api_version=4,
        has_side_effect=has_side_effect,
    )
    if aliases:
        call.attributes["output_operand_aliases"] = ir.ArrayAttr.get(
            [
                hlo.OutputOperandAlias.get(
                    output_tuple_indices=[0, k], operand_index=i, operand_tuple_indices=[]
                )
                for i, k in aliases.items()
            ]
        )
    packed = hlo.get_tuple_element(call.result, mlir_internal.i32_attr(0))
    return [hlo.get_tuple_element(packed, mlir_internal.i32_attr(k)) for k in range(len(types))]


# XLA (jaxlib 0.7) aborts only for concatenates of fewer bytes: measured the same
# for 1-D, 2-D and 3-D ones along every axis, in float32, float64 and complex64.
# Operands below twice that are guarded.
_ABORTS_BELOW_BYTES = 256 * 1024


_GUARDABLE = {np.dtype(t) for t in ("float16", "float32", "float64", "complex64", "complex128")}
_GUARDABLE.add(np.dtype(jnp.bfloat16))


def _guarded(args, avals) -> tuple | None:
    """`args` with the small ones guarded; None if a small one cannot be."""
    small = [aval.size * np.dtype(aval.dtype).itemsize < 2 * _ABORTS_BELOW_BYTES for aval in avals]
    if any(s and np.dtype(aval.dtype) not in _GUARDABLE for aval, s in zip(avals, small)):
        return None
    return tuple(_guard(a, aval) if s else a for a, aval, s in zip(args, avals, small))


def _guard(value: ir.Value, aval) -> ir.Value:
    """`value` through reduce_precision to its own format: exact, never removed by
    XLA, and fused with a concatenate that produces it, which then is not bare."""
    if np.issubdtype(aval.dtype, np.complexfloating):
        part = jnp.finfo(aval.dtype)
        return hlo.complex(_reduce(hlo.real(value), part), _reduce(hlo.imag(value), part))
    return _reduce(value, jnp.finfo(aval.dtype))


def _reduce(value: ir.Value, finfo) -> ir.Value:
    return hlo.reduce_precision(
        value,
        exponent_bits=mlir_internal.i32_attr(finfo.nexp),
        mantissa_bits=mlir_internal.i32_attr(finfo.nmant),
    )


def register_targets() -> None:
    """Register jaxbind's FFI targets with XLA (once, at import)."""
    ffi.register_ffi_target(CPU_TARGET, _ext.cpu_handler(), platform="cpu")
    register_batch_partitionable(CPU_TARGET)
    # JAX keeps registrations for a platform whose plugin is not loaded (no GPU)
    # and applies them when the CUDA plugin appears.
    ffi.register_ffi_target(CUDA_TARGET, _ext.cuda_handler(), platform="CUDA")
    register_batch_partitionable(CUDA_TARGET)
    ffi.register_ffi_target(EFFECT_TARGETS[CPU_TARGET], _ext.cpu_handler(), platform="cpu")
    ffi.register_ffi_target(EFFECT_TARGETS[CUDA_TARGET], _ext.cuda_handler(), platform="CUDA")
