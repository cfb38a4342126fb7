"""jaxbind.testing.check checks every role, batching rule and option on its own.

Each test here is a wrong op that an earlier check passed (issue 46), made through both
APIs (JAXbind 1.3's get_*_call and the pytree-API decorators) and, where it matters,
with real and complex dtypes: a lone VJP off by 2, transposes and callables that batch
wrongly, a false linear_in, second derivatives wrong for complex arguments, a C kernel
that writes its array keyword argument, roles check could not run, and a tolerance
that was also the finite-difference step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random
from support.clib import c_kernel, compile_c_library
from support.ops import copy_last, same_as_first, same_as_last

import jaxbind
from jaxbind.testing import check

REAL_AND_COMPLEX = [np.float64, np.complex128]


def _failures(text: str) -> str:
    """The list of failed rows of check's AssertionError (the table follows it)."""
    return text.split("\n\n")[0]


def _failed(info, check_name: str, target: str = "") -> bool:
    return f"- {check_name} [{target}" in _failures(str(info.value))


def _native_shape(*args, **kwargs):
    return jax.ShapeDtypeStruct(args[-1].shape, args[-1].dtype)


# --- 1. a lone derivative role, checked on its own ---------------------------------------


def _square(out, args, kd):
    out[0][...] = args[0] ** 2


def _square_vjp_twice(out, args, kd):
    x, ct = args
    out[0][...] = 4 * x * ct  # 2x too large


def _square_jvp_twice(out, args, kd):
    x, t = args
    out[0][...] = 4 * x * t


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_a_lone_vjp_off_by_two_fails_against_finite_differences(enable_x64, dtype):
    op = jaxbind.get_nonlinear_call(
        _square, (None, _square_vjp_twice), same_as_first, name="tests.lone_vjp"
    )
    with pytest.raises(AssertionError) as info:
        check(op, random((4,), dtype, 1), verbose=False)
    assert _failed(info, "vjp vs finite differences", f"argument 0, {np.dtype(dtype).name}]")


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_a_lone_native_vjp_off_by_two_fails_against_finite_differences(enable_x64, dtype):
    @jaxbind.nonlinear_op(shape=_native_shape, name="tests.native_lone_vjp")
    def cube(x):
        return x**3

    @cube.def_vjp
    def _(primals, ct):
        return (6 * primals[0] ** 2 * ct,)  # 2x too large

    with pytest.raises(AssertionError) as info:
        check(cube, random((3,), dtype, 2), verbose=False)
    assert _failed(info, "vjp vs finite differences", "argument 0")
    # nothing compared the forward mode: that is said, not passed
    report = _report_of(info)
    assert "jvp vs finite differences" in _not_checked(report)


def test_a_lone_jvp_off_by_two_fails_against_finite_differences(enable_x64):
    op = jaxbind.get_nonlinear_call(
        _square, (_square_jvp_twice, None), same_as_first, name="tests.lone_jvp"
    )
    with pytest.raises(AssertionError) as info:
        check(op, random((4,), np.complex128, 3), verbose=False)
    assert _failed(info, "jvp vs finite differences", "argument 0 -> output 0, complex128]")


# --- 2. and 3. batching rules of every role, at every axis ------------------------------


def _core_axis(ndim, axes):
    return next(a for a in range(ndim) if a not in axes)


def _batch_axes(kd):
    ba = jaxbind.load_kwargs(kd)["batch_axes"]
    return ba[0] if ba else ()


def _cumsum(out, args, kd):
    """cumsum along the core axis, wherever the batch axes are; outputs laid out as the input."""
    x = args[0]
    out[0][...] = np.cumsum(x, axis=_core_axis(x.ndim, _batch_axes(kd)))


def _cumsum_T(out, args, kd):
    ct = args[0]
    axis = _core_axis(ct.ndim, _batch_axes(kd))
    out[0][...] = np.flip(np.cumsum(np.flip(ct, axis), axis), axis)


def _cumsum_T_ignores_batch_axes(out, args, kd):
    ct = args[0]  # right for one unbatched vector only
    out[0][...] = np.flip(np.cumsum(np.flip(ct, 0), 0), 0)


def _cumsum_assumes_leading_batch_axis(out, args, kd):
    x = args[0]
    out[0][...] = np.cumsum(x, axis=1 if _batch_axes(kd) else 0)


