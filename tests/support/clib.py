"""A C kernel library compiled for a test."""

import ctypes
import shutil
import subprocess

import pytest


def compile_c_library(tmp_path_factory, name: str, source: str):
    """`source` (C, against jaxbind/kernel.h) compiled into a shared library, loaded with
    ctypes; the test is skipped where there is no C compiler."""
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


def c_kernel(clib, how: str, name: str, abi_version: int | None = None):
    """The C kernel `name` of a library from `compile_c_library`, as jaxbind gets it from
    each kind of pointer: "ctypes", "cffi" or "raw address" (of ABI `abi_version`)."""
    import jaxbind

    if how == "ctypes":
        return jaxbind.kernel(getattr(clib, name))
    if how == "raw address":
        from jaxbind._kernels.abi import ABI_VERSION

        abi_version = ABI_VERSION if abi_version is None else abi_version
        address = ctypes.cast(getattr(clib, name), ctypes.c_void_p).value
        return jaxbind.kernel(address, abi_version=abi_version, name=name)
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef(f"int32_t {name}(const void *call);")
    return jaxbind.kernel(getattr(ffi.dlopen(clib._name), name))
