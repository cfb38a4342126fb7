"""vmap: the batching rule of every role against a loop over the batch.

Each role is run through JAX as a user reaches it, under ``vmap``, with inputs batched at
axis 0 and at their last axis (``out_axes`` 0 and -1), so that a callable that assumes
the batch axis leads, or ignores ``batch_axes``, is caught:

- **vmap vs loop**: f, with each input batched alone at axis 0, then all of them at their
  last axis; a nonlinear op's JVP (through ``jax.jvp``) and its transpose in its
  ``linear_in`` arguments (through ``jax.linear_transpose``), with their tangents or
  cotangents batched at axis 0, then all inputs at their last axis;
- **vmap(grad) vs loop**: the reverse roles (the transposes, the VJP), as the gradient of
  ``Re <u, f(x)>`` under vmap: u batched alone at axis 0, then everything at the last
  axis. JAX batches the transposed call with the role's batching rule;
- **grad(vmap) vs loop**: the gradient of a vmapped f: JAX transposes a batched call.

A role the op was not given makes its rows "not checked".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .._roles import Kind, Role
from .case import Case, Family, cotangent, inexact, needs_f, random_like, rel, short
from .report import CheckResult, not_checked


@dataclass
class _Run:
    """One role as JAX runs it: a function of `inputs` (each named) giving its outputs."""

    what: str
    inputs: list
    in_names: list[str]
    out_names: list[str]
    fn: Callable
    linear: tuple[int, ...]  # the tangents or cotangents among the inputs


def _merged(values, where: Sequence[int], parts) -> list:
    full = list(values)
    for i, x in zip(where, parts):
        full[i] = x
    return full


def _seeds(case: Case) -> tuple[list, list[str]]:
    """Random cotangents of f's outputs, and their names."""
    cts = [random_like(np.zeros(av.shape, av.dtype), case.rng) for av in case.out_avals]
    return cts, [f"cotangent of output {k}" for k in range(len(cts))]


def _runs(case: Case) -> Iterator[_Run | CheckResult]:
    """The roles batched by vmap of their own (the reverse roles are batched by vmap(grad)):
    f, a nonlinear op's JVP and its transpose in its linear_in arguments; or a "not
    checked" row for a role the op lacks."""
    args, call, m, diff = case.args, case.call, len(case.args), case.differentiable
    names = [f"argument {i}" for i in range(m)]
    yield _Run("the function", list(args), names, case.out_names, call, ())
    if case.kind is not Kind.NONLINEAR or not diff:
        return  # linear ops: their JVP is f

    def at(prim, where, parts):
        return call(*_merged(prim, where, parts))

    if (why := case.missing("jvp")) is not None:
        yield not_checked("vmap vs loop", "the JVP", why)
    else:

        def jvp(*a):
            prim = a[:m]
            f = lambda *d: at(prim, diff, d)
            return list(jax.jvp(f, tuple(prim[i] for i in diff), tuple(a[m:]))[1])

        yield _Run(
            "the JVP",
            [*args, *(random_like(args[i], case.rng) for i in diff)],
            [*names, *(f"tangent of argument {i}" for i in diff)],
            [f"tangent of {name}" for name in case.out_names],
            jvp,
            tuple(range(m, m + len(diff))),
        )
    lin = case.linear_args
    if not lin:
        return
    what = "the transpose in the linear_in arguments (through the VJP)"
    if (why := case.missing("vjp")) is not None:
        yield not_checked("vmap vs loop", what, why)
        return
    rest = [k for k in range(m) if k not in lin]
    cts, ct_names = _seeds(case)

    def transpose(*a):
        prim = _merged([None] * m, rest, a[: len(rest)])
        f = lambda *ys: at(prim, lin, ys)
        cts = [cotangent(c, av.dtype) for c, av in zip(a[len(rest) :], case.out_avals)]
        return list(jax.linear_transpose(f, *(args[i] for i in lin))(cts))

    ins = [*(args[k] for k in rest), *cts]
    yield _Run(
        what,
        ins,
        [*(names[k] for k in rest), *ct_names],
        [f"cotangent of argument {i}" for i in lin],
        transpose,
        tuple(range(len(rest), len(ins))),
    )


