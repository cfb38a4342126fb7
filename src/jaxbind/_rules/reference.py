"""Calls computed by an op's JAX reference: the reference row of the lowering.

An op's reference (``reference=``, see jaxbind._references) computes f from JAX arrays.
Every role of the op gets its own function from it, the role table's reference column
(_roles.ReferenceRole): f is the reference; its JVP and VJP are JAX's (``jax.jvp``,
``jax.vjp``); its transposes are ``jax.linear_transpose`` of it. `role_function` makes
them. They serve twice:

- as the body of a role the op declares no rule for (a derived rule): a JAX-function
  body, traced into the program by .jaxfn like any other, so a forward-only op with a
  reference differentiates, transposes and batches to any order;
- in place of a native body, where jaxbind._where.runs says so (a platform the op has
  no body for, the op's ``prefer_reference=``, the `use_reference` switch): the lowering
  takes the target table's reference row, and .jaxfn inlines the role's function
  (`checked` against the call's declared outputs), batched as the call is; the program
  has no custom call.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from .._compat import ShapedArray, lowering_platforms
from .._errors import about, add_context, words
from .._roles import ReferenceRole, for_call
from .._spec import CallSpec
from .abstract import declared_outputs

__all__ = [
    "checked",
    "named_failures",
    "not_reentered",
    "outputs",
    "platform_of",
    "role_function",
]


def platform_of(ctx) -> str:
    """The platform a lowering rule lowers for: the first of those sharing the rule (they
    all lack a native body when they share the default rule)."""
    return lowering_platforms(ctx)[0]


def checked(spec: CallSpec, fn: Callable, avals_out) -> Callable:
    """`fn`, with its results checked against what the call declares (per batch element:
    the batch levels of the call's outputs are not the reference's)."""
    levels = 0 if spec.batch_axes is None else spec.batch_axes.levels
    out_axes = spec.out_batch_axes

    def core(k, aval):
        shape = list(aval.shape)
        if out_axes is not None:
            for axis in sorted(out_axes[k], reverse=True):
                del shape[axis]
        elif levels:
            shape = shape[levels:]
        return tuple(shape), np.dtype(aval.dtype)

    def run(*args):
        outs = fn(*args)
        want = [core(k, a) for k, a in enumerate(avals_out)]
        got = [(tuple(o.shape), np.dtype(o.dtype)) for o in outs]
        if got != want:
            raise TypeError(_mismatch(spec.binding, spec.entry.role, got, want))
        return outs

    return run


def _mismatch(binding, role, got, want) -> str:
    """The error of a reference whose outputs are not the op's: both lists, and the fix."""
    return (
        f"{about(binding.name, role.text)}: its JAX reference gave {_text(got)} for "
        f"{role.describe()}, but the op declares {_text(want)}: the reference "
        f"({words(binding.options).give_reference()}) must return the op's outputs, in "
        "order, with the declared shapes and dtypes"
    )


def _text(items) -> str:
    return "[" + ", ".join(f"{d.name}{list(s)}" for s, d in items) + "]"


# --- each role from the reference ---------------------------------------------------------


def outputs(result, name: str) -> list:
    """The reference's result as a list of arrays (one array: one output)."""
    if hasattr(result, "shape") and hasattr(result, "dtype"):
        return [result]
    if isinstance(result, (tuple, list)) and all(hasattr(r, "shape") for r in result):
        return list(result)
    raise TypeError(
        f"{about(name)}: its JAX reference returned {type(result).__name__}; it must return "
        "the op's outputs: an array, or a tuple or list of arrays, one per output"
    )


