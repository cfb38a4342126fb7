"""jaxbind.testing.check compares an op with its JAX reference: the forward, every declared
rule (JVP, VJP, transposes, batching) against JAX's derivative of the reference, a
"derived" row for each rule the reference computes, and "not checked" for an op without
one. Each kind of row passes a sound op and fails a broken one, naming the op."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.arrays import random
from support.dtypes import global_x64
from support.ops import same_as_first

import jaxbind
from jaxbind.testing import check

# --- a 2-D FFT, right and with the input transposed (the convention mismatch) ---------------


def _fft2(out, args, kd):
    out[0][...] = np.fft.fft2(args[0])


def _fft2_of_transposed(out, args, kd):
    out[0][...] = np.fft.fft2(args[0].T)


def _fft2_of_transposed_T(out, args, kd):  # right for its own f: first order passes
    out[0][...] = np.fft.fft2(args[0]).T


def _fft2_ref(x):
    return jnp.fft.fft2(x)


def _fft2_op(name, f=_fft2, f_T=_fft2):  # the DFT matrix is symmetric: fft2 is its own T
    return jaxbind.get_linear_call(
        f, f_T, same_as_first, same_as_first, name=name, reference=_fft2_ref
    )


def _failed_rows(info) -> list[str]:
    """The failed rows of a check's AssertionError, one line each."""
    return [line for line in str(info.value).split("\n\n")[0].splitlines() if line.startswith("- ")]


def _error(line: str) -> float:
    return float(re.search(r"error (\S+) >", line).group(1))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_forward_transpose_and_vmap_rows_pass_a_sound_linear_op(enable_x64, dtype):
    report = check(_fft2_op("tests.ref_rows.fft2"), random((4, 4), dtype, 1), verbose=False)
    rows = {r.check: r for r in report if r.check.startswith("native vs reference")}
    assert set(rows) == {
        "native vs reference: forward",
        "native vs reference: transpose",
        "native vs reference: vmap",
    }
    assert all(r.ok and r.dtype == np.dtype(dtype).name for r in rows.values())
    assert not report.derived() and not report.not_checked()


def test_a_2d_body_that_reads_its_input_transposed_fails_the_forward_row(enable_x64):
    op = _fft2_op("tests.ref_rows.fft2_transposed", _fft2_of_transposed, _fft2_of_transposed_T)
    with pytest.raises(AssertionError) as info:
        check(op, random((4, 4), np.complex128, 2), verbose=False)
    failed = _failed_rows(info)
    forward = [line for line in failed if line.startswith("- native vs reference: forward")]
    assert len(forward) == 1 and "[output 0, complex128]" in forward[0]
    assert "'tests.ref_rows.fft2_transposed' differs from its reference in output 0" in forward[0]
    assert _error(forward[0]) > 0.1
    # self-consistent: nothing but the comparison with the reference sees it
    assert all(line.startswith("- native vs reference") for line in failed)


