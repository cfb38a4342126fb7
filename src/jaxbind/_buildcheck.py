"""Can the compiled extension run with the installed jaxlib?

The extension is compiled against the XLA FFI headers of one jaxlib: for the
wheels and for ``pip install .``, the oldest supported one, which
pyproject.toml pins as a build requirement. XLA keeps running FFI handlers
built against an older FFI API version (the handler reports its version and
XLA adapts to it), so the extension runs with that jaxlib and every newer one.
It cannot run with an older one, which may lack what the headers declare.

Importing jaxlib's ``version`` module is cheap and loads no XLA code, so this
check runs before anything else of jaxbind touches JAX.
"""

from __future__ import annotations

import os
import warnings

__all__ = ["check_build", "check_jax_version", "version_tuple"]


def version_tuple(version: str) -> tuple[int, ...]:
    """A version as a comparable tuple: four release numbers, then 0, or -1 for a pre-release.

    '0.12.0.1' -> (0, 12, 0, 1, 0); '0.7.0' -> (0, 7, 0, 0, 0); a pre-release
    sorts below its release: '0.7.0rc1' and '0.8.0.dev20250101' -> (0, 7, 0, 0, -1)
    and (0, 8, 0, 0, -1); a local label is ignored: '0.10.2+cuda13' -> (0, 10, 2, 0, 0).
    """
    release: list[int] = []
    pre = 0
    for piece in version.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if digits:
            release.append(int(digits))
        if len(digits) < len(piece):  # 'rc1', 'a1', 'b2', 'dev3' follow: a pre-release
            pre = -1
            break
    return (*(release + [0] * 4)[:4], pre)


def check_build(built_against: str, installed: str, oldest_supported: str) -> None:
    """Raise ImportError unless the installed jaxlib can run the extension.

    Args:
      built_against: the jaxlib whose FFI headers the extension was compiled with.
      installed: the installed jaxlib's version.
      oldest_supported: the oldest jaxlib jaxbind supports.
    """
    needed = max(built_against, oldest_supported, key=version_tuple)
    if version_tuple(installed) >= version_tuple(needed):
        return
    raise ImportError(
        f"jaxbind needs jaxlib>={needed}, but jaxlib {installed} is installed. jaxbind's "
        f"extension was compiled against the XLA FFI headers of jaxlib {built_against} and "
        f"runs with that jaxlib and every newer one, not with an older one. Upgrade: "
        f"pip install -U 'jax>={needed}' 'jaxlib>={needed}'"
    )


def check_jax_version(installed: str, oldest_supported: str, newest_tested: str) -> str | None:
    """Refuse a JAX older than `oldest_supported`; warn when it is newer than
    `newest_tested` (jaxbind uses some of JAX's internals).

    Returns the warning text (or None). Set JAXBIND_SILENCE_JAX_VERSION_WARNING=1
    to silence it.
    """
    if version_tuple(installed) < version_tuple(oldest_supported):
        raise ImportError(
            f"jaxbind needs jax>={oldest_supported}, found jax {installed}; "
            f"run: pip install -U 'jax>={oldest_supported}'"
        )
    if version_tuple(installed)[:3] <= version_tuple(newest_tested)[:3]:
        return None
    message = (
        f"jaxbind was tested with jax up to {newest_tested}, found jax {installed}. "
        "It uses some JAX internals; if something breaks, pin "
        f"'pip install jax=={newest_tested}' or upgrade jaxbind. "
        "Set JAXBIND_SILENCE_JAX_VERSION_WARNING=1 to hide this warning."
    )
    if os.environ.get("JAXBIND_SILENCE_JAX_VERSION_WARNING", "") not in ("", "0"):
        return message
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return message
