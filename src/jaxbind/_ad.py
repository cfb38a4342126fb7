"""Differentiation rules shared by every jaxbind primitive.

Derivatives rebind the same primitive in another role (see _binding), so the
rules apply again to what they produce: linear ops differentiate to any order,
multilinear ops as far as their transposes allow, nonlinear ops to first order.
"""

from __future__ import annotations

from ._binding import Kind, describe_role
from ._compat import ad, instantiate_zeros, is_undefined_primal, zero_tangent
from ._spec import CallSpec

__all__ = ["jvp_rule", "transpose_rule"]


def _cat(*parts):
    """Concatenate batch-axes tuples; None when not batched."""
    if any(p is None for p in parts):
        return None
    return tuple(x for p in parts for x in p)


def _is_linear_role(spec: CallSpec) -> bool:
    """Roles that are linear, jointly, in all arguments after the fixed ones."""
    kind = spec.binding.kind
    return kind is Kind.LINEAR or (kind is Kind.NONLINEAR and spec.role != "f")


def _fixed_error(spec: CallSpec, index: int, action: str) -> Exception:
    binding = spec.binding
    if binding.kind is Kind.NONLINEAR and spec.role != "f":
        return NotImplementedError(
            f"jaxbind: '{binding.name}' is a nonlinear op and differentiates to first order "
            f"only: its {describe_role(spec.role)} cannot be {action} with respect to the "
            f"primal input {index}. For higher derivatives, bind the JVP itself as an op "
            "with get_nonlinear_call, or write the function in JAX")
    return TypeError(
        f"jaxbind: '{binding.name}' argument {index} is fixed (first_n_args_fixed="
        f"{binding.first_n_args_fixed}) and cannot be {action}; move it after the fixed "
        "arguments or use jax.custom_jvp")


def jvp_rule(primals, tangents, *, spec: CallSpec):
    prim = spec.binding.primitive
    for i in range(spec.n_fixed):
        if type(tangents[i]) is not ad.Zero:
            raise _fixed_error(spec, i, "differentiated")
    outs = prim.bind(*primals, spec=spec)
    live = [i for i in range(spec.n_fixed, len(primals)) if type(tangents[i]) is not ad.Zero]
    if not live:
        return outs, [zero_tangent(o) for o in outs]

    n = spec.n_fixed
    if _is_linear_role(spec):
        tans = prim.bind(*primals[:n], *map(instantiate_zeros, tangents[n:]), spec=spec)
    elif spec.binding.kind is Kind.NONLINEAR:  # role "f"
        ba = spec.batch_axes
        jvp_spec = spec.derive("jvp", len(primals), _cat(ba, ba and ba[n:]), spec.out_batch_axes)
        tans = prim.bind(*primals, *map(instantiate_zeros, tangents[n:]), spec=jvp_spec)
    else:  # multilinear: product rule, one term per argument with a tangent
        tans = None
        for i in live:
            term = prim.bind(*primals[:i], tangents[i], *primals[i + 1:], spec=spec)
            tans = term if tans is None else [a + b for a, b in zip(tans, term)]
    return outs, list(tans)


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
    cts = [instantiate_zeros(c) for c in cts]
    prim = binding.primitive
    n, ba, oba = spec.n_fixed, spec.batch_axes, spec.out_batch_axes

    if _is_linear_role(spec):
        other = {"f": "T", "T": "f", "jvp": "vjp", "vjp": "jvp"}[spec.role]
        t_spec = spec.derive(other, n, _cat(ba and ba[:n], oba), ba and ba[n:])
        res = prim.bind(*args[:n], *cts, spec=t_spec)
        return [None] * n + [r if u else None for r, u in zip(res, undefined[n:])]

    lin = [i for i, u in enumerate(undefined) if u]
    if spec.role == "f":  # multilinear: linear in each argument separately
        if len(lin) != 1:
            raise TypeError(
                f"jaxbind: '{binding.name}' is multilinear, i.e. linear in each argument "
                f"separately; it cannot be transposed with respect to arguments {lin} at once")
        i = lin[0]
        rest = args[:i] + args[i + 1:]
        t_spec = spec.derive(f"T{i}", n, _cat(ba and (ba[:i] + ba[i + 1:]), oba),
                             ba and (ba[i],), n_lead=len(rest))
        (res,) = prim.bind(*rest, *cts, spec=t_spec)
        return [None] * i + [res] + [None] * (len(args) - i - 1)

    # Multilinear transpose "T<i>": args = (the other arguments of f, cotangents of f).
    i, m = int(spec.role[1:]), spec.n_lead
    lead, cot = list(args[:m]), list(args[m:])
    (ct,) = cts
    lead_ba = ba and list(ba[:m])
    if all(k >= m for k in lin):  # transpose back to f, w.r.t. its cotangent arguments
        f_args = lead[:i] + [ct] + lead[i:]
        f_spec = spec.derive("f", n, _cat(ba and tuple(lead_ba[:i] + [oba[0]] + lead_ba[i:])),
                             ba and ba[m:])
        res = prim.bind(*f_args, spec=f_spec)
        return [None] * m + [r if u else None for r, u in zip(res, undefined[m:])]
    if len(lin) != 1:
        raise TypeError(
            f"jaxbind: '{binding.name}' ({describe_role(spec.role)}) is linear in each argument "
            f"separately; it cannot be transposed with respect to arguments {lin} at once")
    k = lin[0]
    j = k if k < i else k + 1  # position of the wanted argument in f's signature
    full = lead[:i] + [ct] + lead[i:]
    rest = full[:j] + full[j + 1:]
    if ba is not None:
        full_ba = lead_ba[:i] + [oba[0]] + lead_ba[i:]
        rest_ba, out_ba = tuple(full_ba[:j] + full_ba[j + 1:]) + tuple(ba[m:]), (full_ba[j],)
    else:
        rest_ba = out_ba = None
    t_spec = spec.derive(f"T{j}", n, rest_ba, out_ba, n_lead=len(rest))
    (res,) = prim.bind(*rest, *cot, spec=t_spec)
    return [None] * k + [res] + [None] * (len(args) - k - 1)