def _same_layout(x, batch_axes=None, **kwargs):
    return ((x.shape, x.dtype, batch_axes[0][0] if batch_axes else None),)


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_a_transpose_that_ignores_batch_axes_fails_vmap_of_grad(enable_x64, dtype):
    op = jaxbind.get_linear_call(
        _cumsum,
        _cumsum_T_ignores_batch_axes,
        _same_layout,
        _same_layout,
        func_can_batch=True,
        name="tests.T_ignores_batch_axes",
    )
    x = random((4,), dtype, 4)
    if dtype == np.float64:  # what the issue saw: vmap(grad) disagrees with a loop of grad
        u = random((3, 4), seed=5)
        g = jax.vmap(lambda u: jax.grad(lambda x: jnp.sum(u * op(x)[0]))(x))(u)
        loop = [jax.grad(lambda x: jnp.sum(ub * op(x)[0]))(x) for ub in u]
        assert not np.allclose(g, loop)
    with pytest.raises(AssertionError) as info:
        check(op, x, verbose=False)
    assert _failed(info, "vmap(grad) vs loop", "the transpose: cotangent of output 0 at axis 0")
    assert _failed(info, "grad(vmap) vs loop", "the transpose")
    assert not _failed(info, "vmap vs loop", "the function")  # f batches right


def test_a_native_transpose_that_ignores_batch_axes_fails_vmap_of_grad(enable_x64):
    @jaxbind.linear_op(shape=_native_shape, vectorized=True, name="tests.native_T_ignores")
    def cumsum(x):
        return np.cumsum(x, axis=-1)  # batch axes arrive in front

    @cumsum.def_transpose
    def _(ct):
        return np.flip(np.cumsum(np.flip(ct, 0), 0), 0)  # axis 0: the batch axis when batched

    with pytest.raises(AssertionError) as info:
        check(cumsum, random((4,), np.complex128, 6), verbose=False)
    assert _failed(info, "vmap(grad) vs loop", "the transpose")
    assert _failed(info, "grad(vmap) vs loop", "the transpose")


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_a_callable_that_assumes_a_leading_batch_axis_fails_other_in_axes(enable_x64, dtype):
    op = jaxbind.get_linear_call(
        _cumsum_assumes_leading_batch_axis,
        _cumsum_T,
        _same_layout,
        _same_layout,
        func_can_batch=True,
        name="tests.assumes_leading_batch_axis",
    )
    with pytest.raises(AssertionError) as info:
        check(op, random((4,), dtype, 7), verbose=False)
    assert _failed(info, "vmap vs loop", "the function: argument 0 at axis 1")
    assert not _failed(info, "vmap vs loop", "the function: argument 0 at axis 0")


def _sum2(out, args, kd):
    """cumsum(x + 2 y) for func_can_batch, assuming batched inputs have their batch axis first."""
    x, y = args
    out[0][...] = np.cumsum(x + 2 * y, axis=-1)


def _sum2_T(out, args, kd):
    (ct,) = args
    c = np.flip(np.cumsum(np.flip(ct, -1), -1), -1)
    out[0][...] = c
    out[1][...] = 2 * c


def _sum2_abstract(x, y, batch_axes=None, **kwargs):
    return ((x.shape, x.dtype, 0 if batch_axes else None),)


def _sum2_abstract_T(ct, batch_axes=None, **kwargs):
    return ((ct.shape, ct.dtype, 0 if batch_axes else None),) * 2


def test_a_two_input_callable_that_assumes_leading_batch_axes_fails(enable_x64):
    op = jaxbind.get_linear_call(
        _sum2,
        _sum2_T,
        _sum2_abstract,
        _sum2_abstract_T,
        func_can_batch=True,
        name="tests.sum2_assumes_leading",
    )
    x, y = random((4,), np.complex128, 8), random((4,), np.complex128, 9)
    with pytest.raises(AssertionError) as info:
        check(op, x, y, verbose=False)
    assert _failed(info, "vmap vs loop", "the function: all inputs at axes (1, 1)")


# --- 4. linear_in ----------------------------------------------------------------------


def _x_y2(out, args, kd):
    x, y = args
    out[0][...] = x * y**2  # linear in x, not in y


