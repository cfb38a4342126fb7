"""The rules of the jaxbind primitive, and their registration block.

One module per rule, each generic (it takes the binding from the CallSpec parameter):
abstract evaluation (abstract), JVP and transpose (ad), batching (batching), lowering
for CPU and CUDA (lowering, with partitioning and the jaxlib-0.7 form in jaxlib07),
effects (effects), and roles computed by JAX functions (jaxfn). `register_rules`
gives them to JAX once, at import; no binding adds or removes anything in JAX's tables.
"""

from __future__ import annotations

from .._compat import define_primitive, explain_checkpoint_effects
from .._primitive import PRIMITIVE, eager_impl
from .abstract import abstract_eval
from .ad import jvp_rule, transpose_rule
from .batching import batch_rule
from .effects import explain_checkpoint
from .lowering import lower_cpu, lower_cuda

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
