"""The matrix of mistakes: ops defined wrongly, as users get them wrong, under the
transformations that would use the wrong part. Each cell gives the right answer (where the
wrong part is not used: the native function of a wrong reference, in eager, jit and vmap
calls) or an error naming the op; never another number. `check` of a wrong op fails,
naming it.

  returns_with_out     a pytree-API function that takes out= and returns its result
  reference_shape      a reference whose output has another shape (derived rules read it)
  reference_dtype      a reference whose output has another dtype
  reference_raises     a reference that raises
  reference_recurses   a reference that calls its own op
  reference_too_few    a reference that returns one output of two
  reference_callback   a reference that calls jax.pure_callback
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import jaxbind

from .bodies import C_VALUE, Built, build
from .forms import BASE, FORMS

MISUSES = (
    "returns_with_out",
    "reference_shape",
    "reference_dtype",
    "reference_raises",
    "reference_recurses",
    "reference_too_few",
    "reference_callback",
)
TRANSFORMS = (
    "eager", "jit", "grad", "jvp", "vjp", "vmap", "vmap_grad", "hessian", "portable",
    "use_reference", "use_reference_strict", "check",
)  # fmt: skip


@dataclass(frozen=True)
class Misuse:
    misuse: str
    api: str
    transform: str

    @property
    def id(self) -> str:
        return f"{self.misuse}-{self.api}-{self.transform}"

    @property
    def name(self) -> str:
        return "conformance.misuse." + self.id

    @property
    def form_key(self) -> str:
        if self.misuse == "returns_with_out":
            return "nonlinear/float64"
        return "nonlinear/int32" if self.misuse == "reference_too_few" else "nonlinear/float64"


def all_misuses() -> list[Misuse]:
    return [
        Misuse(*c)
        for c in itertools.product(MISUSES, ("jaxbind13", "native"), TRANSFORMS)
        if not (c[0] == "returns_with_out" and c[1] == "jaxbind13")  # (1.3 bodies return None)
    ]


def sample(seed: int) -> list[Misuse]:
    """Every (misuse, transformation) pair once, the API drawn."""
    rng = random.Random(seed)
    chosen = []
    for misuse, transform in itertools.product(MISUSES, TRANSFORMS):
        apis = ["native"] if misuse == "returns_with_out" else ["jaxbind13", "native"]
        chosen.append(Misuse(misuse, rng.choice(apis), transform))
    return chosen


def _wrong_reference(case: Misuse, form, holder: dict):
    """The reference of a misuse (None for returns_with_out: the right one)."""
    m, native = case.misuse, case.api == "native"

    def pack(outs):
        outs = tuple(outs)
        return (outs if len(outs) > 1 else outs[0]) if native else list(outs)

    def reference(*xs, c):
        right = form.twin(*xs, c=c, base=BASE)
        if m == "reference_shape":
            return pack((jnp.concatenate([right[0], right[0][:1]]), *right[1:]))
        if m == "reference_dtype":
            return pack((right[0].astype(jnp.float32), *right[1:]))
        if m == "reference_raises":
            raise ValueError("the reference's own mistake")
        if m == "reference_recurses":
            return holder["op"](*xs, c=c)
        if m == "reference_too_few":
            return pack(right[:1])
        if m == "reference_callback":
            host = jax.pure_callback(
                lambda x: np.asarray(x), jax.ShapeDtypeStruct(right[0].shape, right[0].dtype),
                right[0],
            )  # fmt: skip
            return pack((host, *right[1:]))
        return pack(right)

    return reference


def build_misuse(case: Misuse) -> Built:
    form = FORMS[case.form_key]
    if case.misuse == "returns_with_out":

        @jaxbind.nonlinear_op(
            shape=lambda x, *, c: jax.ShapeDtypeStruct(x.shape, x.dtype),
            reference=lambda x, *, c: form.twin(x, c=c)[0],
            name=case.name,
        )
        def op(x, *, c, out=None):
            return BASE * c * x * x  # returned, though it takes out= (and writes nothing)

        return Built(op, case.api, form, BASE, True, [])
    holder: dict = {}
    reference = _wrong_reference(case, form, holder)
    built = build("derived", case.api, case.form_key, name=case.name, reference=reference)
    holder["op"] = built.op  # (the reference that recurses calls it)
    return built


__all__ = ["C_VALUE", "MISUSES", "Misuse", "all_misuses", "build_misuse", "sample"]
