"""Lowering of the jaxbind primitive to the trampoline's FFI custom call.

Each call carries the attributes of call format 2 (see _callformat); the CPU and
CUDA targets are registered with XLA at import. Calls of bindings with
input_output_aliases alias those operands and results; calls with side effects
(_effects) are marked has_side_effect, and ordered ones pass JAX's token through
as their first operand and result. Roles computed by JAX functions (_jaxfn) are
inlined instead of becoming a custom call.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _ext
from ._callformat import FORMAT, site_digest
from ._compat import abstract_token, ffi, for_export, mlir, register_batch_partitionable
from ._effects import ORDERED
from ._jaxfn import batched_function
from ._kwargs import is_local, not_data_reason
from ._partitioning import mark_batch_partitionable
from ._spec import CallSpec

__all__ = ["CPU_TARGET", "CUDA_TARGET", "lower_cpu", "lower_cuda", "register_targets"]

CPU_TARGET = "jaxbind_cpu"
CUDA_TARGET = "jaxbind_cuda"

_lower_ffi = {CPU_TARGET: ffi.ffi_lowering(CPU_TARGET), CUDA_TARGET: ffi.ffi_lowering(CUDA_TARGET)}


def lower_cpu(ctx: mlir.LoweringRuleContext, *args, spec: CallSpec):
    return _lower(CPU_TARGET, ctx, *args, spec=spec)


def lower_cuda(ctx: mlir.LoweringRuleContext, *args, spec: CallSpec):
    return _lower(CUDA_TARGET, ctx, *args, spec=spec)


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
                f"stored in the artifact, but {reason}")
    blob = kwargs.blob
    # The program names the binding by string; this keeps the binding (and so
    # its callables) alive for as long as the compiled program exists. Exported
    # programs can have no keep-alives: the loading process keeps its bindings.
    if not exporting:
        ctx.module_context.add_keepalive(binding)
        if is_local(kwargs):  # process-local kwargs live as long as the program
            ctx.module_context.add_keepalive(kwargs)
    effect = binding.effect
    if exporting and effect is not None:
        raise TypeError(
            f"jaxbind: cannot export '{binding.name}': it has side effects "
            f"({'ordered' if effect == 'ordered' else 'has_side_effect=True'}), and jax.export "
            "cannot load programs with effects that are not JAX's own. Export a variant "
            "without has_side_effect/ordered")
    aliases = dict(binding.aliases) if spec.role == "f" else {}
    token = ctx.tokens_in.get(ORDERED) if effect == "ordered" else None
    outer = ctx
    if token is not None:  # the token goes through the call as its first operand and result
        ctx = dataclasses.replace(ctx, avals_in=[abstract_token, *ctx.avals_in],
                                  avals_out=[abstract_token, *ctx.avals_out])
        args = (token, *args)
        aliases = {i + 1: k + 1 for i, k in aliases.items()}
    if aliases or effect is not None:
        lower = ffi.ffi_lowering(target, operand_output_aliases=aliases or None,
                                 has_side_effect=effect is not None)
    else:
        lower = _lower_ffi[target]
    loop, n_fixed = spec.loop, spec.n_fixed
    flags = loop.flags(len(args) - (token is not None))
    results = lower(
        ctx, *args,
        jaxbind_format=np.int32(FORMAT),
        site=np.int64(site_digest(binding.name, spec.role, blob, loop.levels, flags, n_fixed)),
        binding=binding.name,
        role=spec.role,
        kwargs=np.frombuffer(blob, dtype=np.uint8),
        loop_levels=np.int32(loop.levels),
        loop_batched=np.frombuffer(flags, dtype=np.uint8),
        n_fixed=np.int32(n_fixed),
    )
    if token is not None:
        token_out, *results = results
        outer.set_tokens_out(outer.tokens_in.update_tokens(mlir.TokenSet({ORDERED: token_out})))
    elif results:
        mark_batch_partitionable(results[0].owner, spec, [a.ndim for a in ctx.avals_in],
                                 [a.ndim for a in ctx.avals_out])
    return results


def register_targets() -> None:
    """Register jaxbind's FFI targets with XLA (once, at import)."""
    ffi.register_ffi_target(CPU_TARGET, _ext.cpu_handler(), platform="cpu")
    register_batch_partitionable(CPU_TARGET)
    # JAX keeps registrations for a platform whose plugin is not loaded (no GPU)
    # and applies them when the CUDA plugin appears.
    ffi.register_ffi_target(CUDA_TARGET, _ext.cuda_handler(), platform="CUDA")
    register_batch_partitionable(CUDA_TARGET)
