"""jaxbind.testing.check passes correct ops and catches the usual binding bugs."""

import ctypes
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_ops import (
    axpy,
    bilinear,
    flip2,
    flipsum,
    matvec,
    native_pair,
    nonlinear,
    power,
)
from support.arrays import random
from support.clib import c_kernel, compile_c_library
from support.dtypes import FLOAT_DTYPES, global_x64
from support.ops import copy_last, same_as_first

import jaxbind
from jaxbind._options import Options
from jaxbind._roles import Body, Kind, Role, role_table
from jaxbind.testing import FAMILIES, check


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_reference_ops_pass(enable_x64, dtype):
    report = check(matvec, random((4, 3), dtype, 1), random((3,), dtype, 2), verbose=False)
    names = {r.check for r in report}
    assert {
        "abstract vs callable: written",
        "eager vs callable",
        "jit vs eager",
        "determinism",
        "jvp vs finite differences",
        "vjp vs jvp (dot product)",
        "transpose adjointness",
        "vmap vs loop",
    } <= names
    check(axpy, random((5,), dtype, 3), random((5,), dtype, 4), scale=1.5, verbose=False)
    check(bilinear, random((5,), dtype, 5), random((5,), dtype, 6), verbose=False)
    check(nonlinear, random((5,), dtype, 7), random((5,), dtype, 8), verbose=False)
    check(flip2, random((3, 4), dtype, 9), verbose=False)
    report = check(flipsum, random((3, 4), dtype, 10), random((3, 4), dtype, 11), verbose=False)
    assert _rows_named_by_families(report) and not report.not_checked()


def _rows_named_by_families(report) -> bool:
    """Every row is one its family declares (or a family's own "not checked" row)."""
    names = {name for family in FAMILIES for name in (family.name, *family.checks)}
    return {r.check for r in report} <= names


def test_every_role_option_and_kind_of_body_is_covered_by_a_family():
    roles = set()
    for kind in Kind:
        table = role_table(kind, copy_last, (copy_last, copy_last), (copy_last,) * 2, None, None)
        roles |= {"T<i>" if Role.parse(r).index is not None else r for r in table}
    options = {f.name for f in dataclasses.fields(Options)}
    covered = lambda what: set().union(*(getattr(family, what) for family in FAMILIES))
    assert roles == {"f", "T", "T<i>", "jvp", "vjp"}
    assert roles <= covered("roles"), "a role no family checks"
    assert options <= covered("options"), "an option no family checks"
    # (CUDA kernels and kernels for CUDA run in GPU programs only: no family calls them
    # directly, and on a CPU check reports their rows "not checked", tests/conformance's
    # cuda and stream rows)
    gpu_only = {k for k in Body if not k.traced and "cpu" not in k.platforms}
    assert gpu_only == {Body.CUDA_KERNEL, Body.STREAM_KERNEL, Body.GRAPH_SAFE_KERNEL}
    assert set(Body) - gpu_only <= covered("bodies"), "a kind of body no family calls"
    for family in FAMILIES:  # and no family claims what does not exist
        assert family.roles <= roles and family.options <= options, family.name


def test_fixed_arguments_are_not_differentiated(enable_x64):
    report = check(power, np.float64(3.0), np.abs(random((4,), seed=12)) + 1, verbose=False)
    assert not any("argument 0" in r.target for r in report if "jvp" in r.check)


def test_rows_compute_in_the_dtypes_the_program_computes_in(x64):
    # float64 NumPy inputs: a program computes them in float32 while jax_enable_x64 is off
    # (JAX's default), so tolerances and finite-difference steps are float32's, in both APIs.
    computed = "float64" if x64 else "float32"
    x, y = random((5,), np.float64, 7), random((5,), np.float64, 8)
    calls = [
        (matvec, (random((4, 3), np.float64, 1), random((3,), np.float64, 2))),
        (nonlinear, (x, y)),
        (power, (np.float64(3.0), np.abs(x) + 1)),
        (native_pair, ({"a": x, "b": y},)),
    ]
    for op, args in calls:
        report = check(op, *args, verbose=False)
        derivative = [r for r in report if r.check == "jvp vs finite differences"]
        assert derivative and {r.dtype for r in derivative} == {computed}, op


# --- deliberately wrong bindings -----------------------------------------------------


def _mv(out, args, kd):
    a, x = args
    out[0][...] = a @ x


def _mv_abstract(a, x, **k):
    return (((a.shape[0],), x.dtype),)


def _mv_abstract_T(a, ct, **k):
    return (((a.shape[1],), ct.dtype),)


def _mv_T_wrong(out, args, kd):
    a, ct = args
    out[0][...] = a @ ct  # forgot the .T (only shape-compatible for square a)


