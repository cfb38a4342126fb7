"""Benchmark cases, run inside a worker process (one per Python environment).

`python _cases.py --serve` reads JSON requests on stdin, one per line:
    {"impl": "jaxbind", "case": "double", "size": 1000, "reps": 200}
and answers each with {"t": seconds per call, "inside": seconds per call spent
inside the callable (or null)}. The "jaxbind" implementation uses only the
JAXbind 1.3 API, so the same code times this project and JAXbind 1.3.1 (run in
its own virtual environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from _harness import clock, time_it  # this directory is sys.path[0]

_inside = [0.0]


def _double(out, args, kwargs_dump):
    t = clock()
    np.multiply(args[0], 2, out=out[0])
    _inside[0] += clock() - t


def _empty(out, args, kwargs_dump):
    pass


def _double4(out, args, kwargs_dump):
    for o, a in zip(out, args):
        np.multiply(a, 2, out=o)


def _double_batched(out, args, kwargs_dump):
    np.multiply(args[0], 2, out=out[0])


_private = {}


def _traffic(out, args, kwargs_dump):
    """The memory traffic of `double` at size n, on private NumPy arrays (see "traffic")."""
    n = int(jaxbind_load_kwargs(kwargs_dump)["n"])
    if n not in _private:
        _private.clear()
        _private[n] = (np.ones(n, np.float32), np.empty(n, np.float32))
    src, dst = _private[n]
    t = clock()
    np.multiply(src, 2, out=dst)
    out[0][...] = args[0]
    _inside[0] += clock() - t


def jaxbind_load_kwargs(kwargs_dump):
    import jaxbind

    return jaxbind.load_kwargs(kwargs_dump)


def _abstract(*args, **kwargs):
    return tuple((a.shape, a.dtype) for a in args)


def _abstract_batched(x, **kwargs):
    ba = kwargs.get("batch_axes")
    return ((x.shape, x.dtype, ba[0][-1] if ba else ()),)


def _jaxbind_ops():
    import jaxbind

    return dict(
        double=jaxbind.get_linear_call(_double, _double, _abstract, _abstract),
        empty=jaxbind.get_linear_call(_empty, _empty, _abstract, _abstract),
        double4=jaxbind.get_linear_call(_double4, _double4, _abstract, _abstract),
        traffic=jaxbind.get_linear_call(_traffic, _traffic, _abstract, _abstract),
        native=jaxbind.get_linear_call(
            _double_batched,
            _double_batched,
            _abstract_batched,
            _abstract_batched,
            func_can_batch=True,
        ),
        kernel=jaxbind.get_linear_call(
            jaxbind.kernel(_double_kernel), jaxbind.kernel(_double_kernel), _abstract, _abstract
        ),
    )


def _double_kernel(out, x):  # a numba kernel: jaxbind's C++ loop calls it per batch element
    for i in range(x.size):
        out[i] = 2 * x[i]


def _pure_callback(x):
    return jax.pure_callback(
        lambda a: 2 * a, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="sequential"
    )


@jax.custom_vjp
def _pure_callback_ad(x):
    return _pure_callback(x)


_pure_callback_ad.defvjp(lambda x: (_pure_callback(x), None), lambda _, ct: (_pure_callback(ct),))


def _buffer_callback(n_in=1):
    from jax.experimental.buffer_callback import buffer_callback

    def cb(ctx, out, *args):
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o, a in zip(outs, args):
            np.multiply(np.asarray(a), 2, out=np.asarray(o))

    def call(*xs):
        shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs)
        return buffer_callback(cb, shapes if n_in > 1 else shapes[0])(*xs)

    return call


_floor_lib = None  # the compiled _floor.cc, loaded on first use
_floor_slots = [0]  # the next free slot of its callable table


def _build_floor(source: str, stem: str, *includes: str):
    """This directory's C++ `source` built once per Python and JAX version (against JAX's
    FFI headers, Python's and `includes`) into .build/<stem>-<tag>.so: its path."""
    import pathlib
    import sysconfig

    here = pathlib.Path(__file__).parent
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-jax{jax.__version__}"
    so = here / ".build" / f"{stem}-{tag}.so"
    if not so.exists():
        so.parent.mkdir(exist_ok=True)
        tmp = so.with_name(f"{so.name}.{os.getpid()}.tmp")  # renamed when complete
        flags = ["-O2", "-std=c++17", "-shared", "-fPIC", "-w"]
        headers = [jax.ffi.include_dir(), *includes, sysconfig.get_paths()["include"]]
        cmd = ["c++", *flags, *(f"-I{h}" for h in headers), str(here / source), "-o", str(tmp)]
        subprocess.run(cmd, check=True)
        os.replace(tmp, so)
    return so


def _floor_op(callable_, outs, args, kwargs_dump=b""):
    """A custom call that runs `callable_(outs, args, kwargs_dump)` through _floor.cc."""
    global _floor_lib
    import ctypes

    if _floor_lib is None:
        so = _build_floor("_floor.cc", "libfloor")
        _floor_lib = ctypes.PyDLL(str(so))
        _floor_lib.floor_set.argtypes = [ctypes.c_int64, ctypes.py_object]
        jax.ffi.register_ffi_target(
            "jaxbind_bench_floor", jax.ffi.pycapsule(_floor_lib.floor_handler), platform="cpu"
        )
    slot = _floor_slots[0]
    _floor_slots[0] += 1
    if _floor_lib.floor_set(slot, (callable_, outs, args, kwargs_dump)) != 0:
        raise RuntimeError("floor_set failed")
    return lambda *xs: jax.ffi.ffi_call(
        "jaxbind_bench_floor", tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs)
    )(*xs, slot=np.int64(slot))


