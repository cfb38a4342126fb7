"""The transformations of the conformance matrix, the comparison of their results, and one
cell run from start to end (`check_cell`: in pytest's process, or in matrix_cases.py's)."""

from __future__ import annotations

import contextlib
import json
import pickle
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxbind

from .bodies import C_VALUE, Built, build
from .forms import BASE, FORMS, REPLACED
from .matrix import OPTION_VARIANTS, Cell

# --- the transformations ---------------------------------------------------------------------


def _inexact(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def _ones_like(x):
    if not _inexact(x.dtype):
        return np.zeros(np.shape(x), jax.dtypes.float0)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return np.full(np.shape(x), 1 + 0.5j, x.dtype)
    return np.ones(np.shape(x), x.dtype)


def loss(outs):
    """A real scalar of every output (integer and boolean ones count, with no derivative)."""
    total = 0.0
    for o in outs:
        if _inexact(o.dtype):
            total = total + jnp.sum(jnp.real(o * o))
        else:
            total = total + jnp.sum(o.astype(jnp.float32))
    return total


def _split(xs):
    """The positions of the inexact inputs (differentiated), and a function putting
    values for them back among the others."""
    where = [i for i, x in enumerate(xs) if _inexact(x.dtype)]

    def merge(*diff):
        full = list(xs)
        for i, d in zip(where, diff):
            full[i] = d
        return tuple(full)

    return where, merge


def _grad_fn(F, xs):
    where, merge = _split(xs)

    def g(*all_xs):
        w, m = _split(all_xs)
        return jax.grad(lambda *d: loss(F(*m(*d))), argnums=tuple(range(len(w))))(
            *[all_xs[i] for i in w]
        )

    return g


def run(transform: str, F, xs, batched):
    """`transform` applied to F (a function of the inputs returning a tuple of outputs)."""
    if transform == "eager":
        return F(*xs)
    if transform == "jit":
        return jax.jit(F)(*xs)
    if transform == "grad":
        return _grad_fn(F, xs)(*xs)
    if transform == "jvp":
        return jax.jvp(F, xs, tuple(map(_ones_like, xs)))
    if transform == "vjp":
        outs, pull = jax.vjp(F, *xs)
        return outs, pull(tuple(map(_ones_like, outs)))
    if transform == "vmap":
        return jax.vmap(F)(*batched)
    if transform == "vmap_grad":
        return jax.vmap(_grad_fn(F, xs))(*batched)
    if transform == "hessian":
        where, merge = _split(xs)
        rest = [xs[i] for i in where[1:]]
        return jax.hessian(lambda d: loss(F(*merge(d, *rest))))(xs[where[0]])
    if transform == "linear_transpose":
        where, merge = _split(xs)
        outs = jax.eval_shape(F, *xs)
        cts = tuple(_ones_like(np.zeros(o.shape, o.dtype)) for o in outs)
        return jax.linear_transpose(lambda *d: F(*merge(*d)), *[xs[i] for i in where])(cts)
    raise LookupError(transform)


def c_host_program(F, xs):
    """What a cell's bundle computes ("c_host"): F's outputs and the gradient of the loss
    (every role of the op, the derivatives' too)."""
    grad = _grad_fn(F, xs)
    return lambda *a: (F(*a), grad(*a))


def with_switch(transform: str, F):
    """F under the switch the transformation names (use_reference*), else F."""
    if transform == "use_reference_in_trace":

        def inside(*xs):
            with jaxbind.use_reference():
                return F(*xs)

        return inside
    return F


@contextlib.contextmanager
def switch(transform: str):
    if transform == "use_reference":
        with jaxbind.use_reference():
            yield
    elif transform == "use_reference_strict":
        with jaxbind.use_reference(strict=True):
            yield
    else:
        yield


# --- comparing ---------------------------------------------------------------------------------


def tolerance(dtype) -> float:
    dtype = np.dtype(dtype)
    return 2e-5 if dtype in (np.float32, np.complex64) else 1e-12


def assert_same(got, want, where: str):
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree, f"{where}: structure {got_tree} != {want_tree}"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{where}: leaf {i} has shape {g.shape}, not {w.shape}"
        assert g.dtype == w.dtype, f"{where}: leaf {i} has dtype {g.dtype}, not {w.dtype}"
        if w.dtype == jax.dtypes.float0:
            continue
        if not _inexact(w.dtype):
            np.testing.assert_array_equal(g, w, err_msg=f"{where}: leaf {i}")
            continue
        scale = max(1.0, float(np.max(np.abs(w))) if w.size else 1.0)
        err = float(np.max(np.abs(g - w))) / scale if w.size else 0.0
        assert err <= tolerance(w.dtype), f"{where}: leaf {i} off by {err:.3g} (relative)"


# --- one cell ----------------------------------------------------------------------------------


def _op(cell: Cell, base: float = BASE, replace: bool = False) -> Built:
    options = OPTION_VARIANTS[cell.option][cell.api]
    return build(
        cell.kind, cell.api, cell.dtype, name=cell.name, base=base, replace=replace, options=options
    )


def _twin(cell: Cell, base: float = BASE):
    form = FORMS[cell.dtype]
    return lambda *xs: form.twin(*xs, c=C_VALUE, base=base)


def inputs(cell: Cell):
    form = FORMS[cell.dtype]
    return form.inputs_for(seed=0), form.inputs_for(seed=1, batch=3)


def expected(cell: Cell, xs, batched):
    """The twin's answer to the cell (raises where JAX refuses the twin)."""
    t, twin = cell.transform, _twin(cell)
    if t == "eager":
        form = FORMS[cell.dtype]
        assert_same(twin(*xs), form.numpy_f(*xs, c=C_VALUE), f"{cell.id}: the twin against NumPy")
    if t in ("portable", "use_reference", "use_reference_strict", "use_reference_in_trace"):
        return jax.jit(twin)(*xs)
    if t == "replace":
        return _grad_fn(twin, xs)(*xs), _grad_fn(_twin(cell, REPLACED), xs)(*xs)
    if t == "check":
        return True
    if t == "pickle":
        return twin(*xs)
    if t == "c_host":
        return jax.tree_util.tree_leaves(jax.jit(c_host_program(twin, xs))(*xs))
    return run(t, twin, xs, batched)


class NativeBodyRan(AssertionError):
    pass


def in_c_host(cell: Cell, built: Built, xs, host):
    """The cell's bundle run by the C host (`host()`: tests/support/pjrt_host.py's Host,
    which skips without a plugin): its outputs, flat. Only C kernels stay native calls in
    it; the bundle refuses an op it cannot run, naming it, before any host is needed."""
    with tempfile.TemporaryDirectory(prefix="jaxbind-c-host-") as folder:
        path = jaxbind.bundle(c_host_program(built.call, xs), *xs, path=Path(folder) / "b")
        calls = json.loads((Path(path) / "manifest.json").read_text())["calls"]
        native = cell.kind == "c" and cell.option != "prefer_reference"
        assert {c["binding"] for c in calls} == ({cell.name} if native else set()), (
            f"{cell.id}: the bundle's native calls are {calls}"
        )
        done, outs = host().run(path, *xs)
        if done.returncode != 0:
            raise RuntimeError(f"{cell.id}: the C host failed: {done.stderr}")
        assert "libpython mapped: no" in done.stdout, done.stdout
        return outs


def actual(cell: Cell, xs, batched, host=None):
    """The op's answer to the cell (`host`: the C host's maker, for "c_host")."""
    t = cell.transform
    if t == "replace":
        first = _op(cell)
        compiled = jax.jit(_grad_fn(first.call, xs))
        old = compiled(*xs)
        second = _op(cell, REPLACED, replace=True)
        try:
            again = compiled(*xs)  # the program of the first definition
        except Exception as e:  # or an error naming the op
            if cell.name not in message(e):
                raise
            again = old
        return again, jax.jit(_grad_fn(second.call, xs))(*xs)
    built = _op(cell)
    F = built.call
    if t == "portable":
        exported = jaxbind.export(jax.jit(F), portable=True)(*xs)
        return jax.export.deserialize(exported.serialize()).call(*xs)
    if t in ("use_reference", "use_reference_strict", "use_reference_in_trace"):
        before = len(built.calls)
        with switch(t):
            got = jax.jit(with_switch(t, F))(*xs)
        jax.block_until_ready(got)
        if len(built.calls) != before:
            raise NativeBodyRan(f"{cell.id}: the native body ran under the switch")
        return got
    if t == "check":
        jaxbind.testing.check(built.op, *xs, c=C_VALUE, verbose=False)
        return True
    if t == "pickle":
        return pickle.loads(pickle.dumps(built.op))(*xs, c=C_VALUE)
    if t == "c_host":
        return in_c_host(cell, built, xs, host)
    return run(t, F, xs, batched)


def message(error: BaseException) -> str:
    """All an error says to a user reading its traceback: its text, its notes, and those of
    the errors it was raised from."""
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts += [str(error), *getattr(error, "__notes__", ())]
        error = error.__cause__ or error.__context__
    return "\n".join(parts)


def judge(cell: Cell, got, want) -> None:
    """Raise AssertionError unless the op's outcome `got` fits the twin's `want` (each
    ("value", v) or ("error", exception))."""
    where = f"cell {cell.id}"
    if want[0] == "error":
        assert got[0] == "error", (
            f"{where}: JAX refuses the twin ({type(want[1]).__name__}: {want[1]}), "
            f"the op gives a value"
        )
        return
    if (
        cell.transform == "use_reference_in_trace"
        and got[0] == "error"
        and not isinstance(got[1], NativeBodyRan)
        and "entered inside a function that JAX is tracing" in message(got[1])
    ):
        return  # refused inside a trace, saying where to put the switch
    refusal = cell.refusal()
    if refusal is not None:
        assert got[0] == "error", f"{where}: the op must refuse ({refusal}), it gives a value"
        assert cell.name in message(got[1]), f"{where}: the refusal does not name the op: {got[1]}"
        assert not isinstance(got[1], jax.errors.JaxRuntimeError), (
            f"{where}: refused only when the program ran, not when it was made: {got[1]}"
        )
        return
    if got[0] == "error":
        error = got[1]
        raise AssertionError(f"{where}: {type(error).__name__}: {error}") from error
    assert_same(got[1], want[1], where)


def outcome(fn):
    """("value", what fn returns, computed), or ("error", what it raised)."""
    try:
        return ("value", jax.block_until_ready(fn()))
    except Exception as e:
        return ("error", e)


def check_cell(cell: Cell, host=None) -> None:
    """One cell judged (`host`: a function giving the C host, for "c_host"; it may skip)."""
    xs, batched = inputs(cell)
    want = outcome(lambda: expected(cell, xs, batched))
    got = outcome(lambda: actual(cell, xs, batched, host))
    judge(cell, got, want)


# --- the matrix of mistakes ---------------------------------------------------------------------


def check_misuse(case) -> None:
    """A wrongly defined op (misuses.py): the right answer or an error naming it; check
    fails it."""
    from .misuses import build_misuse

    form = FORMS[case.form_key]
    xs, batched = form.inputs_for(seed=0), form.inputs_for(seed=1, batch=3)
    twin = lambda *a: form.twin(*a, c=C_VALUE, base=BASE)
    where = f"misuse {case.id}"
    t = case.transform

    def op_side():
        built = build_misuse(case)
        F = built.call
        if t == "check":
            jaxbind.testing.check(built.op, *xs, c=C_VALUE, verbose=False)
            raise AssertionError(f"{where}: jaxbind.testing.check passed a wrong op")
        if t == "portable":
            exported = jaxbind.export(jax.jit(F), portable=True)(*xs)
            return jax.export.deserialize(exported.serialize()).call(*xs)
        if t.startswith("use_reference"):
            with switch(t):
                return jax.jit(F)(*xs)
        return run(t, F, xs, batched)

    if t == "check":
        try:
            op_side()
        except AssertionError as e:
            assert "check passed a wrong op" not in str(e), str(e)
            assert case.name in message(e), f"{where}: check's failure does not name the op: {e}"
        return
    got = outcome(op_side)
    if t in ("portable", "use_reference", "use_reference_strict"):
        want = outcome(lambda: jax.jit(twin)(*xs))
    else:
        want = outcome(lambda: run(t, twin, xs, batched))
    if got[0] == "error":
        assert case.name in message(got[1]), (
            f"{where}: the error does not name the op: {type(got[1]).__name__}: {got[1]}"
        )
        return
    assert want[0] == "value", f"{where}: JAX refuses the twin, the op gives a value"
    assert_same(got[1], want[1], where)
