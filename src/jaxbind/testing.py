"""Check a jaxbind op thoroughly before its users do: ``jaxbind.testing.check``.

The commonest bugs in a binding are a transpose or VJP that is subtly wrong (a
missing conjugate, a factor of 2, a swapped axis) and an abstract function that
disagrees with what the callable writes. `check` runs one op on example inputs
through every path jaxbind offers and compares the paths with each other and
with finite differences.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from ._api import Op
from ._kwargs import KwargsDump, encode_kwargs
from ._native import NativeOp
from ._roles import Body, Kind, for_call
from ._state import outside_programs

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


def _run_callable(case: _Case):
    """Call f directly on sentinel-filled outputs; -> (outputs, unwritten fractions, error)."""
    inputs = []
    for a in case.args:
        a = np.array(a)  # a private, read-only copy, like the trampoline's views
        a.setflags(write=False)
        inputs.append(a)
    runs = []
    for k in (0, 1):
        outs = tuple(
            np.full(av.shape, _sentinels(av.dtype)[k], dtype=av.dtype) for av in case.out_avals
        )
        try:
            with outside_programs(
                case.binding.options, case.dump.to_dict(), inputs, f"'{case.binding.name}'"
            ):
                for_call(case.binding.f, case.trees)(outs, tuple(inputs), case.dump)
        except Exception as exc:
            return None, None, f"{type(exc).__name__}: {exc}"
        runs.append(outs)
    unwritten = []
    for av, o0, o1 in zip(case.out_avals, *runs):
        s0, s1 = _sentinels(av.dtype)
        left = (o0 == s0) & (o1 == s1)
        unwritten.append(float(left.mean()) if left.size else 0.0)
    return runs[1], unwritten, None


@dataclass
class _Case:
    """One `check` call: the op, its example call, and the report its rows go into."""

    op: Op
    args: tuple
    kwargs: dict
    trees: KwargsDump | None  # the call's pytree structure (JAX-native ops)
    rng: np.random.Generator
    rtol: float | None
    eps: float | None
    report: CheckReport
    out_avals: list = field(default_factory=list)  # f's outputs at the example arguments
    direct: tuple = ()  # f's outputs, called directly (abstract vs callable)

    @property
    def binding(self):
        return self.op.binding

    @property
    def n_fixed(self) -> int:
        return self.binding.options.fixed

    @functools.cached_property
    def dump(self):
        """The keyword arguments as the callables receive them."""
        return self.fresh_dump()

    def fresh_dump(self):
        """The keyword arguments encoded anew: with their own copies of the arrays."""
        dump = encode_kwargs(self.kwargs)
        if self.binding.options.vectorized:
            dump = dump.with_extra(batch_axes=None)
        return dump

    @property
    def out_names(self) -> list[str]:
        return [f"output {k}" for k in range(len(self.out_avals))]

    @property
    def differentiable(self) -> list[int]:
        """The arguments after the fixed ones with inexact dtypes."""
        return [i for i in range(self.n_fixed, len(self.args)) if _inexact(self.args[i])]

    def tol(self, kind, dtype) -> float:
        return self.rtol if self.rtol is not None else _TOL[_precision(dtype)][kind]

    def call(self, *a):
        return self.op.apply(a, self.kwargs, self.trees)

    def add(self, *row, **named) -> None:
        self.report.append(CheckResult(*row, **named))

    def dot_check(self, name, lhs, rhs, a, b, target, dtype) -> None:
        """<u, A v> against <A* u, v>: relative to |lhs| or |A* u| |v|, whichever is larger."""
        scale = max(abs(lhs), np.linalg.norm(np.asarray(a)) * np.linalg.norm(b), 1e-30)
        self.add(name, target, str(dtype), abs(lhs - rhs) / scale, self.tol("dot", dtype))


def check(
    op, *args, rtol=None, eps=None, batch_size=3, seed=0, verbose=True, **kwargs
) -> CheckReport:
    """Check a jaxbind op on example inputs; raise AssertionError on any failure.

    Checks, each reported per argument or output with its dtype:

    - **abstract vs callable**: the callable, run on output buffers pre-filled
      with sentinels, writes every element of every output that the abstract
      function declares (an output left unwritten, or written to a copy, fails),
      and raises nothing;
    - **inputs unchanged**: each role's body (the function, its transposes, its
      JVP and VJP: callables, compiled kernels and JAX functions alike), called
      directly on writable copies of its inputs, leaves them and the call's array
      keyword arguments as they were. jaxbind hands bodies read-only inputs, but a
      C kernel, or a callable that reaches the memory through its address
      (``ctypes``, ``np.frombuffer``), can write past that; this row names the role
      and the input it wrote;
    - **eager vs callable** and **jit vs eager**: the op agrees with the callable;
    - **determinism**: two jitted calls give identical results;
    - **linearity** for linear and multilinear ops, per argument after the fixed
      ones (the others zero for a linear op, as given for a multilinear one):
      ``f(0) == 0``, ``f(a x) == a f(x)`` and ``f(x + y) == f(x) + f(y)``, so an
      affine or nonlinear function declared linear is named as such, not only
      seen as a transpose that disagrees;
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
      The `CheckReport` when every check passes.

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
    case = _Case(
        op=op,
        args=tuple(np.asarray(a) for a in args),
        kwargs=kwargs,
        trees=trees,
        rng=np.random.default_rng(seed),
        rtol=rtol,
        eps=eps,
        report=CheckReport(),
    )
    case.out_avals = list(jax.eval_shape(case.call, *case.args))
    if _callable_rows(case):
        _input_rows(case)
        _agreement_rows(case)
        _linearity_rows(case)
        _derivative_rows(case)
        _vmap_rows(case, batch_size)
    return _finish(case.report, case.binding, verbose)


