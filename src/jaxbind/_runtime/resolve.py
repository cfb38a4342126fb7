"""A call site's first call: the one crossing from the trampoline into Python.

`resolve_site` gets a call's attributes (by their names in the program) and its
buffers, checks the attributes (see _callformat), finds the binding's body for the
call's role, and returns an ``_ext.Site`` made from a `Resolved` description, with the
call's buffers already accepted. The programs that call a site own it (see
Binding.keep_site); the trampoline holds it weakly, so it goes with them.

A buffer, wherever Python sees one at run time, is ``(address, shape, XLA element
type)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .. import _ext
from .._avals import XLA_ELEMENT_TYPES, check_result
from .._binding import lookup
from .._callformat import CallAttributes, Loop
from .._compat import ShapedArray
from .._errors import words
from .._kernels import Kernel, KernelCall
from .._kwargs import decode_kwargs
from .._roles import Body, Role, for_call

__all__ = ["BufferCheck", "Resolved", "resolve_site"]


def resolve_site(found: dict, ins: tuple, outs: tuple) -> tuple:
    """The ``_ext.Site`` of a call, and what its check says of the call's buffers:
    ``(site, problem or None, kernel address or 0)``."""
    call = CallAttributes.read(found)
    name = call.binding
    binding = lookup(name)
    if binding is None:
        raise LookupError(
            f"no binding named '{name}' is registered in this process. Import or run the "
            "code that creates it (jaxbind.get_linear_call / get_nonlinear_call, or the "
            "linear_op / multilinear_op / nonlinear_op decorator) before "
            "calling the program"
        )
    try:
        role = Role.parse(call.role)
    except LookupError:
        raise LookupError(
            f"binding '{name}' ({binding.kind.value}) has no role {call.role!r}"
        ) from None
    call = call.upgraded(binding.options.vectorized)
    dump = decode_kwargs(call.kwargs)
    structure = decode_kwargs(call.trees) if call.trees else None
    body = for_call(_body(binding, role), structure)
    loop = call.loop
    label = f"'{name}' ({role.describe()})"
    check = BufferCheck(binding, role, dump, loop, call.n_fixed, structure)
    kernel = None
    if isinstance(body, Kernel):  # compiled: called without the GIL (see cpp/site.h)
        where = f"jaxbind: {label}" + (", batched" if loop.levels else "")
        kernel = body.call_for(dump.to_dict(), where)
    elif loop.levels:
        label += ", batched"
    resolved = Resolved(
        binding=name,
        label=label,
        callable=body,
        kwargs_dump=dump,
        levels=loop.levels,
        batched=loop.batched,
        platform_mode=binding.options.platform_mode,
        check=check,
        kernel=kernel,
    )
    site = binding.keep_site(found["site"], _ext.Site(resolved))
    return (site, *resolved.accept(ins, outs))


@dataclass(frozen=True, slots=True, eq=False)
class Resolved:
    """What the resolver found for one call site, as ``_ext.Site`` reads it (by these
    names) and the GPU dispatcher gets it.

    Attributes:
      binding: the binding's name, and `label` the site's, for messages.
      callable: the body the trampoline calls: a Python callable, or a `Kernel`.
      kwargs_dump: the keyword arguments a Python callable gets.
      levels, batched: jaxbind's batch loop (see `Loop`).
      platform_mode: how a GPU call reaches the callable ("device" or "host").
      check: the buffers against the binding's abstract function (`BufferCheck`).
      kernel: what the trampoline reads of a kernel (its keyword arguments, whether it
        takes the whole batch, its address per signature), or None.
    """

    binding: str
    label: str
    callable: Any
    kwargs_dump: Any
    levels: int
    batched: tuple[bool, ...]
    platform_mode: str
    check: BufferCheck
    kernel: KernelCall | None

    def accept(self, ins: tuple, outs: tuple) -> tuple[str | None, int]:
        """``(problem, address)`` for buffers of a signature the site has not seen: what
        the check finds wrong (None if nothing), and a kernel's address for the buffers
        it gets (with jaxbind's loop, one batch element's), or 0."""
        problem = self.check(ins, outs)
        if problem is not None or self.kernel is None:
            return problem, 0
        if self.levels and not self.kernel.batches:
            ins = _elements(ins, self.levels, self.batched)
            outs = _elements(outs, self.levels, None)
        return None, self.kernel.address(ins, outs)


def _elements(buffers: tuple, levels: int, batched) -> tuple:
    """The buffers of one batch element (the leading `levels` axes dropped where batched)."""
    return tuple(
        (address, shape[levels:] if levels and (batched is None or batched[i]) else shape, code)
        for i, (address, shape, code) in enumerate(buffers)
    )


def _body(binding, role: Role):
    """The body the trampoline calls for `role`."""
    fn = binding.body(role)
    if binding.role(role).kind is Body.JAX:
        raise LookupError(
            f"{role.describe()} of '{binding.name}' is a JAX function, "
            "which programs contain inlined; no call of it goes through the trampoline"
        )
    return fn


# 32-bit forms: with jax_enable_x64 off when the program was traced, a declared
# 64-bit dtype became its 32-bit form in the program.
_NARROW = {
    np.dtype(a): np.dtype(b)
    for a, b in (
        (np.int64, np.int32),
        (np.uint64, np.uint32),
        (np.float64, np.float32),
        (np.complex128, np.complex64),
    )
}


class BufferCheck:
    """Checks one site's buffers against the binding's abstract function.

    Called with ``(inputs, outputs)``, each a tuple of ``(address, shape, XLA element
    type)``, for every set of buffer shapes it has not seen at
    this site. Returns None if the program's outputs are what the abstract function
    declares for its inputs, else a message saying what differs. The abstract
    function sees the inputs without jaxbind's batch axes, as at trace time.
    """

    def __init__(self, binding, role: Role, dump, loop: Loop, n_fixed: int | None, trees=None):
        self.binding, self.role, self.dump, self.loop = binding, role, dump, loop
        self.n_fixed, self.trees = n_fixed, trees

    def __call__(self, ins, outs) -> str | None:
        try:
            return self._problem(ins, outs)
        except Exception as exc:  # the abstract function itself failed
            return (
                f"{words(self.binding.options).shapes} fails for the buffers of this call "
                f"({_describe(ins)}): {type(exc).__name__}: {exc}"
            )

    def _avals(self, buffers, what, batched):
        avals = []
        for i, (_, shape, code) in enumerate(_elements(buffers, self.loop.levels, batched)):
            dtype = XLA_ELEMENT_TYPES.get(code)
            if dtype is None:
                raise TypeError(
                    f"{what} {i} has XLA element type {code}, which jaxbind "
                    "cannot pass to Python callables"
                )
            avals.append(ShapedArray(tuple(shape), dtype))
        return avals

    def _problem(self, ins, outs):
        binding, entry = self.binding, self.binding.role(self.role)
        if entry.abstract is None:  # shapes came from the primals at trace time
            return None
        in_avals = self._avals(ins, "input", self.loop.batched)
        out_avals = self._avals(outs, "output", None)
        kwargs = self.dump.to_dict()
        n = self.n_fixed
        if n is None:  # format 1 (the JVP's): primals, then tangents of the non-fixed ones
            n = (len(in_avals) + binding.options.fixed) // 2
        if binding.options.vectorized:
            kwargs.setdefault("batch_axes", None)
        declared = check_result(
            entry.declared(in_avals, kwargs, n, self.trees),
            words(binding.options).shapes,
            kwargs.get("batch_axes") is not None,
        )
        if len(declared) != len(out_avals):
            return (
                f"the program gives it {len(out_avals)} outputs, but "
                f"{words(binding.options).shapes} "
                f"declares {len(declared)} for inputs ({_describe(ins)})"
            )
        # XLA may run this check on a thread where jax_enable_x64 (thread-local under
        # `jax.enable_x64`) is off although the program was traced with it on: then the
        # declared dtypes were canonicalized to 32 bits here, and 64 bits are right too.
        narrowed = jax.dtypes.canonicalize_dtype(np.float64) != np.dtype(np.float64)
        for k, ((shape, dtype, _), got) in enumerate(zip(declared, out_avals)):
            dtype = np.dtype(dtype)
            allowed = {dtype, _NARROW.get(dtype, dtype)}
            if narrowed:
                allowed |= {wide for wide, narrow in _NARROW.items() if narrow == dtype}
            if tuple(shape) != got.shape or got.dtype not in allowed:
                return (
                    f"output {k} is {got.dtype.name}{list(got.shape)} in the program, but "
                    f"{words(binding.options).shapes} declares {dtype.name}{list(shape)} for "
                    "inputs "
                    f"({_describe(ins)})"
                )
        return None


def _describe(buffers) -> str:
    return ", ".join(
        f"{XLA_ELEMENT_TYPES[c].name if c in XLA_ELEMENT_TYPES else c}{list(s)}"
        for _, s, c in buffers
    )
