"""Registration: the rules of the jaxbind primitive, given to JAX once, at import.

Abstract evaluation (_abstract), eager evaluation, lowering for CPU and CUDA
(_lowering), JVP and transpose (_ad) and batching (_batching) are generic: each
takes the binding from the CallSpec parameter.
"""

from __future__ import annotations

from ._abstract import abstract_eval
from ._ad import jvp_rule, transpose_rule
from ._api import eager_impl
from ._batching import batch_rule
from ._compat import define_primitive, explain_checkpoint_effects
from ._effects import explain_checkpoint
from ._lowering import lower_cpu, lower_cuda
from ._primitive import PRIMITIVE

__all__ = ["register_rules"]


def register_rules() -> None:
    define_primitive(
        PRIMITIVE,
        impl=eager_impl,
        abstract_eval=abstract_eval,
        lowerings={"cpu": lower_cpu, "cuda": lower_cuda},
        jvp=jvp_rule,
        transpose=transpose_rule,
        batch=batch_rule,
    )
    explain_checkpoint_effects(explain_checkpoint)
