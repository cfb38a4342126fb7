"""Sharding: how XLA may split a batched jaxbind call across devices.

Batch elements of a vmapped op are independent, so a call whose batch axes
lead every input and output can run on each device's shard of the batch. The
lowering marks such calls for both of JAX's partitioners:

- the FFI target is registered as batch partitionable, and the call carries the
  frontend attribute ``num_batch_dims``: XLA's SPMD partitioner then gives each
  device its slice of the leading axes and replicates the rest;
- under Shardy (JAX's default partitioner), the call also carries a sharding
  rule in which the batch axes of all inputs and outputs are shared factors and
  every other axis must be replicated, so that sharding propagates from the
  inputs through the op to its outputs.

Calls that do not qualify (an input that is not batched, such as a fixed
argument shared by the whole batch, or native batch axes that are not leading)
are not marked: XLA gathers their inputs and runs them replicated, which is
correct but not parallel. Nor, under Shardy, are calls whose result shapes are
symbolic (jax.export shape polymorphism).
"""

from __future__ import annotations

from collections.abc import Sequence

from .._compat import config_use_shardy, ir, sdy_sharding_rule
from .._spec import CallSpec

__all__ = ["num_batch_dims", "mark_batch_partitionable"]


def num_batch_dims(spec: CallSpec, n_outputs: int) -> int:
    """How many leading axes of every input and output are batch axes (0: none or not all)."""
    if spec.batch_axes is None or spec.out_batch_axes is None or n_outputs == 0:
        return 0
    axes = spec.batch_axes + spec.out_batch_axes
    return axes.levels if axes.all_leading else 0


def mark_batch_partitionable(
    op: ir.Operation, spec: CallSpec, in_ranks: Sequence[int], out_ranks: Sequence[int]
) -> None:
    """Annotate a lowered jaxbind custom call so that XLA can split its batch."""
    n = num_batch_dims(spec, len(out_ranks))
    if n == 0:
        return
    attrs = {"num_batch_dims": ir.StringAttr.get(str(n))}
    op.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(attrs)
    # Symbolic result shapes (jax.export) add shape operands, which JAX's shape
    # refinement removes again before compiling: no Shardy rule can name both forms,
    # so such calls carry none (correct, but replicated under Shardy).
    if config_use_shardy() and len(op.operands) == len(in_ranks):
        batch = [f"b{k}" for k in range(n)]
        rest, mappings = [], []
        for which, ranks in (("i", in_ranks), ("o", out_ranks)):
            for index, rank in enumerate(ranks):
                own = [f"{which}{index}_{d}" for d in range(n, rank)]
                rest += own
                mappings.append(" ".join(batch + own) or "")
        n_in = len(in_ranks)
        rule = ", ".join(mappings[:n_in]) + " -> " + ", ".join(mappings[n_in:])
        op.attributes["sdy.sharding_rule"] = sdy_sharding_rule(
            rule, tuple(rest), [v.type for v in op.operands], [r.type for r in op.results]
        )
