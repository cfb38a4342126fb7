"""One JAX primitive per binding, all sharing the same rules.

The rules take the binding from the CallSpec parameter, so the primitive
itself holds no reference to user code.
"""

from __future__ import annotations

from functools import partial

from ._abstract import abstract_eval
from ._ad import jvp_rule, transpose_rule
from ._batching import batch_rule
from ._compat import Primitive, ad, apply_primitive, batching, mlir
from ._lowering import lower_cpu, lower_cuda

__all__ = ["make_primitive"]


def make_primitive(name: str) -> Primitive:
    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_impl(partial(apply_primitive, prim))
    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, lower_cpu, platform="cpu")
    mlir.register_lowering(prim, lower_cuda, platform="cuda")
    ad.primitive_jvps[prim] = jvp_rule
    ad.primitive_transposes[prim] = transpose_rule
    batching.primitive_batchers[prim] = batch_rule
    return prim
