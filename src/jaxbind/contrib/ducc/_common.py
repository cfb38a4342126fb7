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
        "pip install 'ducc0>=0.34' (jaxbind's ducc extra: pip install '.[ducc]' in its clone)"
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


def all_finite(a) -> bool:
    """Whether every element of the float array `a` is finite: the check that the
    coordinates of every gridder or NUFFT call get. One pass over the flat array (8.6 µs
    for 20k uvw rows); ``np.isfinite(a).all(axis=1)``, which finds the rows, reduces along
    the short axis and costs 50 times as much (0.45 ms), so it runs only when this
    answers False."""
    return bool(np.isfinite(a).all())


# --- parameter checks (trace time) -------------------------------------------------


def check_int(op: str, name: str, value, minimum: int | None = 0) -> int:
    """`value` as a Python int of at least `minimum`, however real code spells an integer:
    an int, a NumPy integer, a bool (``verbosity=False``) or an integral float (``2.0``);
    JAXbind 1.3 passed each of these on to DUCC, which took them."""
    if isinstance(value, (bool, np.bool_)):
        value = int(value)
    elif isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
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


def check_real(op: str, name: str, value) -> float:
    """`value` as a Python float (a NumPy float, an int, ...)."""
    try:
        # not float() of a string (it parses it) or of a complex number
        if isinstance(value, (str, bytes, complex, np.complexfloating)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"jaxducc0.{op}: {name} must be a real number, got {type(value).__name__} {value!r}"
        ) from None


def check_positive(op: str, name: str, value) -> float:
    """A finite, strictly positive real number (an accuracy, a pixel size, a period)."""
    value = check_real(op, name, value)
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


def check_sigma(op: str, kwargs: dict, allowed: str, within, defaults=None) -> None:
    """DUCC's oversampling range ``sigma_min``/``sigma_max`` in `kwargs`, if given, with
    ``within(lo, hi)`` true (`allowed` says how); stored back as floats. Both or neither,
    unless DUCC's `defaults` ``(sigma_min, sigma_max)`` stand for the one not given."""
    given = [k for k in ("sigma_min", "sigma_max") if k in kwargs]
    if len(given) == 1 and defaults is None:
        raise TypeError(f"jaxducc0.{op}: give both sigma_min and sigma_max, or neither")
    sigma = sigma_range(kwargs, defaults)
    if sigma is not None:
        lo, hi = (
            check_positive(op, "sigma_min", sigma[0]),
            check_positive(op, "sigma_max", sigma[1]),
        )
        if not within(lo, hi):
            raise ValueError(f"jaxducc0.{op}: DUCC needs {allowed}, got {lo} and {hi}")
        kwargs.update({k: v for k, v in (("sigma_min", lo), ("sigma_max", hi)) if k in given})


def sigma_range(kwargs, defaults=None) -> tuple[float, float] | None:
    """``(sigma_min, sigma_max)`` that DUCC uses for `kwargs`; None when neither is given."""
    if "sigma_min" not in kwargs and "sigma_max" not in kwargs:
        return None
    lo, hi = defaults if defaults is not None else (None, None)
    return kwargs.get("sigma_min", lo), kwargs.get("sigma_max", hi)
