"""CUDA libraries' plan-based C APIs as jaxbind ops: cuFFT and cufinufft.

Each op's body is a kernel for CUDA (``jaxbind.kernel(..., platform="cuda")``, kernel ABI
version 4) compiled into jaxbind's extension (cpp/cuda_libraries.h): it calls the library
on XLA's stream, without the GIL and without Python. The library is the installed one,
opened by its path, with no CUDA toolkit and no compiler: cuFFT as JAX's CUDA plugin
installs it (the ``nvidia-cufft`` wheel), cufinufft from its wheel. Each op's state (a C
state, ``jaxbind.c_state``) holds the library and the plans of one call site on one device:
made at the device's first call, used by every later call, destroyed with the program.

- `fft`: an unnormalized complex FFT over the last 1-3 axes (the leading ones a cuFFT
  batch), forward or inverse; its transpose is itself (the DFT matrix is symmetric).
- `nufft1`, `nufft2`: NUFFTs of types 1 and 2 in jax-finufft's calling convention (one
  transform per call: ``vmap`` loops), linear in the values, differentiable in the values
  and the points to any order (JVP and VJP are JAX functions of the two ops: type 1's
  transpose is type 2 with the same sign, and back).
  The points are set at every call (cufinufft's setpts): a plan depends on the grid, the
  sign and eps alone.

In a CPU program each op runs its JAX reference (``jnp.fft``; jaxbind's NUFFT reference,
by spreading and FFT), so one program serves both platforms. GPU results: see docs/gpu.md
(not yet run on a GPU).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import inspect
import math
import os
import pathlib
import re

import jax.numpy as jnp
import numpy as np

from .. import _ext
from .._kernels import kernel as _kernel
from .._kernels.c_state import c_state
from .._roles import jax_function
from .._state import state as jaxbind_state
from .ducc.reference.nufft import transform as _reference_transform

__all__ = ["fft", "library_path", "nufft1", "nufft2"]

_ENV = {"cufft": "JAXBIND_CUFFT_LIBRARY", "cufinufft": "JAXBIND_CUFINUFFT_LIBRARY"}


def library_path(name: str) -> str:
    """The path of CUDA library `name` ("cufft" or "cufinufft") that the ops open: the
    environment's ``JAXBIND_CUFFT_LIBRARY`` / ``JAXBIND_CUFINUFFT_LIBRARY`` if set; else
    one this process has loaded already (JAX's CUDA plugin loads cuFFT); else the one in
    its wheel (``nvidia-cufft``, ``cufinufft``). LookupError, saying what to install,
    where there is none."""
    if name not in _ENV:
        raise ValueError(f"jaxbind.contrib.cuda: no library {name!r}; 'cufft' or 'cufinufft'")
    given = os.environ.get(_ENV[name])
    if given:
        return given
    pattern = re.compile(rf"/lib{name}\.so[.\d]*$")
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                mapped = line.split()[-1]
                if pattern.search(mapped):
                    return mapped
    except OSError:
        pass
    for path in _wheel_libraries(name):
        return str(path)
    raise LookupError(
        f"jaxbind.contrib.cuda: cannot find lib{name}.so: "
        + (
            "install JAX's CUDA plugin (pip install 'jax[cuda13]'), which brings nvidia-cufft"
            if name == "cufft"
            else "pip install cufinufft"
        )
        + f", or set {_ENV[name]} to its path"
    )


def _wheel_libraries(name: str) -> list[pathlib.Path]:
    """The library in its wheel's folder, found without importing the package (cufinufft's
    loads its library, which fails without a GPU)."""
    package = {"cufft": "nvidia", "cufinufft": "cufinufft"}[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[pathlib.Path] = []
    for root in spec.submodule_search_locations:
        found += sorted(pathlib.Path(root).glob(f"**/lib{name}.so*"), reverse=True)
    return found


# The op's keyword arguments each library's setup takes (the library's path, and
# cufinufft's options layout, are found by the setup itself, where the program runs)
_SETUP_PARAMS = {
    "cufft": ("shape", "batch", "double"),
    "cufinufft": ("modes", "iflag", "eps", "single", "modeord"),
}


@functools.cache
def _entry(library: str):
    """(state, kernels...) of a library, as jaxbind values. The state's setup (on the GPU,
    at a device's first call) finds the library where the program runs (`library_path`;
    cufinufft's options layout with it: `opts_layout`), then calls the C setup; a program
    traced or exported elsewhere carries no path."""
    setup, teardown, *kernels = _ext.cuda_library_entry_points()[library]
    params = _SETUP_PARAMS[library]
    native = c_state(setup, teardown, name=f"{library} plans")

    def found(**kwargs):
        where = library_path(library)
        extra = _opts_layout() if library == "cufinufft" else {}
        return native.setup(library=where, **kwargs, **extra)

    found.__name__ = found.__qualname__ = f"{library}_plans"
    found.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY) for p in params]
    )
    state = jaxbind_state(teardown=native.teardown)(found)
    made = [
        _kernel(address, abi_version=4, platform="cuda", name=f"{library}_{i}")
        for i, address in enumerate(kernels)
    ]
    return state, made


# --- cuFFT ----------------------------------------------------------------------------------


def _same(x, **kw):
    return ((x.shape, x.dtype),)


def _fft_reference(x, *, forward, shape, **_):
    axes = tuple(range(-len(shape), 0))
    if forward:
        return [jnp.fft.fftn(x, axes=axes)]
    return [jnp.fft.ifftn(x, axes=axes) * int(np.prod(shape))]


@functools.cache
def _fft_op():
    from .. import get_linear_call

    state, (execute,) = _entry("cufft")
    return get_linear_call(
        execute,
        execute,  # the DFT matrix is symmetric: its transpose is itself
        _same,
        _same,
        state=state,
        reference=_fft_reference,
        name="jaxbind.contrib.cuda.fft",
    )


def fft(x, ndim: int = 1, *, inverse: bool = False):
    """The unnormalized complex FFT of `x` over its last `ndim` axes (1-3), by cuFFT on
    the GPU (a plan per call site and device), by ``jnp.fft`` on the CPU.

    ``inverse=True``: the other sign, unnormalized (``n * ifftn``). complex64 or
    complex128."""
    x = jnp.asarray(x)
    where = "jaxbind.contrib.cuda.fft"
    if x.dtype not in (jnp.complex64, jnp.complex128):
        raise TypeError(f"{where}: takes complex64 or complex128, not {x.dtype}")
    if (
        isinstance(ndim, bool)
        or not isinstance(ndim, (int, np.integer))
        or not 1 <= ndim <= min(3, x.ndim)
    ):
        raise ValueError(
            f"{where}: ndim must be an int from 1 to 3, at most x.ndim ({x.ndim}), not {ndim!r}"
        )
    if not isinstance(inverse, (bool, np.bool_)):
        raise TypeError(f"{where}: inverse must be True or False, not {inverse!r}")
    if x.size == 0:  # (cuFFT plans no empty transform; an empty FFT is empty)
        return x
    ndim = int(ndim)
    shape = np.asarray(x.shape[x.ndim - ndim :], np.int64)
    batch = int(np.prod(x.shape[: x.ndim - ndim], dtype=np.int64))
    (y,) = _fft_op()(
        x, shape=shape, batch=batch, double=x.dtype == jnp.complex128, forward=not inverse
    )
    return y


# --- cufinufft ------------------------------------------------------------------------------


@functools.cache
def _opts_layout() -> dict:
    """The byte offsets of the options jaxbind sets in cufinufft's ``cufinufft_opts``, and
    its size, from cufinufft's own ctypes description of the struct (read from its source,
    without importing the package, which loads its library)."""
    spec = importlib.util.find_spec("cufinufft")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("jaxbind.contrib.cuda: pip install cufinufft")
    source = pathlib.Path(next(iter(spec.submodule_search_locations))) / "_cufinufft.py"
    return opts_layout(source.read_text())


def opts_layout(source: str) -> dict:
    """The layout of ``cufinufft_opts`` that cufinufft's ``_cufinufft.py`` (`source`)
    declares, as its list of ``(name, ctypes type)`` fields: ``{opts_size, stream_at,
    device_at, modeord_at}``. A field whose type is not a ctypes scalar, or a list this
    cannot read, is refused (a wrong offset would write the stream elsewhere)."""
    block = re.search(r"fields\w*\s*=\s*\[(.*?)\]", source, re.S)
    text = block.group(1) if block else ""
    entry = re.compile(r"\(\s*(['\"])(\w+)\1\s*,\s*(?:ctypes\.)?(\w+)\s*\)")
    fields = [(m.group(2), m.group(3)) for m in entry.finditer(text)]
    leftover = re.sub(r"#.*", "", entry.sub("", text)).replace(",", "").strip()
    if not fields or leftover:
        raise LookupError(
            "jaxbind.contrib.cuda: cannot read this cufinufft's options (cufinufft_opts) "
            "from its _cufinufft.py; jaxbind reads cufinufft 2.3 to 2.5"
        )
    types = []
    for name, kind in fields:
        ctype = getattr(ctypes, kind, None)
        if not (isinstance(ctype, type) and issubclass(ctype, ctypes._SimpleCData)):
            raise LookupError(
                f"jaxbind.contrib.cuda: cufinufft's option {name!r} has the type {kind}, "
                "which jaxbind cannot lay out"
            )
        types.append((name, ctype))
    names = [n for n, _ in types]
    for needed in ("gpu_stream", "gpu_device_id", "modeord"):
        if needed not in names:
            raise LookupError(
                f"jaxbind.contrib.cuda: this cufinufft's options have no {needed!r}; "
                "jaxbind reads cufinufft 2.3 to 2.5"
            )
    struct = type("Opts", (ctypes.Structure,), {"_fields_": types})
    at = {name: getattr(struct, name).offset for name in ("gpu_stream", "gpu_device_id", "modeord")}
    return {
        "opts_size": ctypes.sizeof(struct),
        "stream_at": at["gpu_stream"],
        "device_at": at["gpu_device_id"],
        "modeord_at": at["modeord"],
    }


def _nufft_abstract(kind):
    def abstract(*args, modes, **_):
        *points, values = args
        if kind == 1:
            return ((tuple(int(n) for n in modes), values.dtype),)
        return ((points[0].shape, values.dtype),)

    return abstract


def _nufft_reference(kind):
    def reference(*args, modes, iflag, eps, modeord, **_):
        *points, values = args
        out = _reference_transform(
            values[None],
            jnp.stack(points),
            nufft_type=kind,
            sign=1 if iflag >= 0 else -1,
            grid=tuple(int(n) for n in modes),
            modeord=int(modeord),
            eps=float(eps),
        )
        return [out[0]]

    return reference


# Differentiable in the values and the points: the rules are JAX functions of NUFFTs of
# k-weighted data (as .ducc.nufft_points's), calling the ops again, so they are
# differentiable in turn. With s the sign and k_a the modes of axis a (no conjugates:
# JAX's transposes do not conjugate):
#   type 1  f = T1(c):  df = T1(dc) + sum_a i s k_a T1(c dx_a)
#           c_bar = T2(f_bar),  x_bar_a = Re c T2(i s k_a f_bar)
#   type 2  c = T2(f):  dc = T2(df) + sum_a dx_a T2(i s k_a f)
#           f_bar = T1(c_bar),  x_bar_a = Re c_bar T2(i s k_a f)


def _weights(modes, a, kw, dtype):
    """i s k_a over the grid `modes`, broadcast along axis a."""
    from .ducc.nufft_points import mode_numbers

    n = int(modes[a])
    k = mode_numbers(n, int(kw["modeord"])).reshape([n if b == a else 1 for b in range(len(modes))])
    return jnp.asarray(1j * (1 if kw["iflag"] >= 0 else -1) * k, dtype)


def _again(kind, values, points, kw):
    """The type-`kind` op on `values` at `points`, with the call's keyword arguments."""
    (out,) = _nufft_op(kind, len(points))(*points, values, **kw)
    return out


