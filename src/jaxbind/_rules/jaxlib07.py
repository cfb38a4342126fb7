"""jaxlib 0.7 only: the form of a CPU custom call that XLA's CPU compiler accepts.

On jaxlib < 0.8, XLA's CPU compiler aborts the process ("Could not convert JSON
string to proto ... xla.cpu.BackendConfig") when a typed-FFI custom call fed by a
bare concatenate is the root of a computation: it reads the root's
backend_config as its own JSON proto without checking. JAX lowers each primitive
into a function of its own before inlining it, so the lowering cannot see what
feeds the call. There, CPU calls therefore take one of two forms:
- the results as a tuple nested in a one-element tuple, so that the root is a
  get-tuple-element (_lower_nested). A tuple-typed call can carry no sharding
  rule, so this is the form of calls that XLA could not split anyway;
- calls that XLA may split (along a batch, or by a declared rule: see
  .partitioning) keep the plain form and their rule. XLA aborts only on
  concatenates under 256 KiB, so their operands under twice that pass through a
  reduce_precision to their own format (_guard): exact, and fused with a
  concatenate that feeds it, which then is not bare. It is not free (about 1 GB/s
  on XLA's CPU), hence the size bound. A small operand of another dtype (int,
  bool) gives a batch-marked call the nested form (it then runs unsplit). A call
  of a partitioned target (.targets) keeps the plain form even then: a tuple-typed
  call can carry no rule, and XLA's partitioner replaces it by each device's call
  (of the row's per-device target), which is fed by the partitioner's slices of
  the operands, not by the concatenate the guard is for.
Every CPU call of a program that stays in this process goes through
`cpu_root_call_form`; newer jaxlibs always get the plain form.

Everything here is for jaxlib 0.7: dropping it means deleting this module and the one
call of `cpu_root_call_form` in .lowering.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from .._compat import XLA_CPU_ROOT_CALL_ABORTS, hlo, ir, mlir, mlir_internal
from .targets import Target

__all__ = ["cpu_root_call_form"]


def cpu_root_call_form(
    target: Target, ctx, args, *, token, exporting, aliases, has_side_effect, keeps_rule
):
    """The operands of a custom call of `target`'s row, and the lowering it needs (None:
    the plain one); `keeps_rule`: XLA may split the call (a batch marking or a declared
    rule).

    Only on jaxlib < 0.8, for CPU calls of programs that stay in this process: small
    operands guarded, or the nested form (see the module's text). Elsewhere the
    arguments are returned as they are, with None.
    """
    if not (XLA_CPU_ROOT_CALL_ABORTS and target.platform == "cpu" and not exporting):
        return args, None
    if token is None and keeps_rule:
        guarded = _guarded(args, ctx.avals_in)  # keeps the sharding rule
        if guarded is not None:
            return guarded, None
        if target.partitioner:  # keeps its rule (see the module's text)
            return args, None
    return args, functools.partial(_lower_nested, target.name, aliases, has_side_effect)


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
