"""The rules of the jaxbind primitive, and their registration block.

The rules that hold whatever computes a role: the checks of abstract evaluation
(abstract), JVP and transpose (ad), and effects (effects). The rules that depend on
the role's body (see _roles.Body), one set per kind of body:

- a callable or a compiled kernel: output shapes from the abstract function
  (abstract), vectorized or by jaxbind's loop (batching), the trampoline's
  custom call (lowering, with partitioning and the jaxlib-0.7 form in jaxlib07), or,
  where the op's JAX reference computes the call instead, that reference inlined
  (reference: the target table's reference row);
- a JAX function: traced into the program (jaxfn); a role the op gave no body but
  whose reference derives it (reference) is one.

The lowering is registered for CPU and CUDA, where native bodies run (_roles.Body's
platforms), and for every other platform (JAX's default rule), where only traced bodies
and references can; jaxbind._where.runs says which computes a call.

Each generic rule takes the role from the CallSpec parameter and reads the binding's
role table. `register_rules` gives them to JAX once, at import; no binding adds or
removes anything in JAX's tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .._compat import define_primitive, explain_checkpoint_effects
from .._errors import about
from .._primitive import PRIMITIVE, eager_impl
from .._roles import NATIVE_PLATFORMS, Body
from .._spec import CallSpec
from . import abstract, batching, jaxfn, lowering
from .ad import jvp_rule, transpose_rule
from .effects import effects_of, explain_checkpoint
from .partitioning import check_call, typed_results
from .reference import platform_of

__all__ = ["BODY_RULES", "BodyRules", "register_rules"]


class BodyRules(NamedTuple):
    """The rules that depend on what computes a role."""

    output_avals: Callable  # (spec, avals) -> output avals
    batch: Callable  # (args, dims, *, spec) -> (outputs, output batch dims)
    lower: Callable  # (platform, ctx, *args, spec) -> results


def _kernel_output_avals(spec: CallSpec, avals):
    """A kernel's outputs are a callable's; in addition, the call must suit the kernel (a
    numba kernel's function takes every keyword argument that no shape function takes)."""
    outs = abstract.output_avals(spec, avals)
    binding = spec.binding
    shape_fns = [r.abstract for r in binding.roles.values() if r.abstract is not None]
    kernel: Any = binding.body(spec.role)  # a Kernel (of any platform) or a CudaKernel
    assert spec.entry.kind.compiled
    kernel.check_call(
        spec.kwargs.names(),
        len(avals),
        len(outs),
        about(binding.name, spec.role),
        shape_fns,
        state=binding.options.state,
    )
    return outs


BODY_RULES = {
    Body.CALLABLE: BodyRules(abstract.output_avals, batching.batch_rule, lowering.lower),
    # the same custom call: the trampoline finds a kernel behind the site, not a callable
    Body.KERNEL: BodyRules(_kernel_output_avals, batching.batch_rule, lowering.lower),
    Body.STREAM_KERNEL: BodyRules(_kernel_output_avals, batching.batch_rule, lowering.lower),
    Body.GRAPH_SAFE_KERNEL: BodyRules(_kernel_output_avals, batching.batch_rule, lowering.lower),
    Body.CUDA_KERNEL: BodyRules(_kernel_output_avals, batching.batch_rule, lowering.lower),
    Body.JAX: BodyRules(jaxfn.output_avals, jaxfn.batch, jaxfn.lower),
    # the role's function made from the op's reference: a JAX function like any other
    Body.DERIVED: BodyRules(jaxfn.output_avals, jaxfn.batch, jaxfn.lower),
}


def _rules(spec: CallSpec) -> BodyRules:
    return BODY_RULES[spec.entry.kind]


def abstract_eval(*avals, spec: CallSpec):
    """Effectful abstract evaluation of the jaxbind primitive: (output avals, effects)."""
    abstract.check_arguments(spec, avals)
    outs = _rules(spec).output_avals(spec, avals)
    if spec.binding.options.aliases and spec.role == "f":
        abstract.check_aliases(spec, avals, outs)
    if spec.binding.options.sharding is not None:
        check_call(spec, avals, outs)
        outs = typed_results(spec, avals, outs)  # explicit sharding mode
    return outs, effects_of(spec)


def batch_rule(args, dims, *, spec: CallSpec):
    return _rules(spec).batch(args, dims, spec=spec)


def _lowering(platform: str | None):
    """The lowering rule for `platform` (None: any platform without a rule of its own)."""

    def lower(ctx, *args, spec: CallSpec):
        return _rules(spec).lower(platform or platform_of(ctx), ctx, *args, spec=spec)

    return lower


def register_rules() -> None:
    define_primitive(
        PRIMITIVE,
        impl=eager_impl,
        abstract_eval=abstract_eval,
        lowerings={
            **{platform: _lowering(platform) for platform in NATIVE_PLATFORMS},
            None: _lowering(None),  # TPU, ROCm, plugins: the op's reference, if any
        },
        jvp=jvp_rule,
        transpose=transpose_rule,
        batch=batch_rule,
    )
    explain_checkpoint_effects(explain_checkpoint)
