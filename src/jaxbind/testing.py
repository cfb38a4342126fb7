"""Check a jaxbind op thoroughly before its users do: ``jaxbind.testing.check``.

The commonest bugs in a binding are a transpose or VJP that is subtly wrong (a
missing conjugate, a factor of 2, a swapped axis) and an abstract function that
disagrees with what the callable writes. `check` runs one op on example inputs
through every path jaxbind offers and compares the paths with each other and
with finite differences.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ._api import Op
from ._kwargs import encode_kwargs
from ._native import NativeOp
from ._roles import Kind, for_call

__all__ = ["check", "CheckResult", "CheckReport"]

# Default tolerances (relative) and finite-difference steps per precision.
_TOL = {
    "single": dict(exact=1e-5, fd=3e-2, dot=1e-4, eps=1e-3),
    "double": dict(exact=1e-11, fd=1e-5, dot=1e-10, eps=1e-6),
}


@dataclass(frozen=True)
class CheckResult:
    """One row of a check report."""

    check: str  # which check, e.g. "jvp vs finite differences"
    target: str  # which argument or output
    dtype: str
    error: float  # relative error (or fraction of bad elements)
    tol: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.error <= self.tol)


class CheckReport(list):
    """The rows of one `check` call; ``str(report)`` is a table."""

    def failures(self) -> list[CheckResult]:
        return [r for r in self if not r.ok]

    def __str__(self):
        rows = [("check", "target", "dtype", "error", "tol", "")]
        rows += [
            (
                r.check,
                r.target,
                r.dtype,
                f"{r.error:.2e}",
                f"{r.tol:.0e}",
                ("ok" if r.ok else "FAIL") + (f"  {r.detail}" if r.detail else ""),
            )
            for r in self
        ]
        widths = [max(len(row[k]) for row in rows) for k in range(5)]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5] for row in rows
        )


def _precision(dtype) -> str:
    return "double" if np.dtype(dtype) in (np.float64, np.complex128) else "single"


def _rel(a, b) -> float:
    with np.errstate(invalid="ignore", over="ignore"):  # unwritten outputs: NaN/inf below
        a, b = np.asarray(a, np.complex128), np.asarray(b, np.complex128)
    if a.shape != b.shape:
        return np.inf
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return np.inf  # e.g. an output the callable never wrote
    with np.errstate(over="ignore", invalid="ignore"):
        scale = max(np.max(np.abs(a), initial=0.0), np.max(np.abs(b), initial=0.0), 1e-30)
        error = float(np.max(np.abs(a - b), initial=0.0) / scale)
    return error if np.isfinite(error) else np.inf


def _pair(a, b) -> float:
    """JAX's (unconjugated) real pairing of tangents and cotangents: Re sum(a * b)."""
    return float(np.real(np.sum(np.asarray(a, np.complex128) * np.asarray(b, np.complex128))))


def _random_like(x, rng):
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.complexfloating):
        return (rng.standard_normal(x.shape) + 1j * rng.standard_normal(x.shape)).astype(x.dtype)
    if np.issubdtype(x.dtype, np.floating):
        return rng.standard_normal(x.shape).astype(x.dtype)
    return x.copy()


def _inexact(x) -> bool:
    return np.issubdtype(np.asarray(x).dtype, np.inexact)


def _unwrap(op, args, kwargs):
    """Accept an Op, a NativeOp, or a functools.partial of one (as returned by factories)."""
    while isinstance(op, functools.partial):
        args = op.args + tuple(args)
        kwargs = {**op.keywords, **kwargs}
        op = op.func
    trees = None
    if isinstance(op, NativeOp):  # checked through its underlying op, on array leaves
        args, kwargs, trees = op.protocol_call(*args, **kwargs)
        op = op.op
    if not isinstance(op, Op):
        raise TypeError(f"jaxbind.testing.check expects a jaxbind op, got {op!r}")
    return op, tuple(args), kwargs, trees


