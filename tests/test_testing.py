"""jaxbind.testing.check passes correct ops and catches the usual binding bugs."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random
from reference_ops import axpy, bilinear, flip2, flipsum, matvec, nonlinear, power

import jaxbind
from jaxbind.testing import check


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
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
    check(flipsum, random((3, 4), dtype, 10), random((3, 4), dtype, 11), verbose=False)


def test_fixed_arguments_are_not_differentiated(enable_x64):
    report = check(power, np.float64(3.0), np.abs(random((4,), seed=12)) + 1, verbose=False)
    assert not any("argument 0" in r.target for r in report if "jvp" in r.check)


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


def _same(*args, **k):
    return ((args[0].shape, args[0].dtype),)


def test_catches_a_wrong_jvp(enable_x64):
    op = jaxbind.get_nonlinear_call(
        _sq, (_sq_jvp_wrong, _sq_vjp), _same, _same, name="tests.wrong_jvp"
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
        op = jaxbind.get_linear_call(f, None, _same, None, name=f"tests.unwritten_{f.__name__}")
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
    op = jaxbind.get_linear_call(_nondeterministic, None, _same, None, name="tests.nondet")
    with pytest.raises(AssertionError, match=r"determinism \[output 0, float64\]"):
        check(op, random((3,), seed=8), verbose=False)


def test_report_table(enable_x64, capsys):
    check(axpy, random((3,)), random((3,)))
    out = capsys.readouterr().out
    assert "jaxbind.testing.check('reference_ops._axpy')" in out
    assert "transpose adjointness" in out and "ok" in out


def test_rejects_non_ops():
    with pytest.raises(TypeError, match="expects a jaxbind op"):
        check(jnp.sin, np.ones(3))