def _x_y2_jvp(out, args, kd):
    x, y, dx, dy = args
    out[0][...] = dx * y**2 + 2 * x * y * dy


def _x_y2_vjp(out, args, kd):
    x, y, ct = args
    out[0][...] = y**2 * ct
    out[1][...] = 2 * x * y * ct


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_a_false_linear_in_fails_linearity_and_transpose_rows(enable_x64, dtype):
    op = jaxbind.get_nonlinear_call(
        _x_y2,
        (_x_y2_jvp, _x_y2_vjp),
        same_as_first,
        linear_in=(1,),
        name="tests.false_linear_in",
    )
    x, y = random((3,), dtype, 10), random((3,), dtype, 11)
    (t,) = jax.linear_transpose(lambda y: op(x, y)[0], y)(x)
    assert not np.any(t)  # what the issue saw: zeros
    with pytest.raises(AssertionError) as info:
        check(op, x, y, verbose=False)
    name = np.dtype(dtype).name
    assert _failed(info, "linearity: f(a x) = a f(x)", f"argument 1, {name}]")
    assert _failed(info, "transpose adjointness", f"argument 1, {name}]")
    assert not _failed(info, "jvp vs finite differences")  # the derivatives are right


def test_a_false_native_linear_in_fails_linearity_and_transpose_rows(enable_x64):
    @jaxbind.nonlinear_op(shape=_native_shape, linear_in=(0,), name="tests.native_false_lin")
    def square(x):
        return x**2

    square.def_jvp(lambda p, t: 2 * p[0] * t[0])
    square.def_vjp(lambda p, ct: (2 * p[0] * ct,))
    with pytest.raises(AssertionError) as info:
        check(square, random((3,), np.complex128, 12), verbose=False)
    assert _failed(info, "linearity: f(a x) = a f(x)", "argument 0")
    assert _failed(info, "transpose adjointness", "argument 0")


def test_a_true_linear_in_passes(enable_x64):
    op = jaxbind.get_nonlinear_call(
        _x_y2, (_x_y2_jvp, _x_y2_vjp), same_as_first, linear_in=(0,), name="tests.linear_in_ok"
    )
    report = check(op, random((3,), seed=13), random((3,), seed=14), verbose=False)
    rows = {(r.check, r.target) for r in report if r.ok}
    assert ("transpose adjointness", "argument 0") in rows
    assert ("linearity: f(x + y) = f(x) + f(y)", "argument 0") in rows


# --- 5. second order, for complex arguments as for real ones -----------------------------


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_a_vjp_wrong_through_stop_gradient_fails_second_order(enable_x64, dtype):
    jvp = jaxbind.jax_function(lambda x, t: [3 * x**2 * t])
    vjp = jaxbind.jax_function(lambda x, ct: [3 * jax.lax.stop_gradient(x) ** 2 * ct])
    op = jaxbind.get_nonlinear_call(
        lambda out, args, kd: out[0].__setitem__(..., args[0] ** 3),
        (jvp, vjp),
        same_as_first,
        name="tests.cube_stop_gradient_vjp",
    )
    with pytest.raises(AssertionError) as info:
        check(op, random((3,), dtype, 15), verbose=False)
    assert _failed(info, "hessian-vector product vs finite differences", "arguments 0")
    assert not _failed(info, "vjp vs finite differences")  # first order is right


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_a_native_jvp_wrong_through_stop_gradient_fails_second_order(enable_x64, dtype):
    @jaxbind.nonlinear_op(shape=_native_shape, name="tests.native_cube_stop_gradient_jvp")
    def cube(x):
        return x**3

    cube.def_jvp(jaxbind.jax_function(lambda p, t: 3 * jax.lax.stop_gradient(p[0]) ** 2 * t[0]))
    cube.def_vjp(jaxbind.jax_function(lambda p, ct: (3 * p[0] ** 2 * ct,)))
    with pytest.raises(AssertionError) as info:
        check(cube, random((3,), dtype, 16), verbose=False)
    assert _failed(info, "second-order jvp vs finite differences", "arguments 0")
    assert not _failed(info, "hessian-vector product vs finite differences")