def _floor_double(n, callable_=None):
    """The floor of `double` at size n: the same callable, on private arrays."""
    op = _floor_op(callable_ or _double, (np.empty(n, np.float32),), (np.ones(n, np.float32),))

    @jax.custom_vjp
    def f(x):
        return op(x)[0]

    f.defvjp(lambda x: (f(x), None), lambda _, ct: (f(ct),))
    return f


def build(impl: str, case: str, size: int):
    """-> (function to time, its argument) for one implementation and case."""
    n = int(size)
    x = jnp.ones(n, jnp.float32)
    if case in ("double", "eager", "first_call"):
        f = {
            "jnp": lambda x: 2 * x,
            "pure_callback": _pure_callback,
            "buffer_callback": _buffer_callback() if impl == "buffer_callback" else None,
            "floor": _floor_double(n) if impl == "floor" else None,
            "jaxbind": (lambda op: lambda x: op(x)[0])(_jaxbind_ops()["double"])
            if impl == "jaxbind"
            else None,
        }[impl]
        if case == "eager":
            return f, x
        if case == "first_call":
            return (lambda x: jax.jit(lambda y: f(y))(x)), x  # a new function each call
        return jax.jit(f), x
    if case == "traffic":  # a 1-element op whose callable moves as many bytes as `double`
        op = _jaxbind_ops()["traffic"]
        return jax.jit(lambda x: op(x, n=n)[0]), jnp.ones(1, jnp.float32)
    if case == "empty":
        f = {
            "jaxbind": lambda x: _jaxbind_ops()["empty"](x)[0],
            "jnp": lambda x: x,
            "floor": _floor_double(n, _empty) if impl == "floor" else None,
        }[impl]
        return jax.jit(f), x
    if case == "io4":
        xs = tuple(jnp.ones(n, jnp.float32) + k for k in range(4))
        if impl == "jaxbind":
            op = _jaxbind_ops()["double4"]
            f = lambda *xs: op(*xs)
        elif impl == "jnp":
            f = lambda *xs: [2 * a for a in xs]
        elif impl == "buffer_callback":
            f = _buffer_callback(4)
        else:
            f = lambda *xs: [_pure_callback(a) for a in xs]
        g = jax.jit(f)
        return (lambda xs: g(*xs)), xs
    if case == "grad":
        f = {
            "jnp": lambda x: 2 * x,
            "pure_callback": _pure_callback_ad,
            "floor": _floor_double(n) if impl == "floor" else None,
            "jaxbind": (lambda op: lambda x: op(x)[0])(_jaxbind_ops()["double"])
            if impl == "jaxbind"
            else None,
        }[impl]
        return jax.jit(jax.grad(lambda x: jnp.sum(f(x)))), x
    if case in ("vmap", "vmap_native", "vmap_kernel"):
        xb = jnp.ones((64, n), jnp.float32)
        if impl == "jaxbind":
            op = _jaxbind_ops()[{"vmap": "double", "vmap_native": "native"}.get(case, "kernel")]
            f = lambda x: op(x)[0]
        elif impl == "jnp":
            f = lambda x: 2 * x
        elif impl == "pure_callback":
            vm = "sequential" if case == "vmap" else "expand_dims"
            f = lambda x: jax.pure_callback(
                lambda a: 2 * a,
                jax.ShapeDtypeStruct(x.shape, x.dtype),
                x,
                vmap_method=vm,
            )
        else:
            raise KeyError(impl)
        return jax.jit(jax.vmap(f)), xb
    raise KeyError(case)


def timed(fn, arg, reps: int) -> tuple[float, float]:
    """-> (seconds per call, seconds per call inside the callable) over `reps` calls."""
    jax.block_until_ready(fn(arg))  # untimed: settles allocations after switching cases
    _inside[0] = 0.0
    t = time_it(lambda: fn(arg), iters=reps, warmup=0).median
    return t, _inside[0] / reps


def import_time(impl: str) -> float:
    module = {"jaxbind": "jaxbind", "jnp": "jax"}.get(impl, "jax")
    run = lambda: subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return time_it(run, warmup=0).median


def serve():
    cache = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["case"] == "import":
                reply = {"t": import_time(req["impl"]), "inside": None}
            else:
                key = (req["impl"], req["case"], req["size"])
                if key not in cache:
                    fn, arg = build(*key)
                    jax.block_until_ready(fn(arg))  # compile once
                    cache[key] = (fn, arg)
                t, inside = timed(*cache[key], req["reps"])
                reply = {"t": t, "inside": inside if req["impl"] in ("jaxbind", "floor") else None}
        except Exception as exc:  # an implementation that lacks this case
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    if "--versions" in sys.argv:
        import importlib.metadata as md

        print(
            json.dumps(
                {
                    "python": sys.version.split()[0],
                    "jax": jax.__version__,
                    "jaxbind": md.version("jaxbind"),
                    "numpy": np.__version__,
                }
            )
        )
    else:
        serve()
