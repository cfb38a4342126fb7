"""The opt-in check of unwritten outputs (issue 46): with jaxbind.check_outputs(True), or
JAXBIND_CHECK_OUTPUTS=1, every CPU call fills its outputs before the body runs, and an
element the body left unwritten fails the call, naming the op and the output. Kernels
and Python callables of both APIs, eager, jitted and batched; off by default; silent for
bodies that write everything (NaN included) and for outputs that share an input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_last
from support.processes import run_script

import jaxbind

numba = pytest.importorskip("numba")


@pytest.fixture
def checking():
    previous = jaxbind.check_outputs(True)
    yield
    jaxbind.check_outputs(previous)


def _rebinds(out, x):  # rebinds its parameter: numba cannot tell
    out = 3 * x  # noqa: F841


def _every_other(begin, end, out, x):
    for i in range(begin, end):
        if i % 2 == 0:
            out[i] = x[i]


def _rebinds_13(out, args, kwargs_dump):  # JAXbind 1.3's callable, rebinding `out`
    out = (3 * args[0],)  # noqa: F841


def _first_half_13(out, args, kwargs_dump):
    n = out[0].shape[-1] // 2
    out[0][..., :n] = args[0][..., :n]


def _native_rebinds():
    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.unwritten_native"
    )
    def rebinds(x, *, out):
        out = 3 * x  # noqa: F841

    return lambda x: rebinds(x)


def _ops():
    """name -> (the op as a function of x, how many of 8 elements it leaves unwritten)."""
    made = {
        "a numba kernel": jaxbind.kernel(_rebinds),
        "a kernel over ranges": jaxbind.kernel(_every_other, ranges=lambda out, x: x.shape[0]),
        "a 1.3 callable": _rebinds_13,
        "a 1.3 callable writing half": _first_half_13,
    }
    ops = {}
    for what, body in made.items():
        name = f"tests.unwritten_{what.replace(' ', '_').replace('.', '')}"
        op = jaxbind.get_linear_call(body, None, same_as_last, name=name)
        ops[what] = (lambda x, op=op: op(x)[0], 4 if "half" in what or "ranges" in what else 8)
    ops["a native out= body"] = (_native_rebinds(), 8)
    return ops


_OPS = _ops()


@pytest.mark.parametrize("what", list(_OPS))
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.complex64])
def test_an_output_left_unwritten_fails_the_call_naming_the_op_and_the_output(
    what, dtype, checking
):
    f, left = _OPS[what]
    x = np.arange(1, 9).astype(dtype)
    message = (
        r"jaxbind: 'tests.unwritten_[a-z0-9_]+' \(the function\)(, batched)?: the body left "
        rf"{{n}} of {{size}} elements of output 0 \({np.dtype(dtype).name}\[{{shape}}\]\) "
        r"unwritten, the first at flat index \d+: it must write every element of every output"
    )
    for route, arg, n, shape in (
        (f, x, left, "8"),
        (jax.jit(f), x, left, "8"),
        (jax.jit(jax.vmap(f)), np.stack([x] * 3), 3 * left, "3,8"),
    ):
        expected = message.format(n=n, size=8 * n // left, shape=shape)
        with pytest.raises(Exception, match=expected):
            jax.block_until_ready(route(arg))


def test_the_check_is_off_by_default_and_check_outputs_switches_it(tmp_path):
    script = """
        import sys
        import numpy as np, jaxbind
        print(jaxbind.check_outputs(True), jaxbind.check_outputs(False), end=" ")
        jaxbind.check_outputs(sys.argv[1] == "on")
        op = jaxbind.get_linear_call(
            lambda out, args, kw: None, None, lambda x: ((x.shape, x.dtype),), name="t.none"
        )
        try:
            op(np.ones(3, np.float32))[0].block_until_ready()
            print("ran")
        except Exception as e:
            print("failed:", str(e).splitlines()[0])
    """
    for switch, env, before, after in (
        ("off", {}, "False", "ran"),
        ("on", {}, "False", "failed: INTERNAL: jaxbind: 't.none' (the function): the body left"),
        ("off", {"JAXBIND_CHECK_OUTPUTS": "1"}, "True", "ran"),
        ("off", {"JAXBIND_CHECK_OUTPUTS": "0"}, "False", "ran"),
    ):
        import os

        proc = run_script(tmp_path, script, switch, env={**os.environ, **env}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.startswith(f"{before} True {after}"), (env, switch, proc.stdout)
    with pytest.raises(TypeError, match="takes True or False"):
        jaxbind.check_outputs(1)


def _both(out, args, kwargs_dump):  # output 0 whole, output 1 (int32) not at all
    out[0][...] = args[0]


def test_the_message_names_the_output_left_unwritten(checking):
    op = jaxbind.get_linear_call(
        _both,
        None,
        lambda x: ((x.shape, x.dtype), ((2, 2), jnp.int32)),
        name="tests.unwritten_second",
    )
    with pytest.raises(Exception, match=r"left 4 of 4 elements of output 1 \(int32\[2,2\]\)"):
        jax.block_until_ready(op(np.ones(3, np.float32)))


def _writes_nan(out, args, kwargs_dump):
    with np.errstate(invalid="ignore"):
        out[0][...] = args[0] * 0.0 / 0.0  # NaN computed: not the pattern


@jaxbind.kernel
def _writes_all(out, x):
    for i in range(x.size):
        out.flat[i] = x.flat[i] * np.inf - x.flat[i] * np.inf  # NaN from arithmetic


def test_bodies_that_write_everything_pass_nan_included(checking):
    for i, body in enumerate((_writes_nan, _writes_all)):
        op = jaxbind.get_linear_call(body, None, same_as_last, name=f"tests.unwritten_none_{i}")
        for dtype in (np.float32, np.float64, np.complex128):
            x = np.arange(1, 7).astype(dtype)
            assert np.isnan(jax.jit(lambda x, op=op: op(x)[0])(x)).all()
            assert np.isnan(jax.vmap(lambda x, op=op: op(x)[0])(np.stack([x, x]))).all()


def test_an_output_that_shares_an_input_is_not_checked(checking):
    op = jaxbind.get_linear_call(
        lambda out, args, kw: None,  # in place: leaves the input's values
        None,
        same_as_last,
        input_output_aliases={0: 0},
        name="tests.unwritten_aliased",
    )
    x = jnp.arange(4.0, dtype=jnp.float32)
    np.testing.assert_array_equal(jax.jit(lambda x: op(x)[0], donate_argnums=0)(x + 1), x + 1)


def _half_13(part):
    def body(out, args, kwargs_dump):
        getattr(out[0], part)[...] = getattr(args[0], part)

    return body


def _half_kernel(part):
    if part == "real":

        def body(out, x):
            out.real[:] = x.real

    else:

        def body(out, x):
            out.imag[:] = x.imag

    return jaxbind.kernel(body)


def _half_native(part, name):
    @jaxbind.linear_op(shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name=name)
    def half(x, *, out):
        getattr(out, part)[...] = getattr(x, part)

    return lambda x: half(x)


def _half_written(what, part, name):
    if what == "a native out= body":
        return _half_native(part, name)
    body = _half_13(part) if what == "a 1.3 callable" else _half_kernel(part)
    op = jaxbind.get_linear_call(body, None, same_as_last, name=name)
    return lambda x: op(x)[0]


@pytest.mark.parametrize("what", ["a 1.3 callable", "a numba kernel", "a native out= body"])
@pytest.mark.parametrize("part", ["real", "imag"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_a_complex_output_with_one_part_left_unwritten_fails_the_call_naming_the_op(
    what, part, dtype, checking, enable_x64
):
    name = f"tests.half_{part}_{what.split()[-2]}_{np.dtype(dtype).name}"
    f = _half_written(what, part, name)
    x = (np.arange(1, 9) + 1j * np.arange(2, 10)).astype(dtype)
    message = (
        rf"jaxbind: '{name}' \(the function\): the body left 8 of 8 elements of output 0 "
        rf"\({np.dtype(dtype).name}\[8\]\) unwritten, the first at flat index 0"
    )
    for route in (f, jax.jit(f)):
        with pytest.raises(Exception, match=message):
            jax.block_until_ready(route(x))


def _computed_nan_in_one_part(out, args, kwargs_dump):
    with np.errstate(invalid="ignore"):
        nan = args[0].real * 0.0 / 0.0  # NaN from arithmetic: never the pattern's payload
    out[0].real[...] = args[0].real
    out[0].imag[...] = nan
    out[0][::2] = nan[::2] + 1j * args[0].imag[::2]  # and NaN in the real part of every other


def test_a_complex_output_with_nan_computed_in_one_part_passes(checking, enable_x64):
    op = jaxbind.get_linear_call(
        _computed_nan_in_one_part, None, same_as_last, name="tests.unwritten_half_nan"
    )
    for dtype in (np.complex64, np.complex128):
        x = (np.arange(1, 7) + 1j).astype(dtype)
        y = np.asarray(jax.jit(lambda x: op(x)[0])(x))
        np.testing.assert_array_equal(y.real[1::2], x.real[1::2])
        assert np.isnan(y.imag[1::2]).all() and np.isnan(y.real[::2]).all()
