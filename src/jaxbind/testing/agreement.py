"""eager vs callable, jit vs eager, determinism: the op, eagerly and jitted, against its
function called directly, and two jitted calls against each other. With
``input_output_aliases``, a jitted call whose aliased inputs are donated (the output is then
the input's own memory) against one without. With ``state=``, the program's calls use the
call site's object, set up once and reused (jit vs eager, determinism), and the direct
call a fresh one: the rows compare a fresh object with a reused one.

Options this family can only name: a side effect (``has_side_effect``, ``ordered``) is not
observable from the outside, and ``platform_mode="host"`` differs from "device" only on a
GPU; their rows say "not checked".
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np

from .case import Case, Family, needs_f, rel
from .report import CheckResult, not_checked


def _rows(case: Case) -> Iterator[CheckResult]:
    assert case.direct is not None
    names, avals = case.out_names, case.out_avals
    eager = case.call(*case.args)
    for name, av, d, e in zip(names, avals, case.direct, eager):
        yield case.row(
            "eager vs callable", name, av.dtype, rel(e, d, True), case.tol("exact", av.dtype)
        )
    jitted = jax.jit(case.call)
    first, second = jitted(*case.args), jitted(*case.args)
    for name, av, e, j1, j2 in zip(names, avals, eager, first, second):
        yield case.row(
            "jit vs eager", name, av.dtype, rel(j1, e, True), case.tol("exact", av.dtype)
        )
        same = np.array_equal(np.asarray(j1), np.asarray(j2), equal_nan=True)
        yield case.row("determinism", name, av.dtype, 0.0 if same else 1.0, 0.0)
    yield from _aliases(case, first)
    options = case.binding.options
    if options.effect is not None:
        yield not_checked(
            "side effects",
            "f",
            f"the op declares an {options.effect} side effect, which check cannot observe "
            "(that jaxbind keeps and orders such calls is tested by jaxbind itself)",
        )
    if options.platform_mode != "device" and jax.default_backend() == "cpu":
        yield not_checked(
            "platform_mode",
            repr(options.platform_mode),
            "on the CPU both platform modes pass NumPy views; run check on a GPU",
        )


def _aliases(case: Case, jitted) -> Iterator[CheckResult]:
    shared = sorted({i for i, _ in case.binding.options.aliases if i < len(case.args)})
    if not shared:
        return
    donated = jax.jit(case.call, donate_argnums=tuple(shared))
    fresh = [jax.numpy.array(a, copy=True) for a in case.args]  # donation consumes them
    results = donated(*fresh)
    for name, av, a, b in zip(case.out_names, case.out_avals, results, jitted):
        tol = case.tol("exact", av.dtype)
        yield case.row("in place: donated vs not donated", name, av.dtype, rel(a, b, True), tol)


FAMILY = Family(
    name="eager and jit",
    checks=(
        "eager vs callable",
        "jit vs eager",
        "determinism",
        "in place: donated vs not donated",
        "side effects",
        "platform_mode",
    ),
    roles=frozenset({"f"}),
    options=frozenset({"aliases", "effect", "platform_mode", "state", "state_key"}),
    applies=needs_f,
    rows=_rows,
)
