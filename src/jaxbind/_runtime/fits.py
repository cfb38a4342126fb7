"""Does this call still fit the op? The one ordered check of a call site against the
binding its program names, run before any body of the site runs.

A program names its binding by string (see _callformat): the binding it finds may be
another definition than the one it was traced with (redefined with ``replace=True``, or
defined differently in the process that loads an exported program). Every call is
checked against the binding it names, in this order; the first step that fails
is the error, and no body runs:

1. `attributes` (the call's attributes alone, once per site): the role is one the
   binding has, with a callable body (see .sites); the definition the program was
   made for is the binding's: every option the lowering baked in (aliases, effects,
   the fixed count, vectorized batching, the state, the API, a CUDA kernel's target, the
   code the program inlined (the op's JAX reference and rules given as JAX functions),
   and the rule a partitioned call was split by; see jaxbind._definition). Programs of call
   formats 1 to 3 carry no such record: for them, the fixed arguments and vectorized
   batching are compared.
2. `buffers` (once per new buffer signature): the number of inputs and outputs is what
   the role takes; their shapes and dtypes are what the binding declares. Roles with an
   abstract function of their own (f, the JVP, and transposes or VJPs given
   ``abstract_T``) are checked with it; the others, whose shapes came from the primals
   at trace time, against f's abstract function (a VJP's cotangents are f's outputs at
   the primals and its outputs are shaped as the primals; a transpose's outputs, taken
   as f's linear arguments, give its cotangents).

Each step returns None when the call fits, else the message of what differs.
"""

from __future__ import annotations

import jax
import numpy as np

from .._avals import XLA_ELEMENT_TYPES, check_result
from .._callformat import CallAttributes
from .._compat import ShapedArray
from .._definition import differences, inlined
from .._errors import about, words
from .._roles import Args, Role, RoleDef

__all__ = ["DefinitionCheck", "describe_buffers", "elements"]

# What a message about a mismatch tells the user to do.
_AGAIN = (
    "The op was defined differently when the program was made (redefined with "
    "replace=True, or defined otherwise in the process that exported it): trace the "
    "program again (a jitted function traces again after jax.clear_caches()) or export "
    "it again with the op as it is now."
)


def elements(buffers: tuple, levels: int, batched) -> tuple:
    """The buffers of one batch element (the leading `levels` axes dropped where batched)."""
    return tuple(
        (address, shape[levels:] if levels and (batched is None or batched[i]) else shape, code)
        for i, (address, shape, code) in enumerate(buffers)
    )


def describe_buffers(buffers) -> str:
    return ", ".join(
        f"{XLA_ELEMENT_TYPES[c].name if c in XLA_ELEMENT_TYPES else c}{list(s)}"
        for _, s, c in buffers
    )


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


class _Mismatch(Exception):
    """One step's finding: the call does not fit (its message says how)."""