# --- one vmap against the loop ---------------------------------------------------------------


@dataclass
class _Job:
    """One batched call of a role, and the loop of its unbatched calls to compare it with."""

    check: str
    what: str  # the role and how its inputs are batched
    out_names: list[str]
    out_axes: int  # 0 or -1
    ins: list  # the batched inputs
    batched: Callable  # of `ins`: the outputs, batched along out_axes
    loop: Callable  # of `ins`: the unbatched calls' outputs, stacked along out_axes


def _stacked(case: Case, x, axis: int):
    """`batch_size` versions of `x` (the first x itself), stacked along `axis`."""
    x = np.asarray(x)
    versions = [
        x
        if b == 0 or not inexact(x)
        else np.asarray(x + 0.1 * b * random_like(x, case.rng), x.dtype)
        for b in range(case.batch_size)
    ]
    return np.moveaxis(np.stack(versions), 0, axis)


def _batched_names(run: _Run, in_axes) -> str:
    batched = [(name, a) for name, a in zip(run.in_names, in_axes) if a is not None]
    if len(batched) == 1:
        return f"{batched[0][0]} at axis {batched[0][1]}"
    axes = tuple(a for _, a in batched)
    if len(batched) == len(run.in_names):
        return f"all inputs at axes {axes}"
    return f"{', '.join(name for name, _ in batched)} at axes {axes}"


def _job(case: Case, check: str, run: _Run, in_axes, out_axes: int, batched=None) -> _Job:
    """`run` batched by `batched` (default: vmap with these axes) against a loop."""
    size = case.batch_size

    def loop(*ins):
        calls = [
            run.fn(*(x if a is None else jnp.take(x, b, axis=a) for x, a in zip(ins, in_axes)))
            for b in range(size)
        ]
        return [jnp.stack(outs, axis=out_axes) for outs in zip(*calls)]

    return _Job(
        check,
        f"{run.what}: {_batched_names(run, in_axes)}",
        run.out_names,
        out_axes,
        [x if a is None else _stacked(case, x, a) for x, a in zip(run.inputs, in_axes)],
        batched or jax.vmap(run.fn, in_axes=list(in_axes), out_axes=out_axes),
        loop,
    )


def _evaluate(case: Case, jobs: list[_Job]) -> list[list[CheckResult]]:
    """The rows of each job; all run in one compiled program (compiling is most of the
    time), or, if that raises, each in its own, to find the one that raised."""
    try:
        both = jax.jit(lambda ins: [(j.batched(*i), j.loop(*i)) for j, i in zip(jobs, ins)])
        results: list | None = both([j.ins for j in jobs])
    except Exception:
        results = None
    if results is None:
        return [list(_job_rows(case, job, None)) for job in jobs]
    return [list(_job_rows(case, job, result)) for job, result in zip(jobs, results)]


def _job_rows(case: Case, job: _Job, results) -> Iterator[CheckResult]:
    if results is not None:
        got, want = results
    else:
        try:
            want = jax.jit(job.loop)(*job.ins)
        except Exception as exc:
            yield not_checked(job.check, job.what, f"unbatched, it raised {short(exc)}")
            return
        try:
            got = jax.jit(job.batched)(*job.ins)
        except Exception as exc:
            target = f"{job.what} -> ..."
            yield CheckResult(job.check, target, "-", np.inf, 0.0, f"it raised {short(exc)}")
            return
    for name, g, w in zip(job.out_names, got, want):
        axis = 0 if job.out_axes == 0 else np.ndim(w) - 1
        target = f"{job.what} -> {name} at axis {axis}"
        tol = case.tol("exact", w.dtype) * 10
        yield case.row(job.check, target, w.dtype, rel(g, w, same_nonfinite=True), tol)