def test_catches_a_wrong_transpose(enable_x64, capsys):
    op = jaxbind.get_linear_call(
        _mv,
        _mv_T_wrong,
        _mv_abstract,
        _mv_abstract_T,
        first_n_args_fixed=1,
        name="tests.wrong_transpose",
    )
    with pytest.raises(AssertionError) as info:
        check(op, random((3, 3), seed=1), random((3,), seed=2))
    text = str(info.value)
    assert "'tests.wrong_transpose' failed" in text
    assert "- transpose adjointness [argument 1, float64]" in text
    assert "- vjp vs jvp (dot product) [argument 1, float64]" in text
    assert "jvp vs finite differences" not in text.split("\n\n")[0]  # the forward is right


def test_a_wrong_transpose_fails_on_float64_inputs_while_x64_is_off():
    op = jaxbind.get_linear_call(
        _mv, _mv_T_wrong, _mv_abstract, _mv_abstract_T, first_n_args_fixed=1, name="tests.wt32"
    )
    with global_x64(False):
        with pytest.raises(AssertionError, match=r"transpose adjointness \[argument 1, float32\]"):
            check(op, random((3, 3), seed=1), random((3,), seed=2), verbose=False)


def _mv_T_conj(out, args, kd):
    a, ct = args
    out[0][...] = a.T.conj() @ ct  # conjugates, against JAX's convention


def test_catches_an_extra_conjugate(enable_x64):
    op = jaxbind.get_linear_call(
        _mv,
        _mv_T_conj,
        _mv_abstract,
        _mv_abstract_T,
        first_n_args_fixed=1,
        name="tests.conjugating_transpose",
    )
    a = random((3, 2), np.complex128, 3)
    with pytest.raises(AssertionError, match=r"transpose adjointness \[argument 1, complex128\]"):
        check(op, a, random((2,), np.complex128, 4), verbose=False)
    # with real inputs the conjugate does nothing, and the op passes
    check(op, a.real.copy(), random((2,), np.float64, 4), verbose=False)


def _sq(out, args, kd):
    out[0][...] = args[0] ** 2


def _sq_jvp_wrong(out, args, kd):
    x, dx = args
    out[0][...] = x * dx  # factor 2 missing


def _sq_vjp(out, args, kd):
    x, ct = args
    out[0][...] = 2 * x * ct


def test_catches_a_wrong_jvp(enable_x64):
    op = jaxbind.get_nonlinear_call(
        _sq, (_sq_jvp_wrong, _sq_vjp), same_as_first, same_as_first, name="tests.wrong_jvp"
    )
    with pytest.raises(AssertionError) as info:
        check(op, random((4,), seed=5), verbose=False)
    assert "- jvp vs finite differences [argument 0 -> output 0, float64]" in str(info.value)
    assert "- vjp vs jvp (dot product) [argument 0, float64]" in str(info.value)


