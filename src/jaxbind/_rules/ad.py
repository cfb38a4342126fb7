"""Differentiation rules of the jaxbind primitive.

Derivatives bind the primitive again in another role (see _binding), so the
rules apply again to what they produce: linear ops differentiate to any order,
multilinear ops as far as their transposes allow. Nonlinear ops differentiate to
first order with callables as derivatives, and further when their JVP and VJP
are JAX functions (.jaxfn): the derivative of such a role with respect to its
primal arguments is the JAX function's own JVP.
"""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
from jax.numpy import moveaxis

from .._compat import ad, aval_of, instantiate_zeros, is_undefined_primal, zero_tangent
from .._errors import about, words
from .._primitive import PRIMITIVE, bind
from .._roles import Kind, describe_role
from .._spec import BatchAxes, CallSpec
from .jaxfn import batched_function
from .reference import role_function

__all__ = ["jvp_rule", "transpose_rule"]


def _cat(*parts):
    """Concatenate batch layouts; None when not batched."""
    if any(p is None for p in parts):
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out + p
    return out


def _bind_transposed(args, spec: CallSpec):
    """Bind a transposed role; when batched, with every batch axis moved to the front.

    A transpose must return cotangents laid out like the primal inputs, but a
    callable only learns the batch axes of its own inputs. So jaxbind hands a
    batched transpose its inputs with the batch levels first (outermost at axis
    0), expects its outputs the same way, and moves the axes back afterwards.
    """
    ins, outs = spec.batch_axes, spec.out_batch_axes
    if ins is None or outs is None:  # unbatched (a batched call has both)
        return bind(spec, *args)
    fspec = replace(
        spec.derive(spec.role, spec.n_fixed, ins.front(), outs.front(), spec.n_lead),
        out_hint=spec.out_hint,
    )
    return outs.from_front(bind(fspec, *ins.to_front(args, moveaxis)), moveaxis)


def _hinted(t_spec: CallSpec, targets, target_axes) -> CallSpec:
    """`t_spec` with the core shapes of the cotangents it produces, if its role has no
    abstract function: they are shaped as the primals `targets`."""
    if t_spec.entry.abstract is not None:
        return t_spec
    hint = tuple(
        (
            a.aval.shape if target_axes is None else target_axes.core_shape(a.aval.shape, k),
            a.aval.dtype,
        )
        for k, a in enumerate(targets)
    )
    return replace(t_spec, out_hint=hint)


def _checked(spec: CallSpec, results, args):
    """Cotangents for the undefined primals among `args`, None for the others."""
    if len(results) != len(args):
        raise TypeError(
            f"jaxbind: the transpose of '{spec.name}' ({describe_role(spec.role)}) produced "
            f"{len(results)} cotangents for {len(args)} inputs; "
            f"{words(spec.binding.options).shapes} of the transpose must give one output "
            "per input after the fixed ones, in order"
        )
    out: list = []
    for r, a in zip(results, args):
        if not is_undefined_primal(a):
            out.append(None)
            continue
        if r.shape != a.aval.shape or r.dtype != a.aval.dtype:
            raise TypeError(
                f"jaxbind: the transpose of '{spec.name}' ({describe_role(spec.role)}) produced a "
                f"cotangent {r.dtype}{list(r.shape)} for an input {a.aval.str_short()}; "
                f"{words(spec.binding.options).shapes} of the transpose must give each output "
                "the shape and dtype of the corresponding input (batch axes first when "
                "vectorized)"
            )
        out.append(r)
    return out


def _fixed_error(spec: CallSpec, index: int, action: str) -> Exception:
    binding = spec.binding
    if binding.kind is Kind.NONLINEAR and spec.role != "f" and index >= binding.options.fixed:
        if action == "transposed":
            return TypeError(
                f"jaxbind: {describe_role(spec.role)} of '{binding.name}' is linear in its "
                f"tangents or cotangents only; it cannot be transposed with respect to the "
                f"primal input {index}"
            )
        order = binding.order()
        return NotImplementedError(
            f"{about(binding.name)} is a nonlinear op differentiable to order {order} "
            f"only; a derivative of order {order + 1} needs {describe_role(spec.role)} of "
            f"'{binding.name}' differentiated with respect to its primal input {index}. To "
            f"differentiate further, {words(binding.options).differentiable_derivatives()}; "
            f"or give the op a JAX reference ({words(binding.options).give_reference()}), "
            "from which the higher orders are derived; or write the function in JAX"
        )
    return TypeError(
        f"{about(binding.name)} argument {index} is fixed ({words(binding.options).fixed}="
        f"{binding.options.fixed}) and cannot be {action}; move it after the fixed "
        "arguments or use jax.custom_jvp"
    )


def _differentiable_primal(spec: CallSpec, index: int) -> bool:
    """Whether a primal argument of a JVP or VJP role can be differentiated (second order):
    where JAX sees the role's computation, or the op's reference can derive it."""
    entry = spec.entry
    return index >= spec.binding.options.fixed and (
        entry.kind.traced or entry.reference is not None
    )


