"""Common mistakes with the callable protocol give clear errors, never garbage or a crash.

- a callable that returns its result instead of writing into ``out``;
- a generator or async function as a callable (its body never runs);
- keyword arguments changed inside a call (they must not reach later calls, nor
  other bindings), and distinct objects that pickle alike;
- a callable object whose ``__eq__`` cannot answer (a dataclass holding an array);
- daemon threads inside callables when the interpreter exits.
"""

import dataclasses
import pathlib
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import double, same_as_first
from support.processes import run_python

import jaxbind


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_callable_that_returns_its_result_is_an_error_naming_the_binding(jit):
    def returns(out, args, kw):
        return 2 * args[0]

    op = jaxbind.get_linear_call(
        returns, returns, same_as_first, same_as_first, name=f"reliability.returns_{jit}"
    )
    call = jax.jit(lambda x: op(x)[0]) if jit else (lambda x: op(x)[0])
    with pytest.raises(
        Exception,
        match=r"reliability.returns_.*returned a ndarray instead of "
        r"None.*out\[k\]\[\.\.\.\] = result.*linear_op",
    ):
        jax.block_until_ready(call(jnp.ones(3)))


@pytest.mark.parametrize("kind", ["generator", "coroutine"])
def test_a_callable_whose_body_never_runs_is_refused_when_the_op_is_made(kind):
    if kind == "generator":

        def body(out, args, kw):
            yield out
    else:

        async def body(out, args, kw):
            out[0][...] = args[0]

    with pytest.raises(TypeError, match=rf"f of 'reliability.{kind}' is a {kind} function"):
        jaxbind.get_linear_call(body, None, same_as_first, None, name=f"reliability.{kind}")
    with pytest.raises(TypeError, match="f_T .* never write its results"):
        jaxbind.get_linear_call(
            double, body, same_as_first, same_as_first, name=f"reliability.{kind}_T"
        )


def test_changing_the_keyword_arguments_inside_a_call_reaches_no_other_call():
    def scales(out, args, kw):
        k = jaxbind.load_kwargs(kw)
        k["opts"]["scale"] *= 2
        k["opts"]["steps"].append(1)
        out[0][...] = args[0] * k["opts"]["scale"] * len(k["opts"]["steps"])

    def reads(out, args, kw):
        k = jaxbind.load_kwargs(kw)
        out[0][...] = args[0] * k["opts"]["scale"] * len(k["opts"]["steps"])

    op = jaxbind.get_linear_call(
        scales, None, same_as_first, None, name="reliability.mutates_kwargs"
    )
    other = jaxbind.get_linear_call(
        reads, None, same_as_first, None, name="reliability.reads_kwargs"
    )
    opts = {"scale": 1.0, "steps": [0]}
    g = jax.jit(lambda x: op(x, opts=opts)[0])
    assert [float(g(jnp.ones(2))[0]) for _ in range(3)] == [4.0, 4.0, 4.0]
    assert [float(op(jnp.ones(2), opts=opts)[0][0]) for _ in range(2)] == [4.0, 4.0]
    assert float(other(jnp.ones(2), opts=opts)[0][0]) == 1.0
    assert opts == {"scale": 1.0, "steps": [0]}  # the caller's own dict is untouched


def test_changing_keyword_arguments_in_the_jax_native_api_reaches_no_other_call():
    @jaxbind.nonlinear_op(
        shape=lambda x, **kw: jax.ShapeDtypeStruct(x.shape, x.dtype),
        name="reliability.native_mutates_kwargs",
    )
    def scaled(x, *, opts):
        opts["scale"] *= 3
        return x * opts["scale"]

    opts = {"scale": 1.0}
    assert [float(scaled(jnp.ones(2), opts=opts)[0]) for _ in range(3)] == [3.0, 3.0, 3.0]


class _Handle:
    """State outside its pickle (like a plan or a file handle): two are never the same."""

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        return _Handle, (0,)  # every handle pickles alike


def test_objects_that_pickle_alike_are_never_confused():
    def uses(out, args, kw):
        out[0][...] = args[0] * jaxbind.load_kwargs(kw)["handle"].value

    op = jaxbind.get_linear_call(uses, None, same_as_first, None, name="reliability.handles")
    a, b = _Handle(2.0), _Handle(5.0)
    assert float(op(jnp.ones(1), handle=a)[0][0]) == 2.0
    assert float(op(jnp.ones(1), handle=b)[0][0]) == 5.0
    g = jax.jit(lambda x, h: op(x, handle=h)[0], static_argnums=1)
    assert float(g(jnp.ones(1), a)[0]) == 2.0 and float(g(jnp.ones(1), b)[0]) == 5.0


@dataclasses.dataclass
class MatOp:
    m: np.ndarray

    def __call__(self, out, args, kw):
        out[0][...] = self.m @ args[0]


