"""Rows of an op that declares how it partitions (``sharding=``, ``reduction=``), on a mesh.

With ``check(op, *args, mesh=mesh)``, each factor of the op's rule that appears in its
arguments is split, in turn, over each axis of the mesh (every argument that has the
factor sharded along it, the others replicated), and the op under ``jax.jit`` on those
arguments is compared with the op on one device:

- **mesh vs one device**: each output;
- **mesh jvp vs one device**: forward mode (``jax.jvp``, through the op's JVP; f itself
  for linear and multilinear ops) for each differentiable argument, along one random
  tangent split as the argument is: a JVP that is right only on the whole array fails;
- **mesh gradient vs one device**: reverse mode (``jax.vjp``, through the op's transpose or
  VJP) for each differentiable argument, with one random cotangent;
- **collectives on a mesh**: the collectives of the compiled forward and gradient programs
  and its forward and reverse derivatives (`jaxbind.testing.collectives`), listed in the
  row's detail. A factor the rule lets XLA
  split (a pass-through or reduction factor) needs no all-gather: one fails the row (its
  error is the number of all-gathers), since it means the split argument was gathered
  (or the rule is wrong). A factor the rule keeps whole is gathered by design: reported,
  never failed.

A split that the mesh axis does not divide evenly, a missing forward or reverse role, an op
without a rule (when a mesh is given) or a rule without a mesh are "not checked" rows that
say why.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np

from .._rules.partitioning import declared
from .case import Case, Family, cotangent, needs_f, random_like, rel
from .collectives import collectives
from .report import CheckResult, not_checked

__all__ = ["FAMILY"]

_VALUES, _JVPS, _GRADS, _COLLECTIVES = (
    "mesh vs one device",
    "mesh jvp vs one device",
    "mesh gradient vs one device",
    "collectives on a mesh",
)


def _applies(case: Case) -> bool | str:
    options = case.binding.options
    if case.mesh is None:
        if options.sharding is None:
            return False
        return (
            f"the op declares {options.sharding.describe()}; check runs on one device unless "
            "given a mesh: pass mesh=jax.make_mesh(...) (several devices) to compare the op "
            "split along each factor with one device"
        )
    if options.sharding is None:
        return "the op declares no sharding (sharding=), so nothing splits it on a mesh"
    if case.mesh.devices.size < 2:
        return "the mesh has one device: nothing is split; give a mesh of several devices"
    return needs_f(case)


def _sizes(operands, args, factor: str) -> set[int]:
    return {np.shape(a)[group.index(factor)] for group, a in zip(operands, args) if factor in group}


def _rows(case: Case) -> Iterator[CheckResult]:
    shapes = tuple(np.shape(a) for a in case.args)
    rule = declared(case.binding.options, case.kwargs, case.binding.name, shapes)
    assert case.mesh is not None
    if rule is None:  # a sharding= function that gives this call none
        yield not_checked(FAMILY.name, "-", "the op's sharding= function gives this call no rule")
        return
    mesh, args = case.mesh, case.args
    splittable = set(rule.pass_through) | set(rule.reduction)
    diff = case.differentiable
    no_fwd = {i: case.missing(case.forward_role(i)) for i in diff}
    fwd = [i for i in diff if no_fwd[i] is None]
    no_rev = {i: case.missing(case.reverse_role(i)) for i in diff}
    rev = [i for i in diff if no_rev[i] is None]
    v = [random_like(args[i], case.rng) for i in fwd]
    u = [random_like(np.zeros(av.shape, av.dtype), case.rng) for av in case.out_avals]

    def jvps(*a_and_v):
        """Per argument in `fwd`: the op's outputs' tangents along its tangent alone."""
        a, tangents = a_and_v[: len(args)], a_and_v[len(args) :]
        found = []
        for i, t in zip(fwd, tangents):

            def fn(x, i=i):
                full = list(a)
                full[i] = x
                return case.call(*full)

            found.append(jax.jvp(fn, (a[i],), (t,))[1])
        return found

    def grads(*a):
        def fn(*xs):
            full = list(a)
            for i, x in zip(rev, xs):
                full[i] = x
            return case.call(*full)

        _, vjp = jax.vjp(fn, *(a[i] for i in rev))
        return vjp([cotangent(c) for c in u])

    with jax.default_device(jax.devices()[0]):
        one = [np.asarray(y) for y in case.call(*args)]
        one_grads = [np.asarray(g) for g in grads(*args)] if rev else []
        one_jvps = [[np.asarray(t) for t in ts] for ts in jvps(*args, *v)] if fwd else []

    factors = [f for f in rule.factors if any(f in group for group in rule.operands)]
    for factor in factors:
        for axis, n_dev in mesh.shape.items():
            target = f"{factor} over {axis!r}"
            sizes = _sizes(rule.operands, args, factor)
            uneven = sorted(s for s in sizes if s % n_dev)
            if uneven:
                why = (
                    f"the factor {factor!r} has size {uneven[0]}, which the mesh axis {axis!r} "
                    f"({n_dev} devices) does not split evenly"
                )
                for check in (_VALUES, _JVPS, _GRADS, _COLLECTIVES):
                    yield not_checked(check, target, why)
                continue
            specs = [
                jax.sharding.PartitionSpec(*(axis if f == factor else None for f in group))
                for group in rule.operands
            ]
            placed = [
                jax.device_put(a, jax.sharding.NamedSharding(mesh, s)) for a, s in zip(args, specs)
            ]
            compiled = jax.jit(case.call).lower(*placed).compile()
            found = {"f": collectives(compiled)}
            for name, av, a, b in zip(case.out_names, case.out_avals, compiled(*placed), one):
                yield case.row(
                    _VALUES, f"{target}: {name}", av.dtype, rel(a, b), case.tol("dot", av.dtype)
                )
            for i, missing in no_fwd.items():
                if missing is not None:
                    yield not_checked(_JVPS, f"{target}: argument {i}", missing)
            if fwd:
                placed_v = [
                    jax.device_put(t, jax.sharding.NamedSharding(mesh, specs[i]))
                    for i, t in zip(fwd, v)
                ]
                compiled_jvps = jax.jit(jvps).lower(*placed, *placed_v).compile()
                found["jvp"] = collectives(compiled_jvps)
                for i, ts, one_ts in zip(fwd, compiled_jvps(*placed, *placed_v), one_jvps):
                    for name, av, a, b in zip(case.out_names, case.out_avals, ts, one_ts):
                        yield case.row(
                            _JVPS,
                            f"{target}: argument {i} -> {name}",
                            av.dtype,
                            rel(a, b),
                            case.tol("dot", av.dtype),
                        )
            for i, missing in no_rev.items():
                if missing is not None:
                    yield not_checked(_GRADS, f"{target}: argument {i}", missing)
            if rev:
                compiled_grads = jax.jit(grads).lower(*placed).compile()
                found["gradient"] = collectives(compiled_grads)
                for i, a, b in zip(rev, compiled_grads(*placed), one_grads):
                    dtype = args[i].dtype
                    yield case.row(
                        _GRADS, f"{target}: argument {i}", dtype, rel(a, b), case.tol("dot", dtype)
                    )
            yield _collectives_row(rule, factor, target, factor in splittable, found)


def _collectives_row(rule, factor, target, split, found) -> CheckResult:
    """The row of one split's programs (`found`: program name -> Collectives)."""
    listed = "; ".join(
        f"{program}: " + (", ".join(f"{n} {kind}" for kind, n in c.counts.items() if n) or "none")
        for program, c in found.items()
    )
    gathers = sum(c["all-gather"] for c in found.values())
    if not split:
        return CheckResult(
            _COLLECTIVES,
            target,
            "-",
            0.0,
            0.0,
            f"{listed} (the rule keeps {factor!r} whole: arguments split along it are gathered)",
        )
    what = "a reduction" if factor in rule.reduction else "a pass-through factor"
    detail = f"{listed} ({factor!r} is {what} of the rule: no all-gather is needed"
    if gathers:
        detail += f", but the programs gather {gathers} time(s): the rule or the op is wrong"
    return CheckResult(_COLLECTIVES, target, "-", float(gathers), 0.0, detail + ")")


FAMILY = Family(
    name="sharding rule on a mesh",
    checks=(_VALUES, _JVPS, _GRADS, _COLLECTIVES),
    roles=frozenset(),
    options=frozenset({"sharding"}),  # (its reduction factors are part of the value)
    applies=_applies,
    rows=_rows,
)
