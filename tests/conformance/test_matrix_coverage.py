"""The matrix's axes against the project's own tables: a kind of body, a kernel class, a row of
the lowering table or an option that the matrix does not know fails here until a row of
matrix.py covers it (or names the tests that do, where a cell cannot run on this machine)."""

import inspect
import pathlib

import pytest
from conformance.bodies import build
from conformance.matrix import (
    APIS,
    BODY_KINDS,
    OPTION_VARIANTS,
    OPTIONS_ELSEWHERE,
    TARGET_ROWS,
    TRANSFORMS,
    Cell,
    all_cells,
    sample,
)

import jaxbind
from jaxbind import _definition, _kernels
from jaxbind._kernels import cuda
from jaxbind._roles import Body
from jaxbind._rules.targets import TARGETS
from jaxbind._where import runs

TESTS = pathlib.Path(__file__).resolve().parent.parent


def _named_tests_exist(text: str) -> None:
    """Every tests/... path a row names exists (a row cannot point at nothing)."""
    for word in text.replace(",", " ").split():
        if word.startswith("tests/"):
            assert (TESTS.parent / word).exists(), f"{word} (named by the matrix) does not exist"


def test_every_kind_of_body_is_a_row():
    assert {b for k in BODY_KINDS.values() for b in k.bodies} == set(Body)
    assert all(k.body in k.bodies for k in BODY_KINDS.values())


@pytest.mark.parametrize("kind", sorted(BODY_KINDS))
@pytest.mark.parametrize("api", APIS)
def test_each_row_builds_ops_of_its_kinds_and_refuses_where_the_project_refuses(kind, api):
    """A row's op has the kinds of body the row names (the project's table says so, by
    Body.of), and a cell expects a refusal on the CPU exactly where jaxbind._where.runs
    refuses the op there."""
    row = BODY_KINDS[kind]
    op = build(kind, api, "nonlinear/float32", name=f"conformance.kinds.{kind}.{api}").op
    binding = op.binding
    assert {binding.role(r).kind for r in binding.roles} == set(row.bodies)
    here = runs(binding, "f", "cpu")
    assert here.kind is row.body
    refused = Cell(kind, api, "nonlinear/float32", "plain", "jit").refusal() is not None
    assert (here.row == "refused") == refused, here


def test_every_kernel_class_is_a_row():
    classes = {
        name
        for module in (_kernels, cuda)
        for name, value in vars(module).items()
        if inspect.isclass(value) and isinstance(getattr(value, "body_kind", None), Body)
    }
    assert classes == {k.kernel_class for k in BODY_KINDS.values()} - {""}


def test_every_row_of_the_lowering_table_is_covered():
    rows = {(t.name, t.platform) for t in TARGETS}
    assert rows == set(TARGET_ROWS), (
        f"rows the matrix does not know: {rows - set(TARGET_ROWS)}; "
        f"rows that are gone: {set(TARGET_ROWS) - rows}"
    )
    for text in TARGET_ROWS.values():
        _named_tests_exist(text)


def test_every_option_is_varied_by_the_matrix_or_covered_elsewhere():
    varied = {
        name.replace("func_can_batch", "vectorized")
        for per_api in OPTION_VARIANTS.values()
        for options in per_api.values()
        if options
        for name in options
    }
    # (prefer_reference: an option of both APIs that is part of the op's reference, not of
    # its Options)
    options = {*_definition.option_fields(), "prefer_reference"}
    assert varied | set(OPTIONS_ELSEWHERE) == options, (
        f"options the matrix does not cover: {options - varied - set(OPTIONS_ELSEWHERE)}"
    )
    assert not varied & set(OPTIONS_ELSEWHERE)
    for text in OPTIONS_ELSEWHERE.values():
        _named_tests_exist(text)


def test_the_transformations_are_those_users_combine():
    assert set(TRANSFORMS) >= {
        "eager", "jit", "grad", "jvp", "vjp", "vmap", "vmap_grad", "hessian", "linear_transpose",
        "export", "portable", "use_reference", "use_reference_strict", "replace", "shard_map",
        "c_host",  # a bundle without Python (docs/without-python.md)
    }  # fmt: skip
    assert set(APIS) == {"jaxbind13", "native"}


def test_the_sample_covers_every_pair_of_values():
    cells = all_cells()
    chosen = sample(7)
    axes = ("kind", "api", "dtype", "option", "transform")
    for i, a in enumerate(axes):
        for b in axes[i + 1 :]:
            want = {(getattr(c, a), getattr(c, b)) for c in cells}
            got = {(getattr(c, a), getattr(c, b)) for c in chosen}
            assert want == got, f"the sample misses pairs of {a} and {b}: {want - got}"
    assert len(chosen) < len(cells) / 10


def test_the_public_kernel_makers_are_the_kernel_rows():
    assert BODY_KINDS["numba"].kernel_class == type(jaxbind.kernel(lambda out, x: None)).__name__