class DefinitionCheck:
    """The definition check of one call site (see the module docstring).

    Made from the call's attributes when its site is instantiated, it runs step 1 at once
    (`attributes`); called with ``(inputs, outputs)``, each a tuple of ``(address,
    shape, XLA element type)``, for every buffer signature the site has not seen, it
    runs step 2 and returns None or the message of what differs.
    """

    def __init__(self, binding, role: Role, call: CallAttributes, kwargs, trees=None):
        self.binding, self.role, self.entry = binding, role, binding.role(role)
        self.call, self.loop, self.dump, self.trees = call, call.loop, kwargs, trees
        self.shapes = words(binding.options).shapes

    # --- step 1 ------------------------------------------------------------------------
    def attributes(self) -> str | None:
        """What differs between the call's attributes and the binding, or None."""
        if self.call.format >= 4:  # (CallAttributes.read refuses an empty record)
            kwargs = self.dump.to_dict()
            if self.binding.options.vectorized:
                kwargs.pop("batch_axes", None)
            found = differences(
                self.call.definition,
                self.binding.options,
                self.binding.role(self.role).kind.calls == "kernel",
                kwargs,
                inlined(self.binding),
            )
            return f"{'; '.join(found)}. {_AGAIN}" if found else None
        fixed, n = self.binding.options.fixed, self.call.n_fixed
        traced_fixed = n if self.role.base in ("f", "T") else None
        if traced_fixed is not None and traced_fixed != fixed:
            name = words(self.binding.options).fixed
            return (
                f"the program was traced when the op had {name}={traced_fixed}, but it now has "
                f"{name}={fixed}. {_AGAIN}"
            )
        if self.call.format >= 2:  # format 1 is read with the binding's own setting
            vectorized = self.binding.options.vectorized
            names = self.dump.names()
            traced = "batch_axes" in names and (
                vectorized or isinstance(self.dump.to_dict()["batch_axes"], tuple)
            )
            if traced != vectorized:
                name = words(self.binding.options).vectorized
                return (
                    f"the program was traced when the op had {name}={traced}, but it now has "
                    f"{name}={vectorized}. {_AGAIN}"
                )
        return None

    # --- step 2 ------------------------------------------------------------------------
    def __call__(self, ins, outs) -> str | None:
        try:
            self.buffers(ins, outs)
        except _Mismatch as found:
            return f"{about(self.binding.name, self.role.text)}: {found} {_AGAIN}"
        except Exception as exc:  # the abstract function itself failed
            return (
                f"{self.shapes} fails for the buffers of this call "
                f"({describe_buffers(ins)}): {type(exc).__name__}: {exc}"
            )
        return None

    def buffers(self, ins, outs) -> None:
        """Raise _Mismatch if the buffers are not what the binding declares for them."""
        in_avals = self._avals(ins, "input", self.loop.batched)
        out_avals = self._avals(outs, "output", None)
        kwargs = self.dump.to_dict()
        if self.binding.options.vectorized:
            kwargs.setdefault("batch_axes", None)
        batched = kwargs.get("batch_axes") is not None
        if self.entry.args is Args.VJP:
            n = self._primals(len(in_avals), len(out_avals))
            fixed = self.binding.options.fixed
            self._count(len(out_avals), n - fixed, "outputs (cotangents of the arguments)")
        if self.entry.abstract is not None:
            declared = self._declared(
                self.entry, in_avals, kwargs, self._primals(len(in_avals), len(out_avals))
            )
            return self._compare(declared, out_avals, "output", ins)
        # Shapes that came from the primals: against f's abstract function.
        f = self.binding.role("f")
        if f.abstract is None:
            return
        fixed = self.binding.options.fixed
        args_of = self.entry.args
        if args_of is Args.VJP:
            n = self._primals(len(in_avals), len(out_avals))
            primals, cts = in_avals[:n], in_avals[n:]
            if batched:  # the batch axes of vectorized calls: counts only
                return None
            self._compare(self._declared(f, primals, kwargs, fixed), cts, "cotangent", ins)
            self._like(out_avals, primals[fixed:], "output", "argument", fixed)
        elif args_of is Args.T:
            n = self.call.n_fixed if self.call.n_fixed is not None else fixed
            if len(in_avals) < n:
                raise _Mismatch(
                    f"the program gives it {len(in_avals)} inputs, fewer than the op's "
                    f"{n} fixed arguments."
                )
            if batched:
                return None
            args = in_avals[:n] + out_avals
            self._compare(self._declared(f, args, kwargs, n), in_avals[n:], "cotangent", ins)
        elif args_of is Args.T_I:
            if len(out_avals) != 1:
                raise _Mismatch(
                    f"the program gives it {len(out_avals)} outputs, but a transpose with "
                    "respect to one argument has one."
                )
            if batched:
                return None
            self._transpose_i(in_avals, out_avals[0], kwargs, ins)

    def _transpose_i(self, in_avals, out, kwargs, ins) -> None:
        """T<i>: its inputs are f's other arguments, then f's cotangents. Their split is
        not in the program: the call fits if f's abstract function, given the output as
        argument i, declares the cotangents for some split. (Findings are kept as text:
        an exception kept would keep this frame, and the site Python holds, alive.)"""
        f, i = self.binding.role("f"), self.role.index
        assert i is not None
        first: str | None = None  # a mismatch found, else the first failure
        for m in range(i, len(in_avals)):
            args = in_avals[:i] + [out] + in_avals[i:m]
            try:
                declared = self._declared(f, args, kwargs, self.binding.options.fixed)
                self._compare(declared, in_avals[m:], "cotangent", ins)
                return
            except _Mismatch as exc:
                first = first if first and not first.startswith("no reading") else str(exc)
            except Exception as exc:
                first = first or (
                    f"no reading of its inputs ({describe_buffers(ins)}) as the function's "
                    f"other arguments and its cotangents fits {self.shapes}: "
                    f"{type(exc).__name__}: {exc}."
                )
        raise _Mismatch(
            first
            or f"the program gives it {len(in_avals)} inputs, too few for the other "
            "arguments of the function and its cotangents."
        )

    # --- helpers -----------------------------------------------------------------------
    def _primals(self, n_in: int, n_out: int) -> int:
        """The number of primals of a JVP or VJP call (all arguments of f for the others'
        abstract functions: see RoleDef.declared)."""
        n = self.call.n_fixed
        fixed = self.binding.options.fixed
        if self.entry.args is Args.JVP:
            if n is None:  # format 1: primals, then tangents of the non-fixed ones
                n = (n_in + fixed) // 2
            self._count(n_in, 2 * n - fixed, "inputs (the primals, then their tangents)")
        elif self.entry.args is Args.VJP and n is None:  # format 1: one output per non-fixed
            n = n_out + fixed
        return n if n is not None else fixed

    def _count(self, got: int, want: int, what: str) -> None:
        if got != want:
            fixed = self.binding.options.fixed
            raise _Mismatch(
                f"the program gives it {got} {what}, but the op, with "
                f"{words(self.binding.options).fixed}={fixed}, takes {want} for this call."
            )

    def _avals(self, buffers, what, batched):
        avals = []
        for i, (_, shape, code) in enumerate(elements(buffers, self.loop.levels, batched)):
            dtype = XLA_ELEMENT_TYPES.get(code)
            if dtype is None:
                raise TypeError(
                    f"{what} {i} has XLA element type {code}, which jaxbind "
                    "cannot pass to Python callables"
                )
            avals.append(ShapedArray(tuple(shape), dtype))
        return avals

    def _declared(self, entry: RoleDef, avals, kwargs: dict, n_fixed: int):
        if entry is not self.entry and isinstance(kwargs.get("batch_axes"), tuple):
            kwargs = {**kwargs, "batch_axes": kwargs["batch_axes"][: len(avals)]}
        result = entry.declared(avals, kwargs, n_fixed, self.trees)
        return check_result(result, self.shapes, kwargs.get("batch_axes") is not None)

    def _compare(self, declared, got, what: str, ins) -> None:
        """The program's `got` avals against the declared ``(shape, dtype, _)`` ones."""
        if len(declared) != len(got):
            raise _Mismatch(
                f"the program gives it {len(got)} {what}s, but {self.shapes} declares "
                f"{len(declared)} for inputs ({describe_buffers(ins)})."
            )
        # XLA may run this check on a thread where jax_enable_x64 (thread-local under
        # `jax.enable_x64`) is off although the program was traced with it on: then the
        # declared dtypes were canonicalized to 32 bits here, and 64 bits are right too.
        narrowed = jax.dtypes.canonicalize_dtype(np.float64) != np.dtype(np.float64)
        for k, ((shape, dtype, *_), aval) in enumerate(zip(declared, got)):
            dtype = np.dtype(dtype)
            strict = what == "output" or np.issubdtype(dtype, np.inexact)
            if tuple(shape) != aval.shape or (
                strict and aval.dtype not in _allowed(dtype, narrowed)
            ):
                raise _Mismatch(
                    f"{what} {k} is {aval.dtype.name}{list(aval.shape)} in the program, but "
                    f"{self.shapes} declares {dtype.name}{list(shape)} for inputs "
                    f"({describe_buffers(ins)})."
                )

    def _like(self, got, primals, what: str, of: str, offset: int) -> None:
        """(Co)tangents shaped as the primals they belong to."""
        for k, (aval, primal) in enumerate(zip(got, primals)):
            if aval.shape != primal.shape:
                raise _Mismatch(
                    f"{what} {k} is {aval.dtype.name}{list(aval.shape)} in the program, but "
                    f"it is the cotangent of {of} {offset + k}, which is "
                    f"{primal.dtype.name}{list(primal.shape)}."
                )


def _allowed(dtype: np.dtype, narrowed: bool) -> set:
    allowed = {dtype, _NARROW.get(dtype, dtype)}
    if narrowed:
        allowed |= {wide for wide, narrow in _NARROW.items() if narrow == dtype}
    return allowed
