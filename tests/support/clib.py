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