def _jvp_in_primals(spec: CallSpec, primals, tangents, which):
    """Derivative of a JVP/VJP role along the primals' tangents: JAX's, of the role's JAX
    function, or of the role derived from the op's reference where its body is not JAX
    code (a callable: it computes the first order, the reference every order above)."""
    entry = spec.entry
    if entry.kind.traced:
        fn = batched_function(spec)
    else:
        assert entry.reference is not None
        fn = batched_function(spec, role_function(entry.reference, spec))

    def along(*values):
        args = list(primals)
        for i, v in zip(which, values):
            args[i] = v
        return fn(*args)

    _, tans = jax.jvp(
        along,
        tuple(primals[i] for i in which),
        tuple(instantiate_zeros(tangents[i]) for i in which),
    )
    return list(tans)


def _has_tangent(primal) -> bool:
    """Whether an array has tangents: integer and boolean arrays have float0 tangents,
    which are always zero."""
    return jnp.issubdtype(primal.dtype, jnp.inexact)


def _tangent_arg(primal, tangent):
    """A tangent as a role's callable receives it: integer and boolean inputs get zeros of
    their own dtype in place of float0, which no callable can read."""
    if _has_tangent(primal):
        return instantiate_zeros(tangent)
    return jnp.zeros(jnp.shape(primal), primal.dtype)


def _output_tangents(outs, tans):
    """Tangents of the outputs: float0 zeros (symbolic) for integer and boolean outputs."""
    return [t if _has_tangent(o) else zero_tangent(o) for o, t in zip(outs, tans)]


def _is_float0(ct) -> bool:
    aval = ct.aval if type(ct) is ad.Zero else ct
    return aval.dtype == jax.dtypes.float0


def _cotangent_args(cts, args, spec: CallSpec) -> list:
    """Cotangents as a role's callable receives them: those of integer and boolean outputs
    (float0 in JAX, always zero) as zeros of the output's own dtype, as tangents of such
    inputs are given (_tangent_arg)."""
    if not any(_is_float0(c) for c in cts):
        return [instantiate_zeros(c) for c in cts]
    avals = [a.aval if is_undefined_primal(a) else aval_of(a) for a in args]
    outs, _ = PRIMITIVE.abstract_eval(*avals, spec=spec)
    return [
        jnp.zeros(o.shape, o.dtype) if _is_float0(c) else instantiate_zeros(c)
        for o, c in zip(outs, cts)
    ]


def jvp_rule(primals, tangents, *, spec: CallSpec):
    n = spec.n_fixed
    in_primals = []  # second order: tangents of a JVP's or VJP's primal arguments
    for i in range(n):  # float0 tangents of integer arguments are zero, fixed or not
        if type(tangents[i]) is not ad.Zero and _has_tangent(primals[i]):
            if not _differentiable_primal(spec, i):
                raise _fixed_error(spec, i, "differentiated")
            in_primals.append(i)
    outs = bind(spec, *primals)
    live = [
        i
        for i in range(n, len(primals))
        if type(tangents[i]) is not ad.Zero and _has_tangent(primals[i])
    ]
    if not live and not in_primals:
        return outs, [zero_tangent(o) for o in outs]

    tans = None
    if not live:
        pass
    elif spec.entry.jointly_linear:
        tans = bind(spec, *primals[:n], *map(_tangent_arg, primals[n:], tangents[n:]))
    elif spec.binding.kind is Kind.NONLINEAR:  # role "f"
        ba = spec.batch_axes
        jvp_spec = spec.derive("jvp", len(primals), _cat(ba, ba and ba[n:]), spec.out_batch_axes)
        tans = bind(jvp_spec, *primals, *map(_tangent_arg, primals[n:], tangents[n:]))
    else:  # multilinear: product rule, one term per argument with a tangent
        for i in live:
            term = bind(spec, *primals[:i], tangents[i], *primals[i + 1 :])
            tans = term if tans is None else _summed(outs, tans, term)
    if in_primals:
        more = _jvp_in_primals(spec, primals, tangents, in_primals)
        tans = more if tans is None else _summed(outs, tans, more)
    return outs, _output_tangents(outs, tans)


def _summed(outs, a, b):
    """Two terms of the outputs' tangents added; an integer or boolean output's tangent is
    float0 (its terms: zeros of its dtype, or float0), so it is not added."""
    return [x + y if _has_tangent(o) else x for o, x, y in zip(outs, a, b)]