def test_callables_that_are_dataclasses_holding_arrays_make_distinct_ops():
    first = jaxbind.get_linear_call(MatOp(np.eye(2)), None, same_as_first, None)
    second = jaxbind.get_linear_call(MatOp(2 * np.eye(2)), None, same_as_first, None)
    assert first.name != second.name
    np.testing.assert_array_equal(first(jnp.ones(2))[0], [1, 1])
    np.testing.assert_array_equal(second(jnp.ones(2))[0], [2, 2])
    same = MatOp(np.eye(2))
    named = jaxbind.get_linear_call(same, None, same_as_first, None, name="reliability.matop")
    again = jaxbind.get_linear_call(same, None, same_as_first, None, name="reliability.matop")
    assert again.binding is named.binding


def test_a_callable_running_at_exit_finishes_before_the_interpreter_stops(tmp_path):
    """The interpreter exits while daemon threads are inside jaxbind callables.

    jaxbind's exit hook lets running callables finish (a thread stopped inside one
    unwinds through XLA, which aborts: rc 134 before), and later calls fail with an
    error instead of calling Python. A daemon thread stopped inside JAX's own
    dispatch aborts even with plain ``jnp`` ops (jax 0.10, Python 3.11: jaxlib's
    PjitFunction::Call is noexcept): that part is JAX's, so the threads here are
    back in Python when the interpreter stops them.
    """
    script = tmp_path / "exit_while_running.py"
    script.write_text(
        textwrap.dedent("""
        import threading, time
        import jax, jax.numpy as jnp, numpy as np
        import jaxbind

        started = threading.Event()

        def slow(out, args, kw):
            started.set()
            time.sleep(0.3)  # the GIL is released here: exit comes meanwhile
            out[0][...] = args[0]

        op = jaxbind.get_linear_call(slow, None, lambda x: ((x.shape, x.dtype),), None,
                                     name="exit.slow")
        g = jax.jit(lambda x: op(x)[0])
        g(jnp.ones(4)).block_until_ready()

        def once():
            g(jnp.ones(4)).block_until_ready()
            time.sleep(60)  # in Python: stopped here at exit, as any daemon thread

        for _ in range(4):
            threading.Thread(target=once, daemon=True).start()
        started.wait()
        print("main done", flush=True)
    """)
    )
    for _ in range(3):
        proc = run_python(script, timeout=120, cwd=pathlib.Path(__file__).parent)
        assert "main done" in proc.stdout
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
        assert "FATAL" not in proc.stderr


def _sin(out, args, kw):
    out[0][...] = np.sin(args[0])


@jaxbind.jax_function
def _good_jvp(x, dx):
    return [jnp.cos(x) * dx]


@jaxbind.jax_function
def _good_vjp(x, ct):
    return [jnp.cos(x) * ct]


@pytest.mark.parametrize("wrong", ["shape", "count", "dtype"])
def test_a_jax_function_derivative_returning_the_wrong_shape_is_an_error(wrong):
    bad = {
        "shape": lambda x, t: [t[:2]],
        "count": lambda x, t: [t, t],
        "dtype": lambda x, t: [t.astype(jnp.float16)],
    }[wrong]
    bad_jvp = jaxbind.get_nonlinear_call(
        _sin,
        (jaxbind.jax_function(bad), _good_vjp),
        same_as_first,
        None,
        name=f"reliability.bad_jvp_{wrong}",
    )
    bad_vjp = jaxbind.get_nonlinear_call(
        _sin,
        (_good_jvp, jaxbind.jax_function(bad)),
        same_as_first,
        None,
        name=f"reliability.bad_vjp_{wrong}",
    )
    x = jnp.ones(3)
    for route in (
        lambda: jax.jvp(lambda x: bad_jvp(x)[0], (x,), (x,)),
        lambda: jax.jacfwd(lambda x: bad_jvp(x)[0])(x),
        lambda: jax.vmap(lambda x: jax.jvp(lambda x: bad_jvp(x)[0], (x,), (x,)))(jnp.ones((2, 3))),
    ):
        with pytest.raises(
            TypeError,
            match=rf"the JVP of 'reliability.bad_jvp_{wrong}' is a "
            r"JAX function and returned .* tangents of the op",
        ):
            route()
    for route in (
        lambda: jax.grad(lambda x: bad_vjp(x)[0].sum())(x),
        lambda: jax.vmap(jax.grad(lambda x: bad_vjp(x)[0].sum()))(jnp.ones((2, 3))),
    ):
        with pytest.raises(
            TypeError,
            match=rf"the VJP of 'reliability.bad_vjp_{wrong}' is a "
            r"JAX function and returned .* cotangents",
        ):
            route()
