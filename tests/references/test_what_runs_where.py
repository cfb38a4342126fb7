"""docs/portable.md's table "What runs where" against jaxbind._where.runs, the one answer
the lowering, registration and jaxbind.testing.check ask: each cell, for an op with a
reference and one without, on a platform where its body runs and on one where it does not."""

import pathlib

import pytest
import reference_ops as ro
from conformance.bodies import build

import jaxbind
from jaxbind._roles import NATIVE_PLATFORMS, Body
from jaxbind._where import runs

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "portable.md"

# The table's rows: the switch, and whether prefer_reference= names the platform
ROWS = {
    "default": ("off", False),
    "`prefer_reference=` names the platform": ("off", True),
    "`use_reference()`, `JAXBIND_USE_REFERENCE=1`": ("on", False),
    "`use_reference(strict=True)`, `portable=True`, `JAXBIND_USE_REFERENCE=strict`": (
        "strict",
        False,
    ),
}


def _table() -> dict[str, tuple[str, str]]:
    text = DOC.read_text().split("## What runs where", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in text.splitlines() if line.startswith("|")][2:]  # (head, rule)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {label: (native, elsewhere) for label, native, elsewhere in cells}


def _expected(cell: str, with_reference: bool) -> str:
    """ "native", "reference" or "refused": the cell's answer for an op with a reference,
    and after "without one:" (if it says) for an op without."""
    first, _, without = cell.partition("; without one: ")
    said = first if with_reference or not without else without
    return said.split()[0].strip(",;")


def _op(kind: str, reference: bool, prefer: tuple):
    name = f"tests.where.{kind}.{reference}.{'_'.join(prefer) or 'none'}"
    if kind == "callable":
        return jaxbind.get_linear_call(
            ro._matvec, ro._matvec_T, ro._matvec_abstract, ro._matvec_abstract_T,
            reference=ro.matvec_ref if reference else None, prefer_reference=prefer,
            name=name, replace=True,
        )  # fmt: skip
    kind = "cuda" if reference else "cuda_noref"
    options = {"prefer_reference": prefer}
    built = build(kind, "jaxbind13", "nonlinear/float32", name=name, replace=True, options=options)
    return built.op


def test_the_table_has_the_rows_the_switch_and_prefer_reference_make():
    assert set(_table()) == set(ROWS)


# (column, kind of body, platform): the CPU is where a callable runs; TPU and, for a CUDA
# kernel, the CPU are where they do not (prefer_reference can name the CPU only there)
CASES = [(0, "callable", "cpu"), (1, "callable", "tpu"), (1, "cuda_kernel", "cpu")]


CELLS = [
    (row, case)
    for row in ROWS
    for case in CASES
    if not ROWS[row][1] or case[2] in NATIVE_PLATFORMS  # (prefer_reference: those only)
]


@pytest.mark.parametrize(("row", "case"), CELLS, ids=lambda c: c if isinstance(c, str) else c[1])
@pytest.mark.parametrize("with_reference", [True, False], ids=["reference", "none"])
def test_each_cell_is_what_runs_says(row, case, with_reference):
    column, kind, platform = case
    switch, prefer = ROWS[row]
    cell = _table()[row][column]
    if prefer and not with_reference:  # an op that prefers a reference it lacks: refused
        assert _expected(cell, with_reference) == "refused"  # when it is defined
        with pytest.raises(TypeError, match="has prefer_reference"):
            _op(kind, with_reference, (platform,))
        return
    op = _op(kind, with_reference, (platform,) if prefer else ())
    got = runs(op.binding, "f", platform, switch=switch)
    assert got.row == _expected(cell, with_reference), (row, cell, got)
    assert got.body_runs_here == (platform in got.kind.platforms) == (column == 0)
    if got.row == "refused":
        with pytest.raises(Exception) as raised:
            got.refusal()
        assert op.binding.name in str(raised.value)
        if row == "default":  # the platform, and `reference=`
            assert platform in str(raised.value) and "reference=" in str(raised.value)


def test_traced_roles_run_on_every_platform_and_effects_are_hosted_on_the_cpu():
    op = build("jax", "jaxbind13", "nonlinear/float32", name="tests.where.jax", replace=True).op
    assert op.binding.role("jvp").kind is Body.JAX
    assert runs(op.binding, "jvp", "tpu", switch="strict").row == "native"
    effect = jaxbind.get_linear_call(
        ro._matvec, ro._matvec_T, ro._matvec_abstract, ro._matvec_abstract_T,
        has_side_effect=True, name="tests.where.effect", replace=True,
    )  # fmt: skip
    assert runs(effect.binding, "f", "cpu", spread=True).row == "hosted"
    refused = runs(effect.binding, "f", "cuda", spread=True)
    assert refused.row == "refused" and "tests.where.effect" in str(refused.error)
    assert runs(effect.binding, "f", "cuda").row == "native"
    assert runs(effect.binding, "f", "cuda", spread=True, hosted=True).row == "native"