def _callable_rows(case: _Case) -> bool:
    """abstract vs callable; False if the callable fails (then nothing else is checked)."""
    direct, unwritten, error = _run_callable(case)
    if error is not None:
        case.add("callable runs", "f", "-", np.inf, 0.0, error)
        return False
    case.direct = direct
    for name, av, frac in zip(case.out_names, case.out_avals, unwritten):
        detail = f"{frac:.0%} of the elements left unwritten" if frac else ""
        case.add("abstract vs callable: written", name, str(av.dtype), frac, 0.0, detail)
    return True


def _agreement_rows(case: _Case) -> None:
    """eager vs callable, jit vs eager, determinism."""
    eager = case.call(*case.args)
    for name, av, d, e in zip(case.out_names, case.out_avals, case.direct, eager):
        case.add("eager vs callable", name, str(av.dtype), _rel(e, d), case.tol("exact", av.dtype))
    jitted = jax.jit(case.call)
    first, second = jitted(*case.args), jitted(*case.args)
    for name, av, e, j1, j2 in zip(case.out_names, case.out_avals, eager, first, second):
        case.add("jit vs eager", name, str(av.dtype), _rel(j1, e), case.tol("exact", av.dtype))
        same = np.array_equal(np.asarray(j1), np.asarray(j2), equal_nan=True)
        case.add("determinism", name, str(av.dtype), 0.0 if same else 1.0, 0.0)


# --- inputs unchanged ------------------------------------------------------------------------


def _role_calls(case: _Case):
    """(role, inputs, output shapes) for each role the op has a body for, with inputs
    laid out as that role's calls take them (see _roles.Args)."""
    binding, args, n = case.binding, case.args, case.n_fixed
    rng = case.rng
    outs_f = [(tuple(av.shape), np.dtype(av.dtype)) for av in case.out_avals]
    cotangents = [_random_like(np.zeros(shape, dtype), rng) for shape, dtype in outs_f]
    like_inputs = [(a.shape, a.dtype) for a in args[n:]]
    yield "f", list(args), outs_f
    if binding.kind is Kind.LINEAR:
        yield "T", [*args[:n], *cotangents], like_inputs
    elif binding.kind is Kind.MULTILINEAR:
        for i in range(n, len(args)):
            others = [a for k, a in enumerate(args) if k != i]
            yield f"T{i}", [*others, *cotangents], [(args[i].shape, args[i].dtype)]
    else:
        tangents = [_random_like(a, rng) for a in args[n:]]
        yield "jvp", [*args, *tangents], outs_f
        yield "vjp", [*args, *cotangents], like_inputs


def _array_kwargs(kwargs: dict) -> dict:
    """The NumPy arrays among keyword arguments, copied (nested ones by their path)."""
    found = {}

    def visit(path, value):
        if isinstance(value, np.ndarray):
            found[path] = value.copy()
        elif isinstance(value, (list, tuple)):
            for k, v in enumerate(value):
                visit(f"{path}[{k}]", v)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(f"{path}[{k!r}]", v)

    for name, value in kwargs.items():
        visit(name, value)
    return found


def _changed(before, after) -> float:
    """The fraction of elements that differ (NaNs equal)."""
    before, after = np.asarray(before), np.asarray(after)
    if before.size == 0:
        return 0.0
    same = (before == after) | ((before != before) & (after != after))
    return float(1.0 - same.mean())


