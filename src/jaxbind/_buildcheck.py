"""Is the compiled extension compatible with the jaxlib installed now?

The extension records the jaxlib version and the XLA FFI API version (major,
minor) of the headers it was compiled against. A handler built against a newer
FFI minor version may use what an older XLA lacks, and a different major
version is a different ABI; a newer jaxlib with the same major version is fine.
"""

from __future__ import annotations

import os
import re

__all__ = ["check_build", "runtime_ffi_api_version"]

_REBUILD = ("Rebuild jaxbind against the installed jaxlib: pip install --force-reinstall "
            "--no-binary jaxbind --no-cache-dir jaxbind (or, from a checkout, pip install "
            "--force-reinstall .)")


def runtime_ffi_api_version() -> tuple[int, int] | None:
    """(major, minor) of the XLA FFI API of the installed jaxlib, from its headers."""
    try:
        import jax.ffi
        path = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
        with open(path) as f:
            text = f.read()
    except (OSError, ImportError):
        return None
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    if not (major and minor):
        return None
    return int(major.group(1)), int(minor.group(1))


def check_build(built_jaxlib: str, built_api: tuple[int, int], runtime_jaxlib: str,
                runtime_api: tuple[int, int] | None) -> None:
    """Raise ImportError if the extension cannot run with the installed jaxlib."""
    if runtime_api is None:
        return  # this jaxlib ships no headers to compare with; trust it
    built_api, runtime_api = tuple(built_api), tuple(runtime_api)
    if built_api[0] != runtime_api[0] or built_api[1] > runtime_api[1]:
        raise ImportError(
            f"jaxbind's extension was built against jaxlib {built_jaxlib} (XLA FFI API "
            f"{built_api[0]}.{built_api[1]}), but the installed jaxlib {runtime_jaxlib} has "
            f"XLA FFI API {runtime_api[0]}.{runtime_api[1]}, which cannot run it. {_REBUILD}")