def _transpose_nonlinear(cts, args, lin, spec: CallSpec):
    """Transpose of a nonlinear op in arguments it is linear in (``linear_in``).

    With the other arguments known, f is linear in these, and its VJP at any value
    of them (zeros here) gives their cotangents: the transpose.
    """
    binding = spec.binding
    has_vjp = binding.has("vjp")
    if not lin or not set(lin) <= set(binding.options.linear_in) or not has_vjp:
        why = (
            f"it is declared linear in arguments {list(binding.options.linear_in)}"
            if binding.options.linear_in
            else "no arguments are declared linear (linear_in)"
        )
        if binding.options.linear_in and not has_vjp:
            why += ", but it has no VJP"
        raise TypeError(
            f"{about(binding.name)} is a nonlinear op; it cannot be transposed "
            f"with respect to arguments {lin}: {why}"
        )
    n, ba, oba = spec.n_fixed, spec.batch_axes, spec.out_batch_axes
    primals = [jnp.zeros(a.aval.shape, a.aval.dtype) if is_undefined_primal(a) else a for a in args]
    t_spec = spec.derive("vjp", len(args), _cat(ba, oba), ba and ba[n:])
    t_spec = _hinted(t_spec, args[n:], ba and ba[n:])
    res = _bind_transposed([*primals, *cts], t_spec)
    return [None] * n + _checked(spec, res, args[n:])


def transpose_rule(cts, *args, spec: CallSpec):
    binding = spec.binding
    undefined = [is_undefined_primal(a) for a in args]
    for i in range(spec.n_fixed):
        if undefined[i]:
            raise _fixed_error(spec, i, "transposed")
    if not any(undefined):
        return [None] * len(args)
    if all(type(c) is ad.Zero for c in cts):
        return [None] * len(args)
    cts = _cotangent_args(cts, args, spec)
    n, ba, oba = spec.n_fixed, spec.batch_axes, spec.out_batch_axes

    partner = spec.entry.partner
    if partner is not None:  # jointly linear
        t_spec = spec.derive(partner, n, _cat(ba and ba[:n], oba), ba and ba[n:])
        t_spec = _hinted(t_spec, args[n:], ba and ba[n:])
        res = _bind_transposed([*args[:n], *cts], t_spec)
        return [None] * n + _checked(spec, res, args[n:])

    lin = [i for i, u in enumerate(undefined) if u]
    if binding.kind is Kind.NONLINEAR and spec.role == "f":
        return _transpose_nonlinear(cts, args, lin, spec)
    if spec.role == "f":  # multilinear: linear in each argument separately
        if len(lin) != 1:
            raise TypeError(
                f"{about(binding.name)} is multilinear, i.e. linear in each argument "
                f"separately; it cannot be transposed with respect to arguments {lin} at once"
            )
        i = lin[0]
        rest = [*args[:i], *args[i + 1 :]]
        t_spec = spec.derive(
            f"T{i}",
            n,
            _cat(ba and (ba[:i] + ba[i + 1 :]), oba),
            ba and ba.pick([i]),
            n_lead=len(rest),
        )
        t_spec = _hinted(t_spec, args[i : i + 1], ba and ba.pick([i]))
        res = _bind_transposed([*rest, *cts], t_spec)
        return [None] * i + _checked(spec, res, args[i : i + 1]) + [None] * (len(args) - i - 1)

    # Multilinear transpose "T<i>": args = (the other arguments of f, cotangents of f).
    i, m = int(spec.role[1:]), spec.n_lead
    lead, cot = list(args[:m]), list(args[m:])
    (ct,) = cts
    lead_ba = list(ba.axes[:m]) if ba is not None else []
    if all(k >= m for k in lin):  # transpose back to f, w.r.t. its cotangent arguments
        f_args = lead[:i] + [ct] + lead[i:]
        f_spec = spec.derive(
            "f",
            n,
            ba and oba and BatchAxes(tuple(lead_ba[:i] + [oba[0]] + lead_ba[i:])),
            ba and ba[m:],
        )
        res = _bind_transposed(f_args, f_spec)
        return [None] * m + _checked(spec, res, args[m:])
    if len(lin) != 1:
        raise TypeError(
            f"{about(binding.name, spec.role)} is linear in each argument "
            f"separately; it cannot be transposed with respect to arguments {lin} at once"
        )
    k = lin[0]
    j = k if k < i else k + 1  # position of the wanted argument in f's signature
    full = lead[:i] + [ct] + lead[i:]
    rest = full[:j] + full[j + 1 :]
    if ba is not None and oba is not None:
        full_ba = lead_ba[:i] + [oba[0]] + lead_ba[i:]
        rest_ba = BatchAxes(tuple(full_ba[:j] + full_ba[j + 1 :])) + ba[m:]
        out_ba = BatchAxes((full_ba[j],))
    else:
        rest_ba = out_ba = None
    t_spec = spec.derive(f"T{j}", n, rest_ba, out_ba, n_lead=len(rest))
    t_spec = _hinted(t_spec, args[k : k + 1], out_ba)
    res = _bind_transposed([*rest, *cot], t_spec)
    return [None] * k + _checked(spec, res, args[k : k + 1]) + [None] * (len(args) - k - 1)
