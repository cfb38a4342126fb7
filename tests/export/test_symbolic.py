"""Symbolic shapes: one jax.export artifact for every batch size (shape polymorphism)."""

import json
import pathlib

import jax
import jax.export
import numpy as np
import pytest
from support.arrays import assert_close
from support.ops import same_as_first
from support.processes import run_isolated
from support.skips import importable
from symbolic_cases import CASES, ducc_cases

import jaxbind

HERE = pathlib.Path(__file__).parent

pytestmark = pytest.mark.usefixtures("enable_x64")  # DUCC cases are float64 / complex128

HAVE_DUCC = importable("ducc0")


def _all_cases():
    return {**CASES, **(ducc_cases() if HAVE_DUCC else {})}


def _leaves(x):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(x)]


def _sym(spec, dtype=np.float32):
    return jax.ShapeDtypeStruct(jax.export.symbolic_shape(spec), dtype)


def _close(got, want, dtype):
    rtol = 2e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-9
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol, check_dtype=False)


LOADER = """
    import json, pathlib, sys
    import numpy as np
    import jax, jax.export
    jax.config.update("jax_enable_x64", True)
    import reference_ops  # creates the bindings the programs name
    if {ducc}:
        import jaxbind.contrib.jaxducc0  # noqa: F401
    here = pathlib.Path({where!r})
    for name, nsizes in json.loads((here / "cases.json").read_text()).items():
        exp = jax.export.deserialize(bytearray((here / f"{{name}}.bin").read_bytes()))
        for k in range(nsizes):
            args = [np.load(here / f"{{name}}.{{k}}.arg{{i}}.npy")
                    for i in range(len(exp.in_avals))]
            res = [np.asarray(r) for r in jax.tree.leaves(exp.call(*args))]
            np.savez(here / f"{{name}}.{{k}}.out.npz", *res)
    print("loaded", flush=True)
"""