def test_a_transposed_native_op_fails_the_forward_row():
    @jaxbind.linear_op(shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.rr.nT")
    def fft2(x):
        return np.fft.fft2(x.T)

    fft2.def_transpose(lambda ct: np.fft.fft2(ct).T)
    fft2.def_reference(lambda x: jnp.fft.fft2(x))
    with pytest.raises(AssertionError) as info:
        check(fft2, random((4, 4), np.complex64, 3), verbose=False)
    (forward,) = [r for r in _failed_rows(info) if "forward" in r]
    assert "[output 0, complex64]" in forward and "'tests.rr.nT' differs" in forward


# --- a nonlinear op: y = sin(x) * a**2, with JVP and VJP, right and wrong ------------------


def _sinsq(out, args, kd):
    x, a = args
    out[0][...] = np.sin(x) * a**2


def _sinsq_jvp(out, args, kd):
    x, a, dx, da = args
    out[0][...] = np.cos(x) * a**2 * dx + 2 * np.sin(x) * a * da


def _sinsq_vjp(out, args, kd):
    x, a, ct = args
    out[0][...] = np.cos(x) * a**2 * ct
    out[1][...] = 2 * np.sin(x) * a * ct


def _sinsq_jvp_twice(out, args, kd):
    _sinsq_jvp(out, args, kd)
    out[0][...] *= 2


def _sinsq_vjp_twice(out, args, kd):
    _sinsq_vjp(out, args, kd)
    out[0][...] *= 2
    out[1][...] *= 2


def _sinsq_ref(x, a):
    return jnp.sin(x) * a**2


def _sinsq_abstract_T(x, a, ct, **kw):
    return ((x.shape, x.dtype), (a.shape, a.dtype))


def _sinsq_op(name, jvp=_sinsq_jvp, vjp=_sinsq_vjp, **options):
    return jaxbind.get_nonlinear_call(
        _sinsq, (jvp, vjp), same_as_first, _sinsq_abstract_T, name=name, **options
    )


def _xa(dtype=np.float64):
    return random((5,), dtype, 4), random((5,), dtype, 5)


def test_jvp_vjp_and_vmap_rows_pass_a_sound_nonlinear_op(enable_x64):
    op = _sinsq_op("tests.ref_rows.sinsq", reference=_sinsq_ref)
    report = check(op, *_xa(), verbose=False)
    checks = {r.check for r in report if r.check.startswith("native vs reference")}
    assert checks == {
        "native vs reference: forward",
        "native vs reference: jvp",
        "native vs reference: vjp",
        "native vs reference: vmap",
    }
    jvp = [r.target for r in report if r.check == "native vs reference: jvp"]
    assert jvp == ["argument 0 -> tangent of output 0", "argument 1 -> tangent of output 0"]
    vmap = [r.target for r in report if r.check == "native vs reference: vmap"]
    assert "the VJP in argument 1: batched at axis 0 -> cotangent of argument 1" in vmap


def test_a_vjp_wrong_by_a_factor_2_fails_against_the_reference(enable_x64):
    op = _sinsq_op("tests.ref_rows.vjp_twice", vjp=_sinsq_vjp_twice, reference=_sinsq_ref)
    with pytest.raises(AssertionError) as info:
        check(op, *_xa(), verbose=False)
    failed = _failed_rows(info)
    vjp = [line for line in failed if line.startswith("- native vs reference: vjp")]
    assert [line.split(" [")[1].split(",")[0] for line in vjp] == [
        "argument 0 -> cotangent of argument 0",
        "argument 1 -> cotangent of argument 1",
    ]
    assert all("'tests.ref_rows.vjp_twice' differs from its reference" in line for line in vjp)
    assert all(_error(line) == pytest.approx(0.5, rel=1e-6) for line in vjp)  # |2g - g| / |2g|
    assert any(line.startswith("- native vs reference: vmap [the VJP") for line in failed)
    assert not any("native vs reference: jvp" in line for line in failed)


def test_a_jvp_wrong_by_a_factor_2_fails_against_the_reference_in_the_native_api():
    @jaxbind.nonlinear_op(shape=lambda x, a: x, name="tests.rr.jvp_twice")
    def sinsq(x, a):
        return np.sin(x) * a**2

    @sinsq.def_jvp
    def _(primals, tangents):
        (x, a), (dx, da) = primals, tangents
        return 2 * (np.cos(x) * a**2 * dx + 2 * np.sin(x) * a * da)

    @sinsq.def_vjp
    def _(primals, ct):
        x, a = primals
        return np.cos(x) * a**2 * ct, 2 * np.sin(x) * a * ct

    sinsq.def_reference(_sinsq_ref)
    with pytest.raises(AssertionError) as info:
        check(sinsq, *_xa(np.float32), verbose=False)
    jvp = [line for line in _failed_rows(info) if line.startswith("- native vs reference: jvp")]
    assert len(jvp) == 2 and all("float32]" in line for line in jvp)  # x64 off: float32
    assert all("'tests.rr.jvp_twice' differs from its reference" in line for line in jvp)


# --- linear ops: a transpose wrong by a factor 2; a batching rule that flips the batch -------


def _mv(out, args, kd):
    a, x = args
    out[0][...] = a @ x


def _mv_T_twice(out, args, kd):
    a, ct = args
    out[0][...] = 2 * a.T @ ct


def _mv_abstract(a, x, **kw):
    return (((a.shape[0],), x.dtype),)


def _mv_abstract_T(a, ct, **kw):
    return (((a.shape[1],), ct.dtype),)


def test_a_transpose_wrong_by_a_factor_2_fails_against_the_reference(enable_x64):
    op = jaxbind.get_linear_call(
        _mv,
        _mv_T_twice,
        _mv_abstract,
        _mv_abstract_T,
        first_n_args_fixed=1,
        name="tests.ref_rows.mv_T_twice",
        reference=lambda a, x: a @ x,
    )
    with pytest.raises(AssertionError) as info:
        check(op, random((4, 3), seed=6), random((3,), seed=7), verbose=False)
    (transpose,) = [r for r in _failed_rows(info) if r.startswith("- native vs reference: tr")]
    assert "[argument 1 -> cotangent of argument 1, float64]" in transpose
    assert "'tests.ref_rows.mv_T_twice' differs from its reference" in transpose
    assert _error(transpose) == pytest.approx(0.5, rel=1e-9)


def _flip_everything(out, args, kd):  # batched, it flips the batch axis too
    out[0][...] = np.flip(args[0])


def _flip_abstract(x, batch_axes=None, **kw):
    return ((x.shape, x.dtype, batch_axes[0][-1] if batch_axes else None),)


def test_a_batching_rule_that_flips_the_batch_fails_the_vmap_row(enable_x64):
    op = jaxbind.get_linear_call(
        _flip_everything,
        _flip_everything,
        _flip_abstract,
        _flip_abstract,
        func_can_batch=True,
        name="tests.ref_rows.flips_the_batch",
        reference=lambda x: jnp.flip(x),
    )
    with pytest.raises(AssertionError) as info:
        check(op, random((3, 4), seed=8), verbose=False)
    vmap = [r for r in _failed_rows(info) if r.startswith("- native vs reference: vmap")]
    assert any("[the function: batched at axis 0 -> output 0, float64]" in r for r in vmap)
    assert all("'tests.ref_rows.flips_the_batch' differs" in r for r in vmap)
    assert not any("forward" in r for r in _failed_rows(info))  # unbatched, it is right


# --- derived rules: reported as such, and the other families run against them -------------


def test_derived_rules_are_reported_and_pass_the_other_families(enable_x64):
    # a nonlinear op with f only: its JVP and VJP are JAX's, of the reference
    op = jaxbind.get_nonlinear_call(
        _sinsq, (None, None), same_as_first, name="tests.ref_rows.f_only", reference=_sinsq_ref
    )
    report = check(op, *_xa(), verbose=False)
    derived = {r.target: r.detail for r in report.derived()}
    assert derived == {
        "the JVP": "no body declared: jax.jvp of the reference",
        "the VJP": "no body declared: jax.vjp of the reference",
    }
    assert all(r.status == "derived" and not r.ok for r in report.derived())
    ran = {r.check for r in report if r.ok}
    assert {
        "jvp vs finite differences",
        "vjp vs finite differences",
        "hessian-vector product vs finite differences",
        "second-order jvp vs finite differences",
        "vmap(grad) vs loop",
        "native vs reference: forward",
    } <= ran
    # derived rules are the reference's own: no comparison of them with it
    assert not {"native vs reference: jvp", "native vs reference: vjp"} & {r.check for r in report}


def test_a_linear_op_without_a_transpose_gets_it_from_the_reference(enable_x64):
    op = jaxbind.get_linear_call(
        _mv,
        None,
        _mv_abstract,
        None,
        first_n_args_fixed=1,
        name="tests.ref_rows.mv_no_T",
        reference=lambda a, x: a @ x,
    )
    report = check(op, random((4, 3), seed=9), random((3,), seed=10), verbose=False)
    assert [(r.target, r.status) for r in report.derived()] == [("the transpose", "derived")]
    adjoint = [r for r in report if r.check == "transpose adjointness"]
    assert adjoint and all(r.ok for r in adjoint)
    assert not report.not_checked()


def test_a_multilinear_op_compares_the_given_transpose_and_derives_the_other(enable_x64):
    @jaxbind.multilinear_op(shape=lambda x, y: x, name="tests.rr.mul")
    def mul(x, y):
        return x * y

    mul.def_transpose(lambda y, ct: ct * y, argnum=0)
    mul.def_reference(lambda x, y: x * y)
    report = check(mul, random((5,), seed=11), random((5,), seed=12), verbose=False)
    assert [r.target for r in report.derived()] == ["the transpose with respect to argument 1"]
    transpose = [r for r in report if r.check == "native vs reference: transpose"]
    assert [r.target for r in transpose] == ["argument 0 -> cotangent of argument 0"]
    assert transpose[0].ok


# --- no reference; prefer_reference ------------------------------------------------------


def test_an_op_without_a_reference_has_one_not_checked_row():
    op = _sinsq_op("tests.ref_rows.no_reference")
    report = check(op, *_xa(np.float32), verbose=False)
    rows = [r for r in report if r.check.startswith("native vs reference")]
    assert [(r.check, r.status, r.detail) for r in rows] == [
        (
            "native vs reference",
            "not checked",
            "the op has no reference (reference= to get_linear_call / get_nonlinear_call)",
        )
    ]
    assert rows[0] in report.not_checked()


def test_an_op_without_a_reference_shows_the_not_checked_row_in_the_native_api():
    @jaxbind.linear_op(shape=lambda x: x, name="tests.rr.no_reference")
    def twice(x):
        return 2 * x

    twice.def_transpose(lambda ct: 2 * ct)
    report = check(twice, random((3,), np.float32, 13), verbose=False)
    (row,) = [r for r in report if r.check.startswith("native vs reference")]
    assert row.status == "not checked" and "no reference" in row.detail
    assert "@op.def_reference" in row.detail  # in the words of the API that made it


def test_prefer_reference_here_compares_the_forward_and_names_why_the_rules_are_not():
    op = _sinsq_op("tests.ref_rows.prefers", reference=_sinsq_ref, prefer_reference=("cpu",))
    report = check(op, *_xa(np.float32), verbose=False)
    forward = [r for r in report if r.check == "native vs reference: forward"]
    assert forward and all(r.ok for r in forward)
    rules = [r for r in report if r.check.startswith("native vs reference: ") and r not in forward]
    assert rules and all(r.status == "not checked" for r in rules)
    assert all("prefer_reference=('cpu',)" in r.detail for r in rules)


def test_the_tolerance_is_the_computed_dtypes():
    # float64 NumPy inputs compute in float32 while x64 is off: float32's tolerance
    op = _sinsq_op("tests.ref_rows.tolerance", reference=_sinsq_ref)
    for x64, dtype, tol in ((False, "float32", 1e-4), (True, "float64", 1e-10)):
        with global_x64(x64):
            report = check(op, *_xa(np.float64), verbose=False)
        rows = [r for r in report if r.check.startswith("native vs reference: ")]
        assert rows and {(r.dtype, r.tol) for r in rows} == {(dtype, tol)}, x64


def test_a_reference_of_another_shape_or_dtype_fails_the_forward_row(enable_x64):
    for name, reference, words in (
        ("tests.ref_rows.ref_transposed", lambda x: jnp.fft.fft2(x).T, "its reference (4, 3)"),
        ("tests.ref_rows.ref_widened", lambda x: jnp.fft.fft2(x).astype(complex), "complex128"),
    ):
        op = jaxbind.get_linear_call(
            _fft2, _fft2, same_as_first, same_as_first, name=name, reference=reference
        )
        with pytest.raises(AssertionError) as info:
            check(op, random((3, 4), np.complex64, 14), verbose=False)
        (forward,) = [r for r in _failed_rows(info) if r.startswith("- native vs reference: fo")]
        assert f"'{name}'" in forward and words in forward, forward