def _jvp(kind):
    def jvp(*args, **kw):
        dim = (len(args) - 2) // 2
        points, values = args[:dim], args[dim]
        dpoints, dvalues = args[dim + 1 : 2 * dim + 1], args[2 * dim + 1]
        modes = kw["modes"]
        out = _again(kind, dvalues, points, kw)
        for a, dx in enumerate(dpoints):
            if kind == 1:
                moved = _again(1, values * dx.astype(values.dtype), points, kw)
                out = out + _weights(modes, a, kw, values.dtype) * moved
            else:
                weighted = _weights(modes, a, kw, values.dtype) * values
                out = out + dx.astype(values.dtype) * _again(2, weighted, points, kw)
        return [out]

    return jax_function(jvp)


def _vjp(kind):
    def vjp(*args, **kw):
        *points, values, ct = args
        modes = kw["modes"]
        real = points[0].dtype
        if kind == 1:
            v_bar = _again(2, ct, points, kw)
            bars = [
                jnp.real(values * _again(2, _weights(modes, a, kw, ct.dtype) * ct, points, kw))
                for a in range(len(points))
            ]
        else:
            v_bar = _again(1, ct, points, kw)
            bars = [
                jnp.real(ct * _again(2, _weights(modes, a, kw, values.dtype) * values, points, kw))
                for a in range(len(points))
            ]
        return [*(b.astype(real) for b in bars), v_bar]

    return jax_function(vjp)