def _sentinels(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.array(True), np.array(False)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array(info.max, dtype), np.array(info.min, dtype)
    return np.array(1.2345e4, dtype), np.array(-9.875e3, dtype)  # exact in every float type


def _run_callable(op: Op, args, avals, kwargs, trees):
    """Call f directly on sentinel-filled outputs; -> (outputs, unwritten fractions, error)."""
    binding = op.binding
    dump = encode_kwargs(kwargs)
    if binding.options.vectorized:
        dump = dump.with_extra(batch_axes=None)
    inputs = []
    for a in args:
        a = np.array(a)  # a private, read-only copy, like the trampoline's views
        a.setflags(write=False)
        inputs.append(a)
    runs = []
    for k in (0, 1):
        outs = tuple(np.full(av.shape, _sentinels(av.dtype)[k], dtype=av.dtype) for av in avals)
        try:
            for_call(binding.f, trees)(outs, tuple(inputs), dump)
        except Exception as exc:
            return None, None, f"{type(exc).__name__}: {exc}"
        runs.append(outs)
    unwritten = []
    for av, o0, o1 in zip(avals, *runs):
        s0, s1 = _sentinels(av.dtype)
        left = (o0 == s0) & (o1 == s1)
        unwritten.append(float(left.mean()) if left.size else 0.0)
    return runs[1], unwritten, None


def check(
    op, *args, rtol=None, eps=None, batch_size=3, seed=0, verbose=True, **kwargs
) -> CheckReport:
    """Check a jaxbind op on example inputs; raise AssertionError on any failure.

    Checks, each reported per argument or output with its dtype:

    - **abstract vs callable**: the callable, run on output buffers pre-filled
      with sentinels, writes every element of every output that the abstract
      function declares (an output left unwritten, or written to a copy, fails),
      and raises nothing;
    - **eager vs callable** and **jit vs eager**: the op agrees with the callable;
    - **determinism**: two jitted calls give identical results;
    - **jvp vs finite differences** (central, per non-fixed inexact argument);
    - **vjp vs jvp**: ``<u, J v> == <J^T u, v>`` with JAX's unconjugated pairing
      ``Re sum(a*b)``, so a missing or extra conjugate is caught;
    - **transpose adjointness** for linear and multilinear ops, through
      ``jax.linear_transpose``;
    - **vmap vs loop**, with each input batched alone and all batched together;
    - for nonlinear ops with second derivatives (JVP and VJP given as JAX
      functions): **hessian symmetry** and **hessian-vector product vs finite
      differences** of the gradient, over the real differentiable arguments.

    Args:
      op: a jaxbind op, or a ``functools.partial`` of one.
      *args: example inputs (NumPy or JAX arrays), as for ``op(*args)``.
      rtol: override every relative tolerance (default: per check and precision).
      eps: finite-difference step (default 1e-3 in single, 1e-6 in double precision,
        times the input's scale).
      batch_size: batch size of the vmap checks.
      seed: seed for random directions and batches.
      verbose: print the report table.
      **kwargs: keyword arguments of the op call.

    Returns:
      The :class:`CheckReport` when every check passes.

    Raises:
      AssertionError: naming each failed check, its argument, dtype and error,
        followed by the whole table.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"jaxbind.testing.check: batch_size must be a positive int (the size "
            f"of the vmap checks' batch), got {batch_size!r}"
        )
    op, args, kwargs, trees = _unwrap(op, args, kwargs)
    binding = op.binding
    rng = np.random.default_rng(seed)
    args = tuple(np.asarray(a) for a in args)
    n_fixed = binding.options.fixed
    report = CheckReport()

    def tol(kind, dtype):
        return rtol if rtol is not None else _TOL[_precision(dtype)][kind]

    def call(*a):
        return op.apply(a, kwargs, trees)

    def dot_check(name, lhs, rhs, a, b, target, dtype) -> CheckResult:
        """<u, A v> against <A* u, v>: relative to |lhs| or |A* u| |v|, whichever is larger."""
        scale = max(abs(lhs), np.linalg.norm(np.asarray(a)) * np.linalg.norm(b), 1e-30)
        return CheckResult(name, target, str(dtype), abs(lhs - rhs) / scale, tol("dot", dtype))

    out_avals = jax.eval_shape(call, *args)
    out_names = [f"output {k}" for k in range(len(out_avals))]

    # abstract vs callable
    direct, unwritten, error = _run_callable(op, args, out_avals, kwargs, trees)
    if error is not None:
        report.append(CheckResult("callable runs", "f", "-", np.inf, 0.0, error))
        return _finish(report, binding, verbose)
    for name, av, frac in zip(out_names, out_avals, unwritten):
        report.append(
            CheckResult(
                "abstract vs callable: written",
                name,
                str(av.dtype),
                frac,
                0.0,
                f"{frac:.0%} of the elements left unwritten" if frac else "",
            )
        )

    eager = call(*args)
    for name, av, d, e in zip(out_names, out_avals, direct, eager):
        report.append(
            CheckResult(
                "eager vs callable", name, str(av.dtype), _rel(e, d), tol("exact", av.dtype)
            )
        )
    jitted = jax.jit(call)
    first, second = jitted(*args), jitted(*args)
    for name, av, e, j1, j2 in zip(out_names, out_avals, eager, first, second):
        report.append(
            CheckResult("jit vs eager", name, str(av.dtype), _rel(j1, e), tol("exact", av.dtype))
        )
        same = np.array_equal(np.asarray(j1), np.asarray(j2), equal_nan=True)
        report.append(CheckResult("determinism", name, str(av.dtype), 0.0 if same else 1.0, 0.0))

    diff = [i for i in range(n_fixed, len(args)) if _inexact(args[i])]
    has_fwd = binding.kind is not Kind.NONLINEAR or binding.has("jvp")
    has_rev = (
        (binding.kind is Kind.LINEAR and binding.has("T"))
        or (binding.kind is Kind.MULTILINEAR)
        or (binding.kind is Kind.NONLINEAR and binding.has("vjp"))
    )

    for i in diff:
        x = args[i]
        target, dt = f"argument {i}", str(x.dtype)

        def f_i(xi, i=i):
            full = list(args)
            full[i] = xi
            return call(*full)

        v = _random_like(x, rng)
        if has_fwd:
            _, tan = jax.jvp(f_i, (jnp.asarray(x),), (jnp.asarray(v),))
            h = (eps if eps is not None else tol("eps", x.dtype)) * max(
                1.0, float(np.max(np.abs(x), initial=0.0))
            )
            hi = np.asarray(x + h * v, dtype=x.dtype)
            lo = np.asarray(x - h * v, dtype=x.dtype)
            with np.errstate(over="ignore", invalid="ignore"):
                fd = [
                    (np.asarray(a, np.complex128) - np.asarray(b, np.complex128)) / (2 * h)
                    for a, b in zip(f_i(hi), f_i(lo))
                ]
            for name, t, d in zip(out_names, tan, fd):
                report.append(
                    CheckResult(
                        "jvp vs finite differences",
                        f"{target} -> {name}",
                        dt,
                        _rel(t, d),
                        tol("fd", x.dtype),
                    )
                )
        if has_rev:
            u = [_random_like(np.zeros(av.shape, av.dtype), rng) for av in out_avals]
            _, vjp = jax.vjp(f_i, jnp.asarray(x))
            (ct,) = vjp([jnp.asarray(c) for c in u])
            rhs = _pair(ct, v)
            if has_fwd:  # `tan` is the JVP along v computed above
                lhs = sum(_pair(c, t) for c, t in zip(u, tan))
                report.append(
                    dot_check("vjp vs jvp (dot product)", lhs, rhs, ct, v, target, x.dtype)
                )
            if binding.kind in (Kind.LINEAR, Kind.MULTILINEAR):

                def lin_i(xi, i=i):  # a linear op is affine in one argument: zero the others
                    full = [
                        a if k < n_fixed or binding.kind is Kind.MULTILINEAR else np.zeros_like(a)
                        for k, a in enumerate(args)
                    ]
                    full[i] = xi
                    return call(*full)

                (tr,) = jax.linear_transpose(lin_i, jnp.asarray(x))([jnp.asarray(c) for c in u])
                lhs = sum(_pair(c, y) for c, y in zip(u, lin_i(v)))
                rhs = _pair(tr, v)
                report.append(dot_check("transpose adjointness", lhs, rhs, tr, v, target, x.dtype))

    if binding.order() >= 2 and has_fwd and has_rev and binding.kind is Kind.NONLINEAR:
        _second_order(
            report,
            call,
            args,
            [i for i in diff if not np.iscomplexobj(args[i])],
            out_avals,
            rng,
            tol,
            eps,
        )

    # vmap vs loop: each input batched alone, then all together
    batched = [
        np.stack(
            [
                args[i]
                if not _inexact(args[i]) or b == 0
                else args[i] + (0.1 * b) * _random_like(args[i], rng).real.astype(args[i].dtype)
                for b in range(batch_size)
            ]
        )
        for i in range(len(args))
    ]
    for which in [[i] for i in range(len(args))] + (
        [list(range(len(args)))] if len(args) > 1 else []
    ):
        in_axes = [0 if i in which else None for i in range(len(args))]
        vm = jax.vmap(call, in_axes=in_axes)(
            *[batched[i] if i in which else args[i] for i in range(len(args))]
        )
        for k, av in enumerate(out_avals):
            loop = np.stack(
                [
                    np.asarray(
                        call(*[batched[i][b] if i in which else args[i] for i in range(len(args))])[
                            k
                        ]
                    )
                    for b in range(batch_size)
                ]
            )
            target = (
                "all inputs" if len(which) > 1 else f"argument {which[0]}"
            ) + f" -> {out_names[k]}"
            report.append(
                CheckResult(
                    "vmap vs loop",
                    target,
                    str(av.dtype),
                    _rel(vm[k], loop),
                    tol("exact", av.dtype) * 10,
                )
            )
    return _finish(report, binding, verbose)


def _second_order(report, call, args, diff, out_avals, rng, tol, eps):
    """Hessian checks of phi(x) = Re <u, op(x)> over the real differentiable arguments jointly.

    - **hessian symmetry**: ``<w, H v> == <v, H w>`` for random v, w;
    - **hessian-vector product vs finite differences**: ``H v`` (the JVP of the
      gradient) against central differences of the gradient along v.
    """
    if not diff:
        return
    u = [jnp.asarray(_random_like(np.zeros(av.shape, av.dtype), rng)) for av in out_avals]

    def phi(*xs):
        full = list(args)
        for i, x in zip(diff, xs):
            full[i] = x
        return sum(jnp.real(jnp.sum(c * y)) for c, y in zip(u, call(*full)))

    grad = jax.grad(phi, argnums=tuple(range(len(diff))))
    xs = tuple(jnp.asarray(args[i]) for i in diff)
    v = tuple(jnp.asarray(_random_like(x, rng)) for x in xs)
    w = tuple(jnp.asarray(_random_like(x, rng)) for x in xs)
    hv = jax.jvp(grad, xs, v)[1]
    hw = jax.jvp(grad, xs, w)[1]
    dt = str(xs[0].dtype)
    lhs, rhs = sum(map(_pair, w, hv)), sum(map(_pair, v, hw))
    norm = lambda t: float(np.sqrt(sum(np.sum(np.abs(np.asarray(a)) ** 2) for a in t)))  # noqa: E731
    scale = max(abs(lhs), norm(hv) * norm(w), 1e-30)
    target = "arguments " + ", ".join(map(str, diff))
    report.append(
        CheckResult("hessian symmetry", target, dt, abs(lhs - rhs) / scale, tol("dot", xs[0].dtype))
    )
    h = (eps if eps is not None else tol("eps", xs[0].dtype)) * max(
        1.0, max(float(np.max(np.abs(np.asarray(x)), initial=0.0)) for x in xs)
    )
    hi = grad(*(x + h * d for x, d in zip(xs, v)))
    lo = grad(*(x - h * d for x, d in zip(xs, v)))
    fd = [(np.asarray(a, np.float64) - np.asarray(b, np.float64)) / (2 * h) for a, b in zip(hi, lo)]
    error = max(_rel(a, b) for a, b in zip(hv, fd))
    report.append(
        CheckResult(
            "hessian-vector product vs finite differences",
            target,
            dt,
            error,
            tol("fd", xs[0].dtype),
        )
    )


def _finish(report: CheckReport, binding, verbose: bool) -> CheckReport:
    if verbose:
        print(f"jaxbind.testing.check('{binding.name}'):\n{report}")
    failures = report.failures()
    if failures:
        lines = [
            f"- {r.check} [{r.target}, {r.dtype}]: error {r.error:.3g} > tol {r.tol:.0e}"
            + (f" ({r.detail})" if r.detail else "")
            for r in failures
        ]
        raise AssertionError(
            f"jaxbind.testing.check: '{binding.name}' failed {len(failures)} "
            "check(s):\n" + "\n".join(lines) + "\n\n" + str(report)
        )
    return report
