"""What the DUCC op families share: ducc0 itself, dtype pairs, the GPU platform mode,
and the checks every op and factory makes on its parameters when a program is traced.

Nothing a user passes may reach a DUCC assertion: each check raises a TypeError or
ValueError that names the op (``jaxducc0.<op>``), the argument and what is allowed.
"""

from __future__ import annotations

import math
import operator

import numpy as np

try:
    import ducc0  # noqa: F401  (only whether it is installed)
except ImportError as exc:  # pragma: no cover - exercised only without ducc0
    raise ImportError(
        "jaxbind.contrib.jaxducc0 needs the ducc0 package; install it with "
        "pip install 'jaxbind[ducc]'"
    ) from exc

# DUCC runs on the CPU: inside GPU programs, jaxbind copies the operands to the host
# and the results back (see "GPU buffers" in the README).
_MODE = "host"

_COMPLEX: dict[np.dtype, np.dtype] = {
    np.dtype(np.float32): np.dtype(np.complex64),
    np.dtype(np.float64): np.dtype(np.complex128),
}
_REAL = {c: r for r, c in _COMPLEX.items()}


def _partner(pairs, dtype, what):
    """`dtype`'s partner of the same precision in `pairs` (_COMPLEX or _REAL); a
    TypeError naming ``jaxducc0.<what>`` for a dtype that has none."""
    try:
        return pairs[np.dtype(dtype)]
    except KeyError:
        expected = " or ".join(map(str, pairs))
        raise TypeError(f"jaxducc0.{what}: expected {expected} input, got {dtype}") from None


def _complex_of(dtype, what):
    """The complex dtype of a float32 or float64 `dtype`."""
    return _partner(_COMPLEX, dtype, what)


def _real_of(dtype, what):
    """The real dtype of a complex64 or complex128 `dtype`."""
    return _partner(_REAL, dtype, what)


# --- parameter checks (trace time) -------------------------------------------------


def check_int(op: str, name: str, value, minimum: int | None = 0) -> int:
    """`value` as a Python int of at least `minimum`; bools and floats are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"jaxducc0.{op}: {name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(
            f"jaxducc0.{op}: {name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None
    if minimum is not None and value < minimum:
        raise ValueError(f"jaxducc0.{op}: {name} must be >= {minimum}, got {value}")
    return value


def check_nthreads(op: str, nthreads) -> int:
    """DUCC's thread count: 0 (all hardware threads) or a positive number."""
    return check_int(op, "nthreads (0: all hardware threads)", nthreads, 0)


def check_positive(op: str, name: str, value) -> float:
    """A finite, strictly positive real number (an accuracy, a pixel size, a period)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"jaxducc0.{op}: {name} must be a real number, got {type(value).__name__} {value!r}"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"jaxducc0.{op}: {name} must be a finite number > 0, got {value}")
    return value


def check_choice(op: str, name: str, value, allowed):
    if value not in allowed:
        raise ValueError(f"jaxducc0.{op}: {name} must be one of {list(allowed)}, got {value!r}")
    return value


def check_kwargs(op: str, kwargs, allowed) -> None:
    """Keyword arguments passed through to DUCC must be ones its function takes."""
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"jaxducc0.{op}: unknown keyword argument(s) {unknown}; it takes {sorted(allowed)}"
        )


def check_sigma(op: str, kwargs: dict, allowed: str, within) -> None:
    """DUCC's oversampling range ``sigma_min``/``sigma_max`` in `kwargs`, if given: both
    or neither, with ``within(lo, hi)`` true (`allowed` says how); stored back as floats."""
    if ("sigma_min" in kwargs) != ("sigma_max" in kwargs):
        raise TypeError(f"jaxducc0.{op}: give both sigma_min and sigma_max, or neither")
    if "sigma_min" in kwargs:
        lo, hi = (check_positive(op, k, kwargs[k]) for k in ("sigma_min", "sigma_max"))
        if not within(lo, hi):
            raise ValueError(f"jaxducc0.{op}: DUCC needs {allowed}, got {lo} and {hi}")
        kwargs.update(sigma_min=lo, sigma_max=hi)