def test_symbolic_exports_run_in_a_fresh_process(tmp_path):
    """Export once with symbolic shapes, serialize, load in a new process, call at 2+ sizes."""
    cases = _all_cases()
    for name, case in cases.items():
        exp = jaxbind.export(case.fn)(*case.arg_specs())
        assert "?" in exp.mlir_module().split("func.func public @main")[1].split("\n")[0], name
        (tmp_path / f"{name}.bin").write_bytes(exp.serialize())
        for k, size in enumerate(case.sizes):
            for i, a in enumerate(case.args(size, seed=k)):
                np.save(tmp_path / f"{name}.{k}.arg{i}.npy", a)
    (tmp_path / "cases.json").write_text(json.dumps({n: len(c.sizes) for n, c in cases.items()}))
    loader = LOADER.format(ducc=HAVE_DUCC, where=str(tmp_path))
    proc = run_isolated(tmp_path, loader, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name, case in cases.items():
        for k, size in enumerate(case.sizes):
            args = case.args(size, seed=k)
            with np.load(tmp_path / f"{name}.{k}.out.npz") as npz:
                got = [npz[f"arr_{i}"] for i in range(len(npz.files))]
            want = _leaves(case.ref(*args))
            assert len(got) == len(want), name
            _close(got, want, args[0].dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_symbolic_export_matches_the_concrete_program(name):
    """In process: the one symbolic artifact gives what jit gives at each concrete size."""
    case = CASES[name]
    exp = jax.export.deserialize(jaxbind.export(case.fn)(*case.arg_specs()).serialize())
    for k, size in enumerate(case.sizes):
        args = case.args(size, seed=k)
        _close(_leaves(exp.call(*args)), _leaves(jax.jit(case.fn)(*args)), args[0].dtype)


def test_shape_expressions_reach_the_program():
    """2 * b and b - k are computed from b when the program runs, not fixed at export."""
    from reference_ops import stack3, trim

    scope = jax.export.SymbolicScope(("b >= 2",))
    spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 3", scope=scope), np.float32)
    exp = jaxbind.export(lambda x: (stack3(x)[0], trim(x, k=2)[0]))(spec)
    assert [str(a.shape) for a in exp.out_avals] == ["(2*b, 3)", "(b - 2, 3)"]
    for b in (2, 5):
        x = np.arange(3 * b, dtype=np.float32).reshape(b, 3)
        y, z = exp.call(x)
        np.testing.assert_array_equal(y, np.concatenate([x, 3 * x]))
        np.testing.assert_array_equal(z, x[2:])


def test_readme_example_half_spectrum_shape():
    """The README's example: (b, n) -> (2 b, n // 2 + 1)."""

    def f(out, args, kwargs_dump):
        x = args[0]
        out[0][...] = np.concatenate([x, -x])[:, : x.shape[1] // 2 + 1]

    def abstract(x, **kwargs):
        return (((2 * x.shape[0], x.shape[1] // 2 + 1), x.dtype),)

    op = jaxbind.get_nonlinear_call(f, (None, None), abstract, None, name="tests.sym_readme")
    exp = jaxbind.export(lambda x: op(x)[0])(_sym("b, n"))
    assert str(exp.out_avals[0].shape) in ("(2*b, floordiv(n, 2) + 1)", "(2*b, n//2 + 1)")
    for shape in ((3, 8), (5, 4), (1, 7)):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(exp.call(x), np.concatenate([x, -x])[:, : shape[1] // 2 + 1])


def _double_op(name, abstract, write=None):
    def f(out, args, kwargs_dump):
        if write is None:
            out[0][...] = 2 * args[0]
        else:
            write(out, args)

    return jaxbind.get_linear_call(f, f, abstract, abstract, name=name, replace=True)


def test_callable_writing_another_shape_is_a_clean_error():
    def write_half(out, args):
        out[0][...] = np.zeros((args[0].shape[0], 4), np.float32)

    op = _double_op("tests.sym_bad_writer", same_as_first, write_half)
    exp = jaxbind.export(lambda x: op(x)[0])(_sym("b, 8"))
    with pytest.raises(Exception, match=r"tests\.sym_bad_writer.*\n?.*broadcast"):
        exp.call(np.ones((3, 8), np.float32))


def test_artifact_that_disagrees_with_the_loading_binding_is_refused():
    """The loading process declares other shapes for the same name: refused per size."""
    op = _double_op("tests.sym_declared", same_as_first)
    blob = jaxbind.export(lambda x: op(x)[0])(_sym("b, 8")).serialize()
    np.testing.assert_array_equal(
        jax.export.deserialize(blob).call(np.ones((2, 8), np.float32)), 2 * np.ones((2, 8))
    )
    op2 = _double_op("tests.sym_declared", lambda x: (((2 * x.shape[0], 8), x.dtype),))
    exp = jax.export.deserialize(blob)
    for b in (1, 3):
        with pytest.raises(
            Exception,
            match=rf"tests\.sym_declared.*output 0 is float32\[{b}, 8\] "
            r"in the program, but the abstract function declares "
            rf"float32\[{2 * b}, 8\]",
        ):
            exp.call(np.ones((b, 8), np.float32))
    assert op.name == op2.name == "tests.sym_declared"  # both alive until here


def test_abstract_function_that_needs_concrete_sizes_says_so():
    op = _double_op("tests.sym_concrete_only", lambda x: (((int(x.shape[0]), 8), x.dtype),))
    with pytest.raises(Exception, match=r"tests\.sym_concrete_only.*symbolic"):
        jaxbind.export(lambda x: op(x)[0])(_sym("b, 8"))
    np.testing.assert_array_equal(
        jax.jit(lambda x: op(x)[0])(np.ones((2, 8), np.float32)), 2 * np.ones((2, 8))
    )


def test_symbolic_keyword_argument_is_refused_with_the_binding_name():
    op = _double_op("tests.sym_kwarg", same_as_first)
    with pytest.raises(TypeError, match=r"tests\.sym_kwarg.*keyword argument 'n'.*symbolic"):
        jaxbind.export(lambda x: op(x, n=x.shape[0])[0])(_sym("b, 8"))


def test_shape_that_is_neither_int_nor_symbolic_names_binding_and_output():
    op = _double_op("tests.sym_float_shape", lambda x: (((2.5, 8), x.dtype),))
    with pytest.raises(TypeError, match=r"tests\.sym_float_shape.*output 0 has shape \(2\.5, 8\)"):
        jaxbind.export(lambda x: op(x)[0])(_sym("b, 8"))


def test_dimension_that_may_be_negative_needs_a_constraint():
    """b - k < 0 for a small b: refused at export unless a constraint rules it out."""
    from reference_ops import trim

    with pytest.raises(
        ValueError,
        match=r"reference_ops\._trim.*output 0.*b - 2.*negative.*"
        r"constraints",
    ):
        jaxbind.export(lambda x: trim(x, k=2)[0])(_sym("b"))
    scope = jax.export.SymbolicScope(("b >= 2",))
    spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b", scope=scope), np.float32)
    exp = jaxbind.export(lambda x: trim(x, k=2)[0])(spec)
    with pytest.raises(Exception, match=r"constraint b >= 2|Expected value >= 2"):
        exp.call(np.ones(1, np.float32))  # JAX checks the constraint before anything runs
    np.testing.assert_array_equal(exp.call(np.arange(3, dtype=np.float32)), [2.0])


@pytest.mark.skipif(not HAVE_DUCC, reason="needs ducc0")
def test_ducc_fft_length_must_be_concrete():
    from jaxbind.contrib import jaxducc0

    with pytest.raises(TypeError, match=r"r2c.*transformed axis.*symbolic"):
        jaxbind.export(lambda x: jaxducc0.r2c(x)[0])(_sym("n"))
    with pytest.raises(TypeError, match=r"c2r.*lastsize.*symbolic"):
        jaxbind.export(lambda x: jaxducc0.c2r(x, lastsize=2 * x.shape[0] - 2)[0])(
            _sym("n", np.complex64)
        )
    # symbolic batch axes and a concrete transformed axis are fine (see symbolic_cases)
    jaxbind.export(lambda x: jaxducc0.r2c(x, axes=(1,))[0])(_sym("b, 8"))
