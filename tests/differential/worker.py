"""Runs rows of the differential table (calls.py) with whichever jaxbind this Python has.

    python worker.py        # serves: pickled batches in on stdin, outcomes out on stdout

The same file runs under JAXbind 1.3.1 (in its own venv, which has jax, numpy, ducc0 and
jaxbind 1.3.1, nothing else) and under this project's jaxbind: so it uses only the API
that both have, and the standard library. A row is ``(id, program, params)``: `program`
names one of the PROGRAMS below, `params` is plain data (numbers, strings, NumPy values).

Protocol: each frame is a 4-byte big-endian length and a pickle. The first frame out is
the versions; then, per batch in (a list of rows), one ``("start", id)`` frame before each
row and one ``("done", id, outcome)`` after it, so that the parent knows which row a
crash interrupted. An outcome is ``{"status": "ok", "value": ..., "seen": ...}`` (NumPy
arrays, lists, canonical kwargs) or ``{"status": "error", "type": ..., "message": ...}``.
DUCC's diagnostics (``verbosity``) print to the process's stdout: the protocol has its
own copy of stdout's descriptor, and file descriptor 1 goes to stderr.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import struct
import sys
import time
import traceback
import warnings

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxbind  # noqa: E402

REFERENCE = jaxbind.__version__.startswith("1.")  # JAXbind 1.3.1, not this project

# --- what the callables and abstract functions saw ------------------------------------

SEEN: list = []


def canon(value):
    """`value` as comparable plain data that keeps its type: ``(type name, contents)``."""
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return (f"numpy.{type(value).__name__}", repr(value.item()))
    if isinstance(value, dict):  # in any order (jaxbind sorts the keyword arguments)
        return ("dict", tuple(sorted((canon(k), canon(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, frozenset) else value
        return (type(value).__name__, tuple(canon(v) for v in items))
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None))):
        return (type(value).__name__, repr(value))
    return (f"{type(value).__module__}.{type(value).__qualname__}", repr(value))


def _record(where, kwargs):
    SEEN.append((where, canon(dict(kwargs))))


# --- the reference ops of the core API ---------------------------------------------------
#
# Elementwise, so that vectorized batching (func_can_batch) needs no reshaping: the fixed
# arguments are scalars (their sum scales the output), the others have any shape.


def _scale(args, nfixed):
    return 3.0 + sum(float(a) for a in args[:nfixed])


def _out_axis(kwargs, index):
    batch = kwargs.get("batch_axes")
    return batch[index][-1] if batch and batch[index] else ()


def _linear_functions(nfixed):
    def f(out, args, kwargs_dump):
        kwargs = jaxbind.load_kwargs(kwargs_dump)
        _record("f", kwargs)
        out[0][...] = _scale(args, nfixed) * args[nfixed]

    def f_T(out, args, kwargs_dump):
        kwargs = jaxbind.load_kwargs(kwargs_dump)
        _record("f_T", kwargs)
        out[0][...] = _scale(args, nfixed) * args[nfixed]

    def abstract(*args, **kwargs):
        _record("abstract", kwargs)
        x = args[nfixed]
        return ((x.shape, x.dtype, _out_axis(kwargs, nfixed)),)

    return f, f_T, abstract, abstract


def _nonlinear_functions(nfixed):
    def f(out, args, kwargs_dump):
        _record("f", jaxbind.load_kwargs(kwargs_dump))
        out[0][...] = _scale(args, nfixed) * np.sin(args[nfixed])

    def jvp(out, args, kwargs_dump):  # primals, then the tangent of x
        _record("jvp", jaxbind.load_kwargs(kwargs_dump))
        out[0][...] = _scale(args, nfixed) * np.cos(args[nfixed]) * args[nfixed + 1]

    def vjp(out, args, kwargs_dump):  # primals, then the cotangent of the output
        _record("vjp", jaxbind.load_kwargs(kwargs_dump))
        out[0][...] = _scale(args, nfixed) * np.cos(args[nfixed]) * args[nfixed + 1]

    def abstract(*args, **kwargs):
        _record("abstract", kwargs)
        x = args[nfixed]
        return ((x.shape, x.dtype, _out_axis(kwargs, nfixed)),)

    def abstract_reverse(*args, **kwargs):
        _record("abstract_reverse", kwargs)
        x = args[nfixed]
        return ((x.shape, x.dtype, _out_axis(kwargs, nfixed)),)

    return f, (jvp, vjp), abstract, abstract_reverse


def _multilinear_functions():
    """f(x, y) = x * y with one transpose per argument."""

    def f(out, args, kwargs_dump):
        _record("f", jaxbind.load_kwargs(kwargs_dump))
        out[0][...] = args[0] * args[1]

    def t0(out, args, kwargs_dump):  # y, ct -> ct of x
        out[0][...] = args[0] * args[1]

    def t1(out, args, kwargs_dump):  # x, ct -> ct of y
        out[0][...] = args[0] * args[1]

    def abstract(x, y, **kwargs):
        return ((x.shape, x.dtype),)

    def abstract_t(other, ct, **kwargs):
        return ((ct.shape, ct.dtype),)

    return f, (t0, t1), abstract, (abstract_t, abstract_t)


def _seq(kind, value):
    return list(value) if kind == "list" else tuple(value)


def _make_op(p):
    """The op a core-API row describes: its factory, how its functions and options are
    passed (``p["options"]`` verbatim: the point of most rows)."""
    nfixed, api, options = p.get("nfixed", 0), p["api"], p.get("options", {})
    if api == "linear":
        f, f_T, abstract, abstract_T = _linear_functions(nfixed)
        if p.get("abstract_T_keyword"):
            return jaxbind.get_linear_call(
                f, f_T, abstract=abstract, abstract_T=abstract_T, **options
            )
        return jaxbind.get_linear_call(f, f_T, abstract, abstract_T, **options)
    if api == "multilinear":
        f, ts, abstract, abstract_ts = _multilinear_functions()
        seq = p.get("sequence", "tuple")
        return jaxbind.get_linear_call(
            f, _seq(seq, ts), abstract, _seq(seq, abstract_ts), **options
        )
    f, derivatives, abstract, abstract_reverse = _nonlinear_functions(nfixed)
    derivatives = _seq(p.get("sequence", "tuple"), derivatives)
    if p.get("abstract_T_keyword"):
        return jaxbind.get_nonlinear_call(
            f, derivatives, abstract=abstract, abstract_reverse=abstract_reverse, **options
        )
    return jaxbind.get_nonlinear_call(f, derivatives, abstract, abstract_reverse, **options)


# --- transformations: how a row applies its op -------------------------------------------


def _apply(fn, args, p):
    """Run ``fn(*args)`` (a list of arrays) as ``p["transform"]`` says; argument
    ``p.get("diff", -1)`` is the one differentiated, transposed or batched.

    Under JAXbind 1.3.1, inside ``jit``: 1.3.1 keeps keyword arguments as primitive
    parameters, so an eager call reuses the program that an earlier call compiled for
    equal-hashing ones (in one process, ``inorm=2.0`` ran after ``inorm=2`` and failed
    alone). Under ``jit`` each row is on its own, and runs what an eager call in a fresh
    process runs (1.3.1's eager calls are its primitive under ``jit``). jaxbind's caches
    tell such keyword arguments apart: its rows run as written, eagerly where they say."""
    if REFERENCE:
        return jax.jit(lambda *a: _transformed(fn, list(a), p))(*args)
    return _transformed(fn, args, p)


def _transformed(fn, args, p):
    transform = p.get("transform", "call")
    i = p.get("diff", len(args) - 1) % len(args)
    x = args[i]

    def of_x(v):
        return fn(*args[:i], v, *args[i + 1 :])

    if transform == "call":
        return fn(*args)
    if transform == "jit":
        return jax.jit(fn)(*args)
    if transform == "vmap":
        axis, size = p.get("in_axis", 0), p.get("batch", 3)
        batched = jnp.stack([jnp.asarray(x) * (k + 1) for k in range(size)], axis=axis)
        return jax.jit(jax.vmap(of_x, in_axes=axis))(batched)
    if transform == "jvp":
        return jax.jvp(of_x, (x,), (p["tangent"],))
    if transform == "vjp":
        out, pullback = jax.vjp(of_x, x)
        return out, pullback([p["cotangent"]])
    if transform == "transpose":
        return jax.linear_transpose(of_x, x)([p["cotangent"]])
    if transform == "grad":  # jitted: eager, each jnp operation compiles anew in every row
        return jax.jit(jax.grad(lambda v: jnp.sum(jnp.abs(of_x(v)[0]) ** 2)))(x)
    raise ValueError(f"unknown transform {transform!r}")


# --- programs: one per kind of row ----------------------------------------------------


def program_core(p):
    op = _make_op(p)
    kwargs = p.get("kwargs", {})
    return _apply(functools.partial(op, **kwargs) if kwargs else op, list(p["args"]), p)


def program_load_kwargs(p):
    """load_kwargs of a JAXbind 1.3 dump: the pickled dict as a uint8 array."""
    dump = np.frombuffer(pickle.dumps(p["kwargs"]), dtype=np.uint8)
    return canon(jaxbind.load_kwargs(dump))


def _jaxducc0():
    from jaxbind.contrib import jaxducc0

    return jaxducc0


def program_fft(p):
    """jaxducc0.c2c or genuine_fht, called with the row's keyword arguments."""
    op = getattr(_jaxducc0(), p["op"])
    kwargs = p.get("kwargs", {})
    args = [p["x"]]
    out = _apply(lambda x: op(x, **kwargs), args, p)
    if p.get("check_input_intact"):  # was the caller's array left as it was?
        return out, np.asarray(args[0])
    return out


def program_sht(p):
    sht = _jaxducc0().get_healpix_sht(*p.get("factory_args", ()), **p.get("factory", {}))
    return _apply(lambda x: sht(x, **p.get("kwargs", {})), [p["x"]], p)


def program_nalm(p):
    return canon(_jaxducc0().nalm(*p["args"]))


def program_wgridder(p):
    op = _jaxducc0().get_wgridder(**p["factory"])
    args = [p["uvw"], p["freq"], p["image"]]
    kwargs = p.get("kwargs", {})  # at call time: they replace the factory's
    return _apply(lambda uvw, freq, image: op(uvw, freq, image, **kwargs), args, p)


PROGRAMS = {
    "core": program_core,
    "load_kwargs": program_load_kwargs,
    "fft": program_fft,
    "sht": program_sht,
    "nalm": program_nalm,
    "wgridder": program_wgridder,
}


# --- serving ------------------------------------------------------------------------------


def _plain(value):
    """Results as NumPy arrays in lists (JAX arrays, tuples and lists alike)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return np.asarray(value)
    return value


def run_row(program, params) -> dict:
    SEEN.clear()
    started, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = PROGRAMS[program](params)
            if program not in ("nalm", "load_kwargs"):  # these return canonical data
                value = _plain(jax.block_until_ready(value))
        except Exception as exc:  # the outcome of the row, not a failure of the worker
            return {
                "status": "error",
                "type": type(exc).__name__,
                "message": f"{exc}\n{traceback.format_exc(limit=-3)}"[-4000:],
                "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                "seconds": time.perf_counter() - started,
                "cpu_seconds": time.process_time() - cpu,
            }
    return {
        "status": "ok",
        "value": value,
        "seen": list(SEEN),
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu,
    }


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for dist in ("jax", "jaxlib", "numpy", "ducc0", "jaxbind"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def _read(stream):
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    return pickle.loads(stream.read(n))


def _write(stream, obj):
    data = pickle.dumps(obj, protocol=4)
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def serve():
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # DUCC's prints (verbosity) and anything else on stdout: to stderr
    sys.stdout = sys.stderr
    _write(proto, versions())
    stdin = sys.stdin.buffer
    while (batch := _read(stdin)) is not None:
        for row_id, program, params in batch:
            _write(proto, ("start", row_id))
            with contextlib.redirect_stdout(sys.stderr):
                outcome = run_row(program, params)
            _write(proto, ("done", row_id, outcome))
        _write(proto, ("batch", None))


if __name__ == "__main__":
    serve()