def _input_rows(case: _Case) -> None:
    """inputs unchanged: each role's body, called on writable copies, leaves them alone."""
    binding = case.binding
    for role, inputs, out_shapes in _role_calls(case):
        if not binding.has(role):
            continue
        entry = binding.role(role)
        what = entry.role.describe()
        body = entry.body
        copies = [np.array(a) for a in inputs]  # writable: nothing stops a write but the body
        kept = [c.copy() for c in copies]
        dump = case.fresh_dump()  # its own arrays: a write shows in this call only
        kwargs_before = _array_kwargs(case.kwargs)
        try:
            if entry.kind is Body.JAX:
                arrays = [jnp.asarray(c) for c in copies]
                jax.block_until_ready(for_call(body, case.trees)(*arrays, **case.dump.to_dict()))
                copies = [np.asarray(a) for a in arrays]
            else:
                outs = tuple(np.zeros(shape, dtype) for shape, dtype in out_shapes)
                fn = body if entry.kind is Body.KERNEL else for_call(body, case.trees)
                label = f"'{binding.name}' ({what})"
                with outside_programs(binding.options, dump.to_dict(), copies, label):
                    fn(outs, tuple(copies), dump)
        except Exception as exc:
            case.add(
                "inputs unchanged",
                what,
                "-",
                np.inf,
                0.0,
                f"it failed: {type(exc).__name__}: {exc}",
            )
            continue
        for k, (before, after) in enumerate(zip(kept, copies)):
            frac = _changed(before, after)
            detail = f"{what} wrote {frac:.0%} of its input {k}" if frac else ""
            case.add("inputs unchanged", f"{what}: input {k}", str(before.dtype), frac, 0.0, detail)
        for path, before in kwargs_before.items():
            frac = _changed(before, _array_kwargs(dump.to_dict()).get(path))
            detail = f"{what} wrote {frac:.0%} of keyword argument {path!r}" if frac else ""
            case.add(
                "inputs unchanged",
                f"{what}: keyword argument {path!r}",
                str(before.dtype),
                frac,
                0.0,
                detail,
            )


# --- linearity -------------------------------------------------------------------------------


def _linearity_rows(case: _Case) -> None:
    """f(0) = 0, f(a x) = a f(x), f(x + y) = f(x) + f(y), per linear argument."""
    binding = case.binding
    if binding.kind is Kind.NONLINEAR:
        return
    scale = -1.75  # negative, and not a power of two: catches abs() and a factor of 2
    for i in case.differentiable:
        x = case.args[i]
        y = _random_like(x, case.rng)
        lin_i = _linear_in(case, i)
        fx, fy, f0 = lin_i(x), lin_i(y), lin_i(np.zeros_like(x))
        fax = lin_i(np.asarray(scale * x, x.dtype))
        fxy = lin_i(np.asarray(x + y, x.dtype))
        target, tol = f"argument {i}", case.tol("exact", x.dtype) * 10
        size = max(float(np.max(np.abs(np.asarray(o)), initial=0.0)) for o in [*fx, *fy])
        zero = max(float(np.max(np.abs(np.asarray(o)), initial=0.0)) for o in f0) / max(size, 1e-30)
        detail = "f is affine or nonlinear in this argument" if zero > tol else ""
        case.add("linearity: f(0) = 0", target, str(x.dtype), zero, tol, detail)
        error = max(_rel(a, scale * np.asarray(b, np.complex128)) for a, b in zip(fax, fx))
        detail = "f is not homogeneous in this argument" if error > tol else ""
        case.add("linearity: f(a x) = a f(x)", target, str(x.dtype), error, tol, detail)
        error = max(
            _rel(s, np.asarray(a, np.complex128) + np.asarray(b, np.complex128))
            for s, a, b in zip(fxy, fx, fy)
        )
        detail = "f is not additive in this argument" if error > tol else ""
        case.add("linearity: f(x + y) = f(x) + f(y)", target, str(x.dtype), error, tol, detail)


def _linear_in(case: _Case, i: int):
    """The op as a function of argument i: a linear op is linear in all its arguments
    after the fixed ones jointly, so the others are zero; a multilinear op is linear in
    each with the others as given."""
    multilinear = case.binding.kind is Kind.MULTILINEAR

    def fn(xi):
        full = [
            a if k < case.n_fixed or multilinear else np.zeros_like(a)
            for k, a in enumerate(case.args)
        ]
        full[i] = xi
        return case.call(*full)

    return fn