@functools.cache
def _nufft_op(kind: int, dim: int):
    from .. import get_nonlinear_call

    state, kernels = _entry("cufinufft")
    return get_nonlinear_call(
        kernels[kind - 1],
        (_jvp(kind), _vjp(kind)),
        _nufft_abstract(kind),
        None,
        linear_in=(dim,),  # the values (after the coordinates)
        state=state,
        reference=_nufft_reference(kind),
        name=f"jaxbind.contrib.cuda.nufft{kind}_{dim}d",
    )


def _nufft(kind, values, points, modes, iflag, eps, modeord):
    where = f"jaxbind.contrib.cuda.nufft{kind}"
    points = [jnp.asarray(p) for p in points if p is not None]
    if not 1 <= len(points) <= 3:
        raise ValueError(f"{where}: 1 to 3 coordinate arrays (x, y, z), not {len(points)}")
    values = jnp.asarray(values)
    single = values.dtype == jnp.complex64
    if values.dtype not in (jnp.complex64, jnp.complex128):
        raise TypeError(f"{where}: values are complex64 or complex128, not {values.dtype}")
    real = jnp.float32 if single else jnp.float64
    if any(p.dtype != real or p.ndim != 1 or p.shape != points[0].shape for p in points):
        raise TypeError(
            f"{where}: the coordinates are 1-d {np.dtype(real).name} arrays of one length "
            f"(the values are {values.dtype}); got {[(p.dtype.name, p.shape) for p in points]}"
        )
    m = points[0].shape[0]
    expected = (m,) if kind == 1 else tuple(modes)
    if values.shape != expected:
        what = "one value per point" if kind == 1 else "the grid's values"
        raise ValueError(
            f"{where}: the values have shape {values.shape}, but the call needs {what}, "
            f"{expected}; vmap for several transforms"
        )
    if (
        isinstance(eps, (bool, np.bool_))
        or not isinstance(eps, (int, float, np.integer, np.floating))
        or not (math.isfinite(float(eps)) and 0 < float(eps) < 1)
    ):
        raise ValueError(f"{where}: eps must be a number between 0 and 1, not {eps!r}")
    if isinstance(iflag, (bool, np.bool_)) or not isinstance(iflag, (int, np.integer)):
        raise TypeError(
            f"{where}: iflag must be an int (its sign is the exponent's), not {iflag!r}"
        )
    if isinstance(modeord, (bool, np.bool_)) or modeord not in (0, 1):
        raise ValueError(
            f"{where}: modeord must be 0 (the most negative mode first) or 1 (FFT order), "
            f"not {modeord!r}"
        )
    out_shape = (m,) if kind == 2 else tuple(modes)
    if m == 0 or 0 in tuple(modes):  # (no plan for an empty transform: its sums are empty)
        return jnp.zeros(out_shape, values.dtype)
    kw = dict(
        modes=np.asarray(modes, np.int64),
        iflag=1 if iflag >= 0 else -1,
        eps=float(eps),
        single=bool(single),
        modeord=int(modeord),
    )
    return _again(kind, values, points, kw)


