"""Lowering of every jaxbind primitive to the trampoline's FFI custom call."""

from __future__ import annotations

import numpy as np

from . import _ext
from ._binding import resolve_site, site_digest
from ._compat import ffi, mlir
from ._dtypes import XLA_ELEMENT_TYPES
from ._errors import format_callback_error
from ._spec import CallSpec

__all__ = ["CPU_TARGET", "lower_cpu", "register_targets"]

CPU_TARGET = "jaxbind_cpu"

_lower_ffi_cpu = ffi.ffi_lowering(CPU_TARGET)


def lower_cpu(ctx: mlir.LoweringRuleContext, *args, spec: CallSpec):
    binding = spec.binding
    blob = spec.call_kwargs().blob
    # The program names the binding by string; this keeps the binding (and so
    # its callables) alive for as long as the compiled program exists.
    ctx.module_context.add_keepalive(binding)
    return _lower_ffi_cpu(
        ctx, *args,
        jaxbind_format=np.int32(_ext.call_format),
        site=np.int64(site_digest(binding.name, spec.role, blob)),
        binding=binding.name,
        role=spec.role,
        kwargs=np.frombuffer(blob, dtype=np.uint8),
    )


def register_targets() -> None:
    """Hand the trampoline its tables and register the FFI target with XLA (once, at import)."""
    _ext.init(XLA_ELEMENT_TYPES, resolve_site, format_callback_error)
    ffi.register_ffi_target(CPU_TARGET, _ext.cpu_handler(), platform="cpu")
