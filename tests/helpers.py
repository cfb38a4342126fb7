"""Helpers shared by the tests: dtypes, tolerances, random inputs (fixtures are in
conftest.py)."""

import numpy as np
import pytest

FLOAT_DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def skip_unless_x64(dtype, x64):
    if np.dtype(dtype) in (np.float64, np.complex128) and not x64:
        pytest.skip("64-bit dtype needs jax_enable_x64")


def random(shape, dtype=np.float64, seed=0, complex_=False):
    """Standard normal values of `dtype`, with a random imaginary part for a complex
    dtype; `complex_=True` makes it the complex dtype of `dtype`'s precision."""
    if complex_:
        dtype = np.result_type(dtype, np.complex64)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def tol(dtype):
    return 2e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12


def compile_c_library(tmp_path_factory, name: str, source: str):
    """`source` (C, against jaxbind/kernel.h) compiled into a shared library, loaded with
    ctypes; the test is skipped where there is no C compiler."""
    import ctypes
    import shutil
    import subprocess

    import jaxbind

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    tmp = tmp_path_factory.mktemp(name)
    (tmp / "k.c").write_text(source)
    so = tmp / f"lib{name}.so"
    include = f"-I{jaxbind.kernel_include_dir()}"
    subprocess.run(
        [cc, "-O1", "-shared", "-fPIC", include, str(tmp / "k.c"), "-o", str(so)], check=True
    )
    return ctypes.CDLL(str(so))