def _vmap_jobs(case: Case) -> Iterator[_Job | CheckResult]:
    for run in _runs(case):
        if isinstance(run, CheckResult):
            yield run
            continue
        k = len(run.inputs)
        if run.linear:
            first = [[0 if j in run.linear else None for j in range(k)]]
        else:
            first = [[0 if j == i else None for j in range(k)] for i in range(k)]
        last = [np.ndim(x) for x in run.inputs]
        for in_axes in first:
            yield _job(case, "vmap vs loop", run, in_axes, 0)
        if last not in first:
            yield _job(case, "vmap vs loop", run, last, -1)


# --- vmap(grad), grad(vmap) ------------------------------------------------------------------


def _reverse(case: Case) -> str:
    return {
        Kind.LINEAR: "the transpose",
        Kind.MULTILINEAR: "the transposes",
        Kind.NONLINEAR: "the VJP",
    }[case.kind]


def _grad_jobs(case: Case) -> Iterator[_Job | CheckResult]:
    """The reverse roles (transposes, VJP) batched: by vmap of the gradient, and by the
    gradient of a vmapped f."""
    args, call, m = case.args, case.call, len(case.args)
    rev = []
    for i in case.differentiable:
        why = case.missing(case.reverse_role(i))
        if why is None:
            rev.append(i)
            continue
        what = Role.parse(case.reverse_role(i)).describe()
        yield not_checked("vmap(grad) vs loop", what, why)
        yield not_checked("grad(vmap) vs loop", what, why)
    if not rev:
        return
    cts, ct_names = _seeds(case)

    def weighted(u, ys):
        return sum(jnp.real(jnp.sum(c * y)) for c, y in zip(u, ys))

    def grad(*a):
        prim, u = a[:m], a[m:]
        phi = lambda *d: weighted(u, call(*_merged(prim, rev, d)))
        return list(jax.grad(phi, argnums=tuple(range(len(rev))))(*(prim[i] for i in rev)))

    run = _Run(
        _reverse(case),
        [*args, *cts],
        [*(f"argument {i}" for i in range(m)), *ct_names],
        [f"gradient of argument {i}" for i in rev],
        grad,
        tuple(range(m, m + len(cts))),
    )
    seeds_alone = [None] * m + [0] * len(cts)
    last = [np.ndim(x) for x in run.inputs]
    yield _job(case, "vmap(grad) vs loop", run, seeds_alone, 0)
    yield _job(case, "vmap(grad) vs loop", run, last, -1)

    def grad_of_vmap(*a):
        prim, u = a[:m], a[m:]
        vcall = jax.vmap(call, in_axes=last[:m], out_axes=-1)
        phi = lambda *d: weighted(u, vcall(*_merged(prim, rev, d)))
        return list(jax.grad(phi, argnums=tuple(range(len(rev))))(*(prim[i] for i in rev)))

    yield _job(case, "grad(vmap) vs loop", run, last, -1, grad_of_vmap)


def _rows(case: Case) -> Iterator[CheckResult]:
    items = [*_vmap_jobs(case), *(_grad_jobs(case) if case.differentiable else ())]
    jobs = [item for item in items if isinstance(item, _Job)]
    rows = iter(_evaluate(case, jobs))
    for item in items:  # in order: a role's "not checked" row where its rows would be
        yield from next(rows) if isinstance(item, _Job) else [item]


FAMILY = Family(
    name="vmap",
    checks=("vmap vs loop", "vmap(grad) vs loop", "grad(vmap) vs loop"),
    roles=frozenset({"f", "T", "T<i>", "jvp", "vjp"}),
    options=frozenset({"vectorized", "fixed", "linear_in"}),
    applies=needs_f,
    rows=_rows,
)