def _writes_half(out, args, kd):
    out[0][: args[0].shape[0] // 2] = args[0][: args[0].shape[0] // 2]


def _writes_a_copy(out, args, kd):
    result = out[0]
    result = args[0] * 2  # rebinding: nothing reaches XLA's buffer
    del result


def test_catches_unwritten_outputs(enable_x64):
    for f, frac in ((_writes_half, "50%"), (_writes_a_copy, "100%")):
        op = jaxbind.get_linear_call(
            f, None, same_as_first, None, name=f"tests.unwritten_{f.__name__}"
        )
        with pytest.raises(
            AssertionError,
            match=rf"abstract vs callable: written \[output 0, "
            rf"float64\].*{frac} of the elements left",
        ):
            check(op, random((6,), seed=6), verbose=False)


def _wrong_shape_abstract(x, **k):
    return (((x.shape[0] + 1,), x.dtype),)


def test_catches_an_abstract_function_that_disagrees(enable_x64):
    op = jaxbind.get_linear_call(
        lambda out, args, kd: out[0].__setitem__(..., args[0]),
        None,
        _wrong_shape_abstract,
        None,
        name="tests.wrong_abstract",
    )
    with pytest.raises(AssertionError, match=r"callable runs \[f.*could not broadcast"):
        check(op, random((4,), seed=7), verbose=False)


_counter = [0]


def _nondeterministic(out, args, kd):
    _counter[0] += 1
    out[0][...] = args[0] + _counter[0]


def test_catches_nondeterminism(enable_x64):
    op = jaxbind.get_linear_call(_nondeterministic, None, same_as_first, None, name="tests.nondet")
    with pytest.raises(AssertionError, match=r"determinism \[output 0, float64\]"):
        check(op, random((3,), seed=8), verbose=False)


def test_report_table(enable_x64, capsys):
    check(axpy, random((3,)), random((3,)))
    out = capsys.readouterr().out
    assert "jaxbind.testing.check('reference_ops._axpy')" in out
    assert "transpose adjointness" in out and "ok" in out


def test_families_runs_the_families_asked_and_says_which_it_left_out(enable_x64):
    """families= runs those families (and the first, which calls the function); every
    other is one "not asked" row, and a failure outside them goes unseen."""
    op = jaxbind.get_linear_call(
        _mv, _mv_T_wrong, _mv_abstract, _mv_abstract_T, first_n_args_fixed=1, name="tests.fam"
    )
    args = random((3, 3), seed=1), random((3,), seed=2)
    report = check(op, *args, verbose=False, families=("linearity",))
    ran = {r.check for r in report if r.checked}
    assert "linearity" in " ".join(ran) and not any("adjoint" in c for c in ran)
    skipped = {r.check for r in report.not_checked() if "not asked" in r.detail}
    assert skipped == {f.name for f in FAMILIES[1:]} - {"linearity"}
    with pytest.raises(AssertionError, match="transpose adjointness"):
        check(op, *args, verbose=False, families="first derivatives")
    with pytest.raises(ValueError, match=r"families \['adjoint'\] unknown; the families are"):
        check(op, *args, families=("adjoint",))


def test_rejects_non_ops():
    with pytest.raises(TypeError, match="expects a jaxbind op"):
        check(jnp.sin, np.ones(3))


# --- inputs unchanged: bodies that write their inputs past jaxbind's read-only views -------


def _poke(a: np.ndarray, value=0.0) -> None:
    """Write into `a` through its address, as C code or ctypes can: read-only flags
    do not stop it."""
    raw = (ctypes.c_char * a.nbytes).from_address(a.ctypes.data)
    np.frombuffer(raw, a.dtype)[...] = value


def _copy_pokes_input(out, args, kd):
    out[0][...] = args[0]
    _poke(args[0])


def _transpose_pokes_cotangent(out, args, kd):
    out[0][...] = args[-1]
    _poke(args[-1])


def _pokes_kwarg(out, args, kd):
    out[0][...] = args[0]
    _poke(jaxbind.load_kwargs(kd)["weights"], 7.0)


def _failure(op, *args, **options) -> str:
    """The message of the check of `op` on `args`, which fails."""
    with pytest.raises(AssertionError) as info:
        check(op, *args, verbose=False, **options)
    return str(info.value)


def _row(text: str, check_name: str, target: str) -> bool:
    return f"- {check_name} [{target}" in text.split("\n\n")[0]


def test_catches_a_callable_that_writes_its_input(enable_x64):
    op = jaxbind.get_linear_call(
        _copy_pokes_input, copy_last, same_as_first, None, name="tests.pokes_f"
    )
    text = _failure(op, random((4,), seed=1))
    assert "'tests.pokes_f' failed" in text
    assert _row(text, "inputs unchanged", "the function: input 0, float64]")
    assert "the function wrote 100% of its input 0" in text


def test_catches_a_transpose_that_writes_its_cotangent(enable_x64):
    op = jaxbind.get_linear_call(
        copy_last, _transpose_pokes_cotangent, same_as_first, None, name="tests.pokes_T"
    )
    text = _failure(op, random((4,), seed=2))
    assert _row(text, "inputs unchanged", "the transpose: input 0, float64]")
    assert not _row(text, "inputs unchanged", "the function")


def test_catches_a_native_jvp_that_writes_a_primal(enable_x64):
    @jaxbind.nonlinear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.pokes_jvp"
    )
    def sin(x):
        return np.sin(x)

    @sin.def_jvp
    def _(primals, tangents):
        result = np.cos(primals[0]) * tangents[0]
        ptr = ctypes.cast(primals[0].ctypes.data, ctypes.POINTER(ctypes.c_double))
        np.ctypeslib.as_array(ptr, primals[0].shape)[0] = 99.0
        return result

    @sin.def_vjp
    def _(primals, cotangent):
        return (np.cos(primals[0]) * cotangent,)

    text = _failure(sin, random((5,), seed=3))
    assert _row(text, "inputs unchanged", "the JVP: input 0, float64]")
    assert "the JVP wrote 20% of its input 0" in text
    assert not _row(text, "inputs unchanged", "the VJP")


def test_catches_a_write_into_an_array_keyword_argument(enable_x64):
    op = jaxbind.get_linear_call(
        _pokes_kwarg, copy_last, same_as_first, None, name="tests.pokes_kwarg"
    )
    text = _failure(op, random((3,), seed=4), weights=np.ones(2))
    assert _row(text, "inputs unchanged", "the function: keyword argument 'weights'")
    assert "wrote 100% of keyword argument 'weights'" in text