def nufft1(output_shape, c, x, y=None, z=None, *, iflag: int = 1, eps: float = 1e-6, modeord=0):
    """Type 1, points to a grid: ``f[k] = sum_j c[j] exp(i sign(iflag) k·x_j)``, by
    cufinufft on the GPU (its plans per call site and device). Differentiable in the values
    and the points, to any order.

    Args:
      output_shape: the grid's shape (an int in 1-D).
      c: ``(M,)`` complex64 or complex128 values.
      x, y, z: 1-3 coordinate arrays ``(M,)`` (float32 with complex64, float64 with
        complex128), period 2 pi.
      iflag: the exponent's sign; eps: the accuracy; modeord: 0 (most negative mode
        first) or 1 (FFT order).
    """
    given = np.atleast_1d(output_shape)
    if given.ndim != 1 or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in given.tolist()
    ):
        raise ValueError(
            "jaxbind.contrib.cuda.nufft1: output_shape must be a non-negative int or a tuple "
            f"of them, not {output_shape!r}"
        )
    modes = tuple(int(n) for n in given)
    if len(modes) != sum(p is not None for p in (x, y, z)):
        raise ValueError(
            f"jaxbind.contrib.cuda.nufft1: output_shape {modes} has {len(modes)} dimensions, "
            "but not as many coordinate arrays were given"
        )
    return _nufft(1, c, (x, y, z), modes, iflag, eps, modeord)


def nufft2(f, x, y=None, z=None, *, iflag: int = -1, eps: float = 1e-6, modeord=0):
    """Type 2, a grid to points: ``c[j] = sum_k f[k] exp(i sign(iflag) k·x_j)`` (see
    `nufft1`); `f` the grid's values, its shape the modes. Differentiable in the values and
    the points, to any order."""
    f = jnp.asarray(f)
    n_points = sum(p is not None for p in (x, y, z))
    if f.ndim != n_points:
        raise ValueError(
            f"jaxbind.contrib.cuda.nufft2: the grid has {f.ndim} dimensions, but {n_points} "
            "coordinate arrays were given"
        )
    return _nufft(2, f, (x, y, z), f.shape, iflag, eps, modeord)