@pytest.mark.parametrize("dtype", REAL_AND_COMPLEX)
def test_right_second_derivatives_pass_for_real_and_complex_arguments(enable_x64, dtype):
    @jaxbind.nonlinear_op(shape=_native_shape, name="tests.native_cube_ok")
    def cube(x):
        return x**3

    cube.def_jvp(jaxbind.jax_function(lambda p, t: 3 * p[0] ** 2 * t[0]))
    cube.def_vjp(jaxbind.jax_function(lambda p, ct: (3 * p[0] ** 2 * ct,)))
    report = check(cube, random((3,), dtype, 17), verbose=False)
    ran = {r.check for r in report if r.ok}
    assert {
        "hessian symmetry",
        "hessian-vector product vs finite differences",
        "second-order jvp vs finite differences",
    } <= ran


# --- 6. a C kernel's array keyword argument, checked with the kernel's own bytes ---------

_BUMP_SOURCE = r"""
#include <string.h>
#include "jaxbind/kernel.h"
/* out = w[0] * x (float64), then w[0] += 1: writes its array keyword argument */
int32_t scale_and_bump(const jaxbind_call *call) {
  const double *x = (const double *)call->inputs[call->n_inputs - 1].data;
  double *y = (double *)call->outputs[0].data;
  double *w = 0;
  for (int64_t k = 0; k < call->n_kwargs; ++k)
    if (strcmp(call->kwargs[k].name, "w") == 0) w = (double *)call->kwargs[k].array.data;
  if (!w) return 1;
  int64_t n = 1;
  for (int64_t d = 0; d < call->outputs[0].rank; ++d) n *= call->outputs[0].dims[d];
  for (int64_t i = 0; i < n; ++i) y[i] = w[0] * x[i];
  w[0] += 1;
  return 0;
}
"""


@pytest.fixture(scope="module")
def bump_lib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "bump", _BUMP_SOURCE)


@pytest.mark.parametrize("how", ["ctypes", "cffi"])
@pytest.mark.parametrize("role", ["f", "T"])
def test_a_c_kernel_that_writes_its_array_keyword_argument_fails(enable_x64, bump_lib, how, role):
    k = c_kernel(bump_lib, how, "scale_and_bump")
    f, t = (k, copy_last) if role == "f" else (copy_last, k)
    op = jaxbind.get_linear_call(f, t, same_as_last, None, name=f"tests.bump_{how}_{role}")
    with pytest.raises(AssertionError) as info:
        check(op, random((4,), seed=18), w=np.array([2.0]), verbose=False)
    what = "the function" if role == "f" else "the transpose"
    assert _failed(info, "inputs unchanged", f"{what}: keyword argument 'w'")


# --- 7. what check could not check is a row that says so ---------------------------------


def _report_of(info) -> str:
    return str(info.value).split("\n\n", 1)[1]


def _not_checked(table: str) -> set:
    return {line.split("  ")[0] for line in table.splitlines() if "not checked" in line}


def _statuses(report) -> dict:
    found: dict = {}
    for r in report:
        found.setdefault(r.check, set()).add(r.status)
    return found


def _double(out, args, kd):
    out[0][...] = 2 * args[0]


def test_a_linear_op_without_transpose_reports_the_transpose_not_checked(enable_x64):
    op = jaxbind.get_linear_call(_double, None, same_as_first, name="tests.no_transpose")
    report = check(op, random((3,), seed=19), verbose=False)
    status = _statuses(report)
    for row in ("transpose adjointness", "vjp vs jvp (dot product)", "vmap(grad) vs loop"):
        assert status[row] == {"not checked"}, row
    why = [r.detail for r in report if r.check == "transpose adjointness"]
    assert all("no transpose" in d for d in why)
    assert any(r.status == "not checked" and "the transpose" in r.target for r in report)
    assert "not checked" in str(report)
    assert report.not_checked() and not report.failures()


def test_a_native_linear_op_without_transpose_reports_the_transpose_not_checked(enable_x64):
    @jaxbind.linear_op(shape=_native_shape, name="tests.native_no_transpose")
    def double(x):
        return 2 * x

    report = check(double, random((3,), np.complex128, 20), verbose=False)
    assert _statuses(report)["transpose adjointness"] == {"not checked"}


