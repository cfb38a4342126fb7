"""The ops of the conformance matrix: one form per dtype row, each written once per kind of body.

A form is what an op computes, elementwise over arrays of `SIZE` elements, scaled by the
static keyword argument ``c`` and by the form's `base` (2 at first; `replace=True` makes it
3, see the "replace" transformation). Its pure-JAX twin (`twin`) is the oracle: every
transformation of the op is compared with the same transformation of the twin, and the
forward values with NumPy (`numpy_f`).

  linear      y = b c x                      (float32/64, complex64/128)
  nonlinear   y = b c x x                    (float32/64, complex64/128)
  int32       y = b c x k, z = 2 k + 1       (x float32, k int32)
  bool        y = b c x m, z = not m         (x float32, m bool)
  mixed       y = b c x x, f = floor x (int32), p = x > 0 (bool)   (x float64)

Every role of a nonlinear form multiplies an argument by a "slope": the JVP and the VJP
have one formula (out = slope * the last inputs), so each kind writes them once.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

SIZE = 4
BASE = 2.0  # the factor of the first definition (REPLACED: after replace=True)
REPLACED = 3.0


@dataclass(frozen=True)
class Form:
    """What an op computes (see the module's text).

    Attributes:
      name: the row of the matrix's dtype axis it serves.
      linear: a linear op (one input, transpose) or a nonlinear one (JVP and VJP).
      inputs, outputs: their dtypes, in order.
    """

    name: str
    linear: bool
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def inputs_for(self, seed: int = 0, batch: int | None = None) -> tuple[np.ndarray, ...]:
        """Example inputs (a leading batch axis of `batch` elements if given)."""
        rng = np.random.default_rng(seed)
        shape = (SIZE,) if batch is None else (batch, SIZE)
        made = []
        for dtype in self.inputs:
            if dtype == "int32":
                made.append(rng.integers(-3, 4, shape).astype(np.int32))
            elif dtype == "bool":
                made.append(rng.integers(0, 2, shape).astype(bool))
            elif dtype.startswith("complex"):
                made.append((rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype))
            else:
                made.append((rng.normal(size=shape) + 0.25).astype(dtype))
        return tuple(made)

    def numpy_f(self, *xs, c: float, base: float = BASE):
        """The outputs by NumPy."""
        s = base * c
        if self.name in ("int32", "bool"):
            x, k = xs
            z = 2 * k + 1 if self.name == "int32" else np.logical_not(k)
            return (np.asarray(s * x * k, np.float32), z.astype(self.outputs[1]))
        (x,) = xs
        if self.name == "mixed":
            return (s * x * x, np.floor(x).astype(np.int32), x > 0)
        return ((s * x if self.linear else s * x * x).astype(self.outputs[0]),)

    def twin(self, *xs, c: float, base: float = BASE):
        """The outputs by JAX (the oracle of every transformation)."""
        s = base * c
        if self.name in ("int32", "bool"):
            x, k = xs
            z = 2 * k + 1 if self.name == "int32" else jnp.logical_not(k)
            return (s * x * k.astype(x.dtype), z)
        (x,) = xs
        if self.name == "mixed":
            return (s * x * x, jnp.floor(x).astype(jnp.int32), x > 0)
        return (s * x if self.linear else s * x * x,)


FLOATS = ("float32", "float64", "complex64", "complex128")
FORMS = {
    **{f"linear/{d}": Form(d, True, (d,), (d,)) for d in FLOATS},
    **{f"nonlinear/{d}": Form(d, False, (d,), (d,)) for d in FLOATS},
    "nonlinear/int32": Form("int32", False, ("float32", "int32"), ("float32", "int32")),
    "nonlinear/bool": Form("bool", False, ("float32", "bool"), ("float32", "bool")),
    "nonlinear/mixed": Form("mixed", False, ("float64",), ("float64", "int32", "bool")),
}
