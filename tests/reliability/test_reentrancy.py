"""Callables that are interrupted, or that call jitted functions and jaxbind ops again."""

import pathlib
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_first
from support.processes import run_script

import jaxbind

_INTERRUPTED = textwrap.dedent("""
    import os, signal, sys, threading, time
    import jax, jax.numpy as jnp
    import jaxbind

    # Ctrl-C as in a terminal, whatever this process inherited (a shell's background job
    # starts with SIGINT ignored, and then Python raises no KeyboardInterrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def slow(out, args, kw):
        {body}
        out[0][...] = args[0]

    op = jaxbind.get_linear_call(slow, None, lambda x: ((x.shape, x.dtype),), None,
                                 name="interrupt.slow")
    run = {{"eager": lambda x: op(x)[0], "jit": jax.jit(lambda x: op(x)[0]),
           "vmap": jax.jit(jax.vmap(lambda x: op(x)[0]))}}[sys.argv[1]]
    for attempt in range(2):  # cold (compiling first) and warm
        {before}
        try:
            run(jnp.ones((2, 3))).block_until_ready()
        except KeyboardInterrupt:
            print("KeyboardInterrupt", attempt, flush=True)
        except BaseException as e:
            print("other", type(e).__name__, e, flush=True)
        else:
            print("finished", attempt, flush=True)
""")


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap"])
@pytest.mark.parametrize("how", ["signal", "raised"])
def test_an_interrupted_callable_reaches_the_caller_as_keyboard_interrupt(tmp_path, mode, how):
    if how == "signal":  # Ctrl-C while the callable sleeps
        body = "time.sleep(30)"
        before = "threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()"
    else:  # a callable that raises KeyboardInterrupt itself, as input() does on Ctrl-C
        body = "raise KeyboardInterrupt"
        before = "pass"
    code = _INTERRUPTED.format(body=body, before=before)
    here = pathlib.Path(__file__).parent
    proc = run_script(tmp_path, code, mode, name="interrupted.py", timeout=120, cwd=here)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["KeyboardInterrupt 0", "KeyboardInterrupt 1"], (
        proc.stdout + proc.stderr[-3000:]
    )


def test_a_callable_may_call_its_own_op_eagerly():
    depth = {"left": 0}

    def halve_then_recurse(out, args, kw):
        if depth["left"] > 0:
            depth["left"] -= 1
            inner = op(jnp.asarray(args[0]))[0]  # same op, same shapes: a nested eager call
            out[0][...] = 2 * np.asarray(inner)
        else:
            out[0][...] = args[0]

    op = jaxbind.get_linear_call(
        halve_then_recurse, None, same_as_first, None, name="reliability.recursive"
    )
    for levels in (3, 0, 5, 2):  # cold, then warm, then deeper than before
        depth["left"] = levels
        np.testing.assert_array_equal(op(jnp.ones(3))[0], 2.0**levels * np.ones(3))
        depth["left"] = levels
        np.testing.assert_array_equal(
            jax.jit(lambda x: op(x)[0])(jnp.ones(3)), 2.0**levels * np.ones(3)
        )
    # with keyword arguments, and in the pytree API
    depth["left"] = 2

    def scaled(out, args, kw):
        s = jaxbind.load_kwargs(kw)["s"]
        if depth["left"] > 0:
            depth["left"] -= 1
            out[0][...] = s * np.asarray(with_kw(jnp.asarray(args[0]), s=s)[0])
        else:
            out[0][...] = args[0]

    with_kw = jaxbind.get_linear_call(scaled, None, same_as_first, None, name="reliability.rec_kw")
    np.testing.assert_array_equal(with_kw(jnp.ones(2), s=3.0)[0], [9.0, 9.0])

    left = {"n": 3}

    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="reliability.rec_native"
    )
    def native(x):
        if left["n"] > 0:
            left["n"] -= 1
            return 2 * np.asarray(native(jnp.asarray(x)))
        return np.asarray(x)

    np.testing.assert_array_equal(native(jnp.ones(2)), [8.0, 8.0])


def test_a_jitted_function_entered_again_while_cold_is_explained():
    """JAX refuses to re-enter a jitted function during its first call with the same
    argument types. jaxbind cannot change that for the user's own jit; the error says why
    and what to do."""
    state = {"entered": False}

    def reenters(out, args, kw):
        if not state["entered"]:
            state["entered"] = True
            g(jnp.asarray(args[0]))
        out[0][...] = args[0]

    op = jaxbind.get_linear_call(reenters, None, same_as_first, None, name="reliability.reenters")
    g = jax.jit(lambda x: op(x)[0])
    with pytest.raises(
        Exception,
        match=r"(?s)'reliability.reenters'.*Recursively calling jit"
        r".*Call the jitted function once before",
    ):
        g(jnp.ones(3)).block_until_ready()
    state["entered"] = False  # warm now: entering it again is fine
    np.testing.assert_array_equal(g(jnp.ones(3)), np.ones(3))


def test_a_thread_started_by_a_callable_may_run_other_programs():
    """A callable may wait for a thread that runs jitted functions, once they are warm or
    have other argument types (with the same types during their first call, JAX waits for
    that first call to finish: see docs/protocol.md)."""
    h = jax.jit(lambda x: jnp.sin(x) + op(x)[0])

    def waits_for_thread(out, args, kw):
        if args[0].shape == (3,):
            result = []
            t = threading.Thread(target=lambda: result.append(np.asarray(h(jnp.ones(4)))))
            t.start()
            t.join(60)
            assert result, "the thread did not finish"
            out[0][...] = args[0] + result[0][:3]
        else:
            out[0][...] = args[0]

    op = jaxbind.get_linear_call(
        waits_for_thread, None, same_as_first, None, name="reliability.waits_for_thread"
    )
    expected = 1 + np.sin(1.0) + 1
    np.testing.assert_allclose(h(jnp.ones(3)), np.sin(1.0) + expected, rtol=1e-6)
    np.testing.assert_allclose(op(jnp.ones(3))[0], expected, rtol=1e-6)