def _inexact(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def role_function(ref: ReferenceRole, spec: CallSpec) -> Callable[..., list]:
    """Role ``ref.role`` of the op of `spec` computed from its reference, as a function of
    one batch element's arguments, laid out as the role takes them (_roles.Args), with the
    call's keyword arguments; it returns the role's outputs."""
    binding = spec.binding
    role, fixed, n = ref.role, binding.options.fixed, spec.n_fixed
    f = _reference(ref, spec)
    if role.base == "f":
        return f
    if role.base == "jvp":
        return _named(lambda *args: _jvp(f, fixed, args[:n], args[n:]), binding, role)
    if role.base == "vjp":
        return _named(lambda *args: _vjp(f, fixed, args[:n], args[n:]), binding, role)
    unbatched = spec.unbatched()

    def shapes(args) -> list:
        avals = [ShapedArray(a.shape, a.dtype) for a in args]
        return [jax.ShapeDtypeStruct(s, d) for s, d, _ in declared_outputs(unbatched, avals)]

    if role.index is None:  # the transpose: fixed arguments, then f's cotangents

        def transpose(*args):
            known, cts = args[:n], args[n:]
            t = jax.linear_transpose(lambda *xs: f(*known, *xs), *shapes(args))
            return list(t(list(cts)))

        return _named(transpose, binding, role)
    i, lead = role.index, spec.n_lead

    def transpose_i(*args):  # f's other arguments, then its cotangents
        rest, cts = args[:lead], args[lead:]
        t = jax.linear_transpose(lambda x: f(*rest[:i], x, *rest[i:]), *shapes(args))
        return list(t(list(cts)))

    return _named(transpose_i, binding, role)


# per stage ("traced", "lowered"): the bindings whose reference this thread traces or
# lowers now (a reference that calls its own op would otherwise do so again, without end)
_active = threading.local()


@contextlib.contextmanager
def not_reentered(binding, role, stage: str) -> Iterator[None]:
    """While the reference of `binding` is `stage` (traced, or lowered: traced, then its
    program lowered, the op's own calls in it included) for `role`: a RecursionError naming
    the op where it is so again inside."""
    active = _active.__dict__.setdefault(stage, [])
    if any(b is binding for b in active):
        raise _reentered(binding, role, stage)
    active.append(binding)
    try:
        yield
    except RecursionError as exc:  # JAX's own guard came first: its cache of output shapes
        if not str(exc).startswith("Recursively calling") or getattr(exc, "_jaxbind_noted", False):
            raise
        raise _reentered(binding, role, stage) from None
    finally:
        active.pop()


def _reentered(binding, role, stage: str) -> BaseException:
    return _noted(
        RecursionError(
            f"{about(binding.name)}: its JAX reference calls the op itself ({stage} for "
            f"{role.describe()}), which would compute it by the same reference again, "
            "without end. A reference computes the op in JAX (jax.numpy, lax, other ops) "
            "without calling it"
        )
    )


def _reference(ref: ReferenceRole, spec: CallSpec) -> Callable[..., list]:
    """The op's reference as a function of f's arguments (one batch element), with the
    call's keyword arguments: its outputs checked against the op's declaration (f's
    abstract function at these arguments) as it is traced, whatever role it serves; any
    failure names the op and the role; a reference that calls its own op is refused."""
    binding, role = spec.binding, ref.role
    flat = for_call(ref.fn, spec.trees)
    kwargs = spec.kwargs.to_dict()
    f_spec = spec.derive("f", binding.options.fixed, None, None)
    f_role = binding.roles["f"].role

    def f(*args):
        with not_reentered(binding, role, "traced"):
            try:
                outs = outputs(flat(*args, **kwargs), binding.name)
            except RecursionError:
                raise  # (not_reentered words it)
            except Exception as exc:
                if not getattr(exc, "_jaxbind_noted", False):
                    add_context(exc, _failed(binding, role))
                raise _noted(exc) from None
        avals = [ShapedArray(np.shape(a), a.dtype) for a in args]
        want = [(tuple(s), _dtype(d)) for s, d, _ in declared_outputs(f_spec, avals)]
        got = [(tuple(o.shape), _dtype(o.dtype)) for o in outs]
        if got != want:
            raise _noted(TypeError(_mismatch(binding, f_role, got, want)))
        return outs

    return f


def _dtype(d) -> np.dtype:
    return np.dtype(jax.dtypes.canonicalize_dtype(d))


def _failed(binding, role) -> str:
    where = "" if role.base == "f" else f", traced for {role.describe()} derived from it"
    return (
        f"{about(binding.name, role.text)}: its JAX reference failed{where}. A reference "
        f"({words(binding.options).give_reference()}) is JAX code that JAX can trace, "
        "differentiate and transpose (jax.numpy, lax; not jax.pure_callback), taking the "
        "op's arrays and keyword arguments and returning its outputs as the op declares them"
    )


def _noted(exc: BaseException) -> BaseException:
    """`exc`, marked as naming the op already (the roles around it add no second note)."""
    exc._jaxbind_noted = True  # type: ignore[attr-defined]
    return exc


def _named(fn: Callable[..., list], binding, role) -> Callable[..., list]:
    """A role's function derived from the reference, whose failures name the op and the
    role (JAX's linear_transpose and vjp fail after the reference has returned)."""

    def run(*args):
        with named_failures(binding, role):
            return fn(*args)

    return run


@contextlib.contextmanager
def named_failures(binding, role) -> Iterator[None]:
    """A failure inside (of the reference, or of JAX on what it traced: a pure_callback
    differentiated or exported) with a note naming the op and the role, once."""
    try:
        yield
    except Exception as exc:
        if not getattr(exc, "_jaxbind_noted", False):
            add_context(exc, _failed(binding, role))
        raise _noted(exc) from None


def _moving(f: Callable, fixed: int, primals) -> tuple[list[int], Callable]:
    """The positions of f's differentiable arguments (after the fixed ones; integer and
    boolean ones have no tangents), and f as a function of those alone."""
    moving = [k for k in range(fixed, len(primals)) if _inexact(primals[k])]

    def along(*xs):
        args = list(primals)
        for k, x in zip(moving, xs):
            args[k] = x
        return f(*args)

    return moving, along


def _jvp(f: Callable, fixed: int, primals, tangents) -> list:
    """Output tangents of f at `primals` along the tangents of its non-fixed arguments;
    integer and boolean arguments and outputs have none (zeros of their dtype out)."""
    moving, along = _moving(f, fixed, primals)
    if not moving:
        outs = f(*primals)
        return [jnp.zeros(o.shape, o.dtype) for o in outs]
    outs, tans = jax.jvp(
        along, tuple(primals[k] for k in moving), tuple(tangents[k - fixed] for k in moving)
    )
    return [t if _inexact(o) else jnp.zeros(o.shape, o.dtype) for o, t in zip(outs, tans)]


def _vjp(f: Callable, fixed: int, primals, cotangents) -> list:
    """Cotangents of f's non-fixed arguments from its outputs' `cotangents`; integer and
    boolean arguments get zeros of their dtype, integer outputs' cotangents are ignored."""
    moving, along = _moving(f, fixed, primals)
    outs, pull = jax.vjp(along, *(primals[k] for k in moving))
    cts = [
        c if _inexact(o) else np.zeros(o.shape, jax.dtypes.float0) for o, c in zip(outs, cotangents)
    ]
    got = dict(zip(moving, pull(cts)))
    return [
        got[k] if k in got else jnp.zeros(primals[k].shape, primals[k].dtype)
        for k in range(fixed, len(primals))
    ]