# --- derivatives -----------------------------------------------------------------------------


def _derivative_rows(case: _Case) -> None:
    """jvp vs finite differences, vjp vs jvp, transpose adjointness, second order."""
    binding, args = case.binding, case.args
    diff = case.differentiable
    has_fwd = binding.kind is not Kind.NONLINEAR or binding.has("jvp")
    has_rev = (
        (binding.kind is Kind.LINEAR and binding.has("T"))
        or (binding.kind is Kind.MULTILINEAR)
        or (binding.kind is Kind.NONLINEAR and binding.has("vjp"))
    )
    rng = case.rng
    for i in diff:
        x = args[i]
        target, dt = f"argument {i}", str(x.dtype)

        def f_i(xi, i=i):
            full = list(args)
            full[i] = xi
            return case.call(*full)

        v = _random_like(x, rng)
        if has_fwd:
            _, tan = jax.jvp(f_i, (jnp.asarray(x),), (jnp.asarray(v),))
            h = (case.eps if case.eps is not None else case.tol("eps", x.dtype)) * max(
                1.0, float(np.max(np.abs(x), initial=0.0))
            )
            hi = np.asarray(x + h * v, dtype=x.dtype)
            lo = np.asarray(x - h * v, dtype=x.dtype)
            with np.errstate(over="ignore", invalid="ignore"):
                fd = [
                    (np.asarray(a, np.complex128) - np.asarray(b, np.complex128)) / (2 * h)
                    for a, b in zip(f_i(hi), f_i(lo))
                ]
            for name, t, d in zip(case.out_names, tan, fd):
                case.add(
                    "jvp vs finite differences",
                    f"{target} -> {name}",
                    dt,
                    _rel(t, d),
                    case.tol("fd", x.dtype),
                )
        if has_rev:
            u = [_random_like(np.zeros(av.shape, av.dtype), rng) for av in case.out_avals]
            _, vjp = jax.vjp(f_i, jnp.asarray(x))
            (ct,) = vjp([jnp.asarray(c) for c in u])
            rhs = _pair(ct, v)
            if has_fwd:  # `tan` is the JVP along v computed above
                lhs = sum(_pair(c, t) for c, t in zip(u, tan))
                case.dot_check("vjp vs jvp (dot product)", lhs, rhs, ct, v, target, x.dtype)
            if binding.kind in (Kind.LINEAR, Kind.MULTILINEAR):
                lin_i = _linear_in(case, i)
                (tr,) = jax.linear_transpose(lin_i, jnp.asarray(x))([jnp.asarray(c) for c in u])
                lhs = sum(_pair(c, y) for c, y in zip(u, lin_i(v)))
                rhs = _pair(tr, v)
                case.dot_check("transpose adjointness", lhs, rhs, tr, v, target, x.dtype)

    if binding.order() >= 2 and has_fwd and has_rev and binding.kind is Kind.NONLINEAR:
        _second_order(case, [i for i in diff if not np.iscomplexobj(args[i])])


def _vmap_rows(case: _Case, batch_size: int) -> None:
    """vmap vs loop: each input batched alone, then all together."""
    args, rng = case.args, case.rng
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
        vm = jax.vmap(case.call, in_axes=in_axes)(
            *[batched[i] if i in which else args[i] for i in range(len(args))]
        )
        for k, av in enumerate(case.out_avals):
            loop = np.stack(
                [
                    np.asarray(
                        case.call(
                            *[batched[i][b] if i in which else args[i] for i in range(len(args))]
                        )[k]
                    )
                    for b in range(batch_size)
                ]
            )
            target = (
                "all inputs" if len(which) > 1 else f"argument {which[0]}"
            ) + f" -> {case.out_names[k]}"
            case.add(
                "vmap vs loop",
                target,
                str(av.dtype),
                _rel(vm[k], loop),
                case.tol("exact", av.dtype) * 10,
            )


def _second_order(case: _Case, diff: list[int]) -> None:
    """Hessian checks of phi(x) = Re <u, op(x)> over the real differentiable arguments jointly.

    - **hessian symmetry**: ``<w, H v> == <v, H w>`` for random v, w;
    - **hessian-vector product vs finite differences**: ``H v`` (the JVP of the
      gradient) against central differences of the gradient along v.
    """
    if not diff:
        return
    args, rng, tol, eps, report = case.args, case.rng, case.tol, case.eps, case.report
    call, out_avals = case.call, case.out_avals
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
    norm = lambda t: float(np.sqrt(sum(np.sum(np.abs(np.asarray(a)) ** 2) for a in t)))
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
