"""Check a jaxbind op thoroughly before its users do: ``jaxbind.testing.check``.

The commonest bugs in a binding are a transpose or VJP that is subtly wrong (a
missing conjugate, a factor of 2, a swapped axis), a batching rule that is right
only for a batch axis in front, and an abstract function that disagrees with what
the callable writes. `check` runs one op on example inputs through every path
jaxbind offers and compares the paths with each other and with finite differences.

The rows come in families, one module each, run in the order of `FAMILIES`: each says
which roles and options it covers, whether it applies to an op, and yields its rows
(see .case.Family). A check that applies but could not run is a "not checked" row that
says why, never a pass.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import numpy as np

from .._api import Op
from .._pytree_api import PytreeOp
from . import (
    agreement,
    batching,
    first_order,
    inputs,
    linearity,
    mesh,
    reference,
    second_order,
    state,
    written,
)
from .case import Case, Family, as_computed
from .collectives import Collectives, collectives
from .report import CheckReport, CheckResult, not_checked
from .watch import watching

__all__ = ["FAMILIES", "CheckReport", "CheckResult", "Collectives", "check", "collectives"]

# In order: the first calls the function directly (and stops the others if it fails).
FAMILIES: tuple[Family, ...] = (
    written.FAMILY,
    inputs.FAMILY,
    agreement.FAMILY,
    linearity.FAMILY,
    first_order.FAMILY,
    second_order.FAMILY,
    batching.FAMILY,
    reference.FAMILY,
    mesh.FAMILY,
    state.FAMILY,  # last: it clears JAX's caches
)


def _chosen(families) -> frozenset[str]:
    """The family names `families` asks for (None: all), each checked against FAMILIES."""
    names = [family.name for family in FAMILIES]
    if families is None:
        return frozenset(names)
    if isinstance(families, str):
        families = (families,)
    unknown = [f for f in families if f not in names]
    if unknown:
        raise ValueError(
            f"jaxbind.testing.check: families {unknown} unknown; the families are {names}"
        )
    return frozenset(families)


def _unwrap(op, args, kwargs):
    """Accept an Op, a PytreeOp, or a functools.partial of one (as returned by factories)."""
    while isinstance(op, functools.partial):
        args = op.args + tuple(args)
        kwargs = {**op.keywords, **kwargs}
        op = op.func
    trees = None
    if isinstance(op, PytreeOp):  # checked through its underlying op, on array leaves
        args, kwargs, trees = op.protocol_call(*args, **kwargs)
        op = op.op
    if not isinstance(op, Op):
        raise TypeError(f"jaxbind.testing.check expects a jaxbind op, got {op!r}")
    return op, tuple(args), kwargs, trees


def check(
    op,
    *args,
    rtol=None,
    fd_step=None,
    batch_size=3,
    seed=0,
    verbose=True,
    mesh=None,
    families=None,
    **kwargs,
) -> CheckReport:
    """Check a jaxbind op on example inputs; raise AssertionError on any failure.

    Rows, each reported per role, argument or output with its dtype, by family:

    Every row computes in the dtypes a program computes in: with ``jax_enable_x64`` off
    (JAX's default), float64 inputs are checked as float32 (tolerances, finite-difference
    steps and direct calls alike), as ``op(*args)`` computes them.

    - **abstract vs callable**: the function, run on output buffers pre-filled with
      sentinels, writes every element of every output that the abstract function
      declares (an output left unwritten, or written to a copy, fails), and raises
      nothing;
    - **inputs unchanged**: each role's body (the function, its transposes, its JVP and
      VJP: callables, compiled kernels and JAX functions alike), called directly on
      writable copies of its inputs, leaves them and the call's array keyword arguments
      as they were (a compiled kernel's, in the very buffers the trampoline would pass);
    - **eager vs callable**, **jit vs eager**, **determinism**; with
      ``input_output_aliases``, **in place: donated vs not donated**;
    - **linearity**, per argument declared linear (linear and multilinear ops,
      ``linear_in``): ``f(0) == 0``, ``f(a x) == a f(x)``, ``f(x + y) == f(x) + f(y)``;
    - **first derivatives**, each role on its own: **jvp vs finite differences**, **vjp
      vs finite differences** (``<u, fd> == <J^T u, v>``, JAX's unconjugated pairing
      ``Re sum(a*b)``), then **vjp vs jvp (dot product)** and **transpose adjointness**
      (through ``jax.linear_transpose``, per argument declared linear);
    - **second derivatives**, for nonlinear ops whose JVP or VJP is a JAX function,
      complex arguments as their real and imaginary parts: **hessian symmetry**,
      **hessian-vector product vs finite differences** (through the VJP),
      **second-order jvp vs finite differences** (through the JVP);
    - **vmap**: **vmap vs loop** for every role (f, transposes, JVP, VJP) with inputs
      batched at axis 0 and at their last axis (``out_axes`` 0 and -1), **vmap(grad) vs
      loop** and **grad(vmap) vs loop**;
    - **native vs reference**, for ops with a JAX reference (``reference=``): f, called
      directly, against the reference (**forward**, per output); every rule the op
      declares against JAX's derivative of the reference (**jvp**, **vjp**, **transpose**
      per argument); and f and each declared rule under ``vmap`` against the vmapped
      reference (**vmap**). A rule the op declares no body for is computed from the
      reference: a **derived from the reference** row (status "derived") names it. An
      op without a reference gets one "not checked" row;
    - **sharding rule on a mesh**, for ops with ``sharding=`` given a ``mesh``: each
      factor in the arguments split over each mesh axis in turn, under ``jax.jit``,
      against one device: **mesh vs one device** (each output), **mesh jvp vs one
      device** (forward mode), **mesh gradient vs one device** (reverse mode),
      **collectives on a mesh** (the compiled programs' collectives in the detail; an
      all-gather fails it where the rule says the factor splits); a split the axis does
      not divide evenly is "not checked";
    - **state**, for ops with ``state=`` (last: it clears JAX's caches): **set up once
      per site** (a program with two sites, run three times), **fresh vs reused
      object**, **two threads** (each on inputs of its own, against those inputs run
      alone; and no object used by two calls at once unless it is ``"shared"``),
      **teardowns equal setups** after ``jax.clear_caches()`` ("not checked", naming
      the sites, where a program outside JAX's caches still holds the state), and
      **teardown runs** (a teardown that raises fails this row only).

    A check that applies but cannot run (the op has no transpose, no VJP, ...) is a row
    with the status "not checked" and the reason; it does not fail the check.

    Args:
      op: a jaxbind op, or a ``functools.partial`` of one.
      *args: example inputs (NumPy or JAX arrays), as for ``op(*args)``.
      rtol: override every relative tolerance (default: per check and precision). It
        does not change the finite-difference step.
      fd_step: the finite-difference step (default 1e-3 in single, 1e-6 in double
        precision), times the input's scale (at least 1). (Not ``eps``: ops take ``eps``
        themselves, DUCC's and FINUFFT's among them, and every other keyword argument goes
        to the op.)
      batch_size: batch size of the vmap checks.
      seed: seed for random directions and batches.
      verbose: print the report table.
      mesh: a ``jax.sharding.Mesh`` of several devices, to check the op's sharding rule
        on (see above); without one, an op with a rule gets a "not checked" row.
      families: the names of the families to run (default: all of `FAMILIES`), for
        instance ``("native vs reference",)`` to compare an expensive op with its
        reference alone. "abstract vs callable" runs first whatever is asked (it calls
        the function directly, and its failure stops the others); each family left out
        is one "not checked" row ("not asked").
      **kwargs: keyword arguments of the op call.

    Returns:
      The `CheckReport` when no check fails.

    Raises:
      AssertionError: naming each failed check, its target, dtype and error, followed by
        the whole table; its ``report`` attribute is the `CheckReport`.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"jaxbind.testing.check: batch_size must be a positive int (the size "
            f"of the vmap checks' batch), got {batch_size!r}"
        )
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            f"jaxbind.testing.check: mesh must be a jax.sharding.Mesh (for example "
            f"jax.make_mesh((4,), ('p',))), got {type(mesh).__name__}"
        )
    chosen = _chosen(families)
    op, args, kwargs, trees = _unwrap(op, args, kwargs)
    case = Case(
        op=op,
        args=tuple(as_computed(a) for a in args),
        kwargs=kwargs,
        trees=trees,
        rng=np.random.default_rng(seed),
        rtol=rtol,
        eps=fd_step,
        batch_size=batch_size,
        mesh=mesh,
    )
    case.out_avals = list(jax.eval_shape(case.call, *case.args))
    report = CheckReport()
    sdef = op.binding.options.state
    with contextlib.nullcontext() if sdef is None else watching(sdef) as case.watch:
        for family in FAMILIES:
            if family is FAMILIES[0] or family.name in chosen:
                report.extend(family.run(case))
            else:
                report.append(not_checked(family.name, "-", "not asked (families=...)"))
    name = op.binding.name
    if verbose:
        print(f"jaxbind.testing.check('{name}'):\n{report}")
    if report.failures():
        error = AssertionError(report.message(name))
        error.report = report  # type: ignore[attr-defined]  # every row, for a caller to read
        raise error
    return report