_CLOBBER_SOURCE = r"""
#include "jaxbind/kernel.h"
/* out = x (float64), then x = 0: breaks the contract that inputs are read-only */
int32_t copy_then_clobber(const jaxbind_call *call) {
  double *x = (double *)call->inputs[call->n_inputs - 1].data;
  double *y = (double *)call->outputs[0].data;
  int64_t n = 1;
  for (int64_t d = 0; d < call->outputs[0].rank; ++d) n *= call->outputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) { y[i] = x[i]; x[i] = 0; }
  return 0;
}
"""


@pytest.fixture(scope="module")
def clobber_lib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "clobber", _CLOBBER_SOURCE)


@pytest.mark.parametrize("how", ["ctypes", "cffi"])
def test_catches_a_c_kernel_that_writes_its_input(enable_x64, clobber_lib, how):
    k = c_kernel(clobber_lib, how, "copy_then_clobber")
    op = jaxbind.get_linear_call(copy_last, k, same_as_first, None, name=f"tests.clobber_{how}")
    text = _failure(op, random((4,), seed=5))
    assert _row(text, "inputs unchanged", "the transpose: input 0, float64]")


def test_inputs_unchanged_rows_for_every_role_kind(enable_x64):
    """Correct bodies of every kind (callable, numba kernel, JAX function) pass the row."""

    @jaxbind.kernel
    def scale(out, x, factor):
        for i in range(x.size):
            out.flat[i] = factor * x.flat[i]

    op = jaxbind.get_linear_call(scale, scale, same_as_first, None, name="tests.unchanged_kernel")
    report = check(op, random((4,), seed=6), factor=2.0, verbose=False)
    rows = {r.target for r in report if r.check == "inputs unchanged"}
    assert rows == {"the function: input 0", "the transpose: input 0"}

    def f(out, args, kd):
        out[0][...] = np.sin(args[0])

    @jaxbind.jax_function
    def jvp(x, t):
        return [jnp.cos(x) * t]

    @jaxbind.jax_function
    def vjp(x, ct):
        return [jnp.cos(x) * ct]

    op = jaxbind.get_nonlinear_call(f, (jvp, vjp), same_as_first, name="tests.unchanged_jaxfn")
    report = check(op, random((4,), seed=7), verbose=False)
    rows = {r.target for r in report if r.check == "inputs unchanged"}
    assert rows == {f"the {r}: input {k}" for r in ("function", "JVP", "VJP") for k in (0, 1)} - {
        "the function: input 1"
    }


# --- linearity -------------------------------------------------------------------------------


def _plus_one(out, args, kd):
    out[0][...] = args[0] + 1.0


def _cube_root_of_sum_of_cubes(out, args, kd):
    x = args[0]
    out[0][...] = np.cbrt(x**3 + np.roll(x, 1) ** 3)  # homogeneous, not additive


def _abs(out, args, kd):
    out[0][...] = np.abs(args[0])


@pytest.mark.parametrize(
    "f, row, why",
    [
        (_plus_one, "linearity: f(0) = 0", "affine or nonlinear"),
        (_abs, "linearity: f(a x) = a f(x)", "not homogeneous"),
        (_cube_root_of_sum_of_cubes, "linearity: f(x + y) = f(x) + f(y)", "not additive"),
    ],
)
def test_linearity_row_names_the_cause(enable_x64, f, row, why):
    op = jaxbind.get_linear_call(
        f, copy_last, same_as_first, None, name=f"tests.not_linear{f.__name__}"
    )
    text = _failure(op, random((5,), seed=8))
    assert _row(text, row, "argument 0, float64]")
    assert why in text


def test_linearity_of_a_multilinear_op_is_per_argument(enable_x64):
    def add(out, args, kd):  # jointly linear, but not linear in each argument alone
        out[0][...] = args[0] + args[1]

    op = jaxbind.get_linear_call(
        add, (copy_last, copy_last), same_as_first, name="tests.sum_as_bilinear"
    )
    text = _failure(op, random((3,), seed=9), random((3,), seed=10))
    assert _row(text, "linearity: f(0) = 0", "argument 0")
    assert _row(text, "linearity: f(0) = 0", "argument 1")


def test_linearity_rows_pass_for_linear_ops(enable_x64):
    report = check(bilinear, random((4,), seed=11), random((4,), seed=12), verbose=False)
    rows = {(r.check, r.target) for r in report if r.check.startswith("linearity")}
    assert len(rows) == 6  # three rows per argument
    report = check(nonlinear, random((4,), seed=13), random((4,), seed=14), verbose=False)
    assert not any(r.check.startswith("linearity") for r in report)