def test_a_multilinear_op_with_a_missing_transpose_reports_it_not_checked(enable_x64):
    def mul(out, args, kd):
        out[0][...] = args[0] * args[1]

    def mul_T0(out, args, kd):
        y, ct = args
        out[0][...] = ct * y

    op = jaxbind.get_linear_call(mul, (mul_T0, None), same_as_last, name="tests.half_bilinear")
    report = check(op, random((3,), seed=21), random((3,), seed=22), verbose=False)
    adjoint = {r.target: r.status for r in report if r.check == "transpose adjointness"}
    assert adjoint == {"argument 0": "ok", "argument 1": "not checked"}


def test_a_nonlinear_op_without_vjp_reports_reverse_mode_not_checked(enable_x64):
    def jvp(out, args, kd):
        x, t = args
        out[0][...] = 2 * x * t

    op = jaxbind.get_nonlinear_call(_square, (jvp, None), same_as_first, name="tests.no_vjp")
    report = check(op, random((3,), seed=23), verbose=False)
    status = _statuses(report)
    assert status["jvp vs finite differences"] == {"ok"}
    assert status["vjp vs finite differences"] == {"not checked"}


# --- 8. the finite-difference step is not the tolerance ----------------------------------


def _wiggle(out, args, kd):
    out[0][...] = np.sin(40 * args[0])


def _wiggle_jvp(out, args, kd):
    x, t = args
    out[0][...] = 40 * np.cos(40 * x) * t


def _wiggle_vjp(out, args, kd):
    x, ct = args
    out[0][...] = 40 * np.cos(40 * x) * ct


def test_a_loose_rtol_keeps_a_small_finite_difference_step(enable_x64):
    op = jaxbind.get_nonlinear_call(
        _wiggle, (_wiggle_jvp, _wiggle_vjp), same_as_first, name="tests.wiggle"
    )
    x = random((4,), seed=24)
    report = check(op, x, rtol=0.05, verbose=False)  # a step of 0.05 would fail
    fd = [r for r in report if r.check == "jvp vs finite differences"]
    assert fd and all(r.ok for r in fd)
    steps = [float(r.detail.removeprefix("step ")) for r in fd]
    assert all(0 < h < 1e-5 for h in steps)  # double precision: 1e-6 times the inputs' scale
    # eps sets the step, and nothing else
    with pytest.raises(AssertionError) as info:
        check(op, x, fd_step=0.05, verbose=False)
    assert _failed(info, "jvp vs finite differences")
    assert not _failed(info, "vjp vs jvp (dot product)")


def test_a_loose_rtol_keeps_a_small_step_for_native_ops(enable_x64):
    @jaxbind.nonlinear_op(shape=_native_shape, name="tests.native_wiggle")
    def wiggle(x):
        return np.sin(40 * x)

    wiggle.def_jvp(lambda p, t: 40 * np.cos(40 * p[0]) * t[0])
    wiggle.def_vjp(lambda p, ct: (40 * np.cos(40 * p[0]) * ct,))
    check(wiggle, random((4,), np.complex128, 25), rtol=0.05, verbose=False)


# --- options: aliases, effects --------------------------------------------------------------


def _triple_every_other(out, args, kd):  # in place: out holds the input
    out[0][::2] *= 3


def _triple_every_other_T(out, args, kd):
    out[0][...] = args[0]
    out[0][::2] *= 3


def test_an_in_place_op_passes_and_its_written_row_is_not_checked(enable_x64):
    """An earlier check filled an aliased output with sentinels, so an in-place op failed."""
    op = jaxbind.get_linear_call(
        _triple_every_other,
        _triple_every_other_T,
        same_as_first,
        same_as_first,
        input_output_aliases={0: 0},
        name="tests.in_place",
    )
    report = check(op, random((6,), seed=26), verbose=False)
    status = _statuses(report)
    assert status["abstract vs callable: written"] == {"not checked"}
    assert status["eager vs callable"] == status["in place: donated vs not donated"] == {"ok"}


def test_a_side_effect_is_reported_not_checked(enable_x64):
    op = jaxbind.get_linear_call(
        _double, _double, same_as_first, has_side_effect=True, name="tests.effectful"
    )
    report = check(op, random((3,), seed=27), verbose=False)
    assert _statuses(report)["side effects"] == {"not checked"}
