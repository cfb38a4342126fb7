"""The switch (use_reference, JAXBIND_USE_REFERENCE): where it may be entered, and the one
environment variable that sets it."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.processes import run_python

import jaxbind

X = jnp.linspace(0.1, 1.0, 4, dtype=jnp.float32)


def _native_sine_plus_100(out, args, kd):  # the native body differs from the reference
    out[0][...] = np.sin(args[0]) + 100


def _same(x):
    return ((x.shape, x.dtype),)


SINE_13 = jaxbind.get_nonlinear_call(
    _native_sine_plus_100,
    (None, None),
    _same,
    reference=jnp.sin,
    name="tests.references.switch.sine13",
)


@jaxbind.nonlinear_op(
    shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
    name="tests.references.switch.sine_native",
)
def sine_native(x):
    return np.sin(x) + 100


sine_native.def_reference(jnp.sin)

OPS = {"1.3": lambda x: SINE_13(x)[0], "native": sine_native}
TRANSFORMS = {
    "jit": lambda f: jax.jit(f),
    "grad": lambda f: jax.grad(lambda x: f(x).sum()),
    "vmap": lambda f: jax.vmap(f),
    "eval_shape": lambda f: lambda x: jax.eval_shape(f, x),
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("api", list(OPS))
def test_use_reference_inside_a_traced_function_is_refused_saying_where_it_goes(api, transform):
    """Entered inside the traced function, the switch would be ignored (the native body
    ran): an error that says to enter it around the call instead."""
    op = OPS[api]

    def f(x):
        with jaxbind.use_reference():
            return op(x)

    with pytest.raises(RuntimeError, match=r"use_reference\(\) was entered inside") as info:
        TRANSFORMS[transform](f)(X)
    assert "Enter it outside, around the call" in str(info.value)
    with jaxbind.use_reference():  # where it belongs: honoured
        np.testing.assert_allclose(jax.jit(op)(X), np.sin(X), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(op)(X), np.sin(X) + 100, rtol=1e-6)


def test_use_reference_inside_a_trace_that_changes_nothing_is_allowed():
    """The setting already in force (a block inside the same block): nothing is ignored."""
    op = OPS["native"]

    def f(x):
        with jaxbind.use_reference():
            return op(x)

    with jaxbind.use_reference():
        np.testing.assert_allclose(jax.jit(f)(X), np.sin(X), rtol=1e-6)


_SCRIPT = """
import jax.numpy as jnp, numpy as np, jaxbind
from jaxbind._references import mode
calls = []
def f(out, args, kd):
    calls.append(1); out[0][...] = 2 * args[0]
op = jaxbind.get_nonlinear_call(f, (None, None), lambda x: ((x.shape, x.dtype),),
                                reference=lambda x: 2 * x)
print(mode(), float(op(jnp.ones(3))[0].sum()), len(calls))
"""


@pytest.mark.parametrize(
    "env, setting",
    [
        ({"JAXBIND_REFERENCES": "1"}, "off"),
        ({"JAXBIND_REFERENCES": "on"}, "off"),
        ({"JAXBIND_REFERENCES": "strict"}, "off"),
        ({"JAXBIND_USE_REFERENCE": "1", "JAXBIND_REFERENCES": "off"}, "on"),
        ({"JAXBIND_USE_REFERENCE": "0", "JAXBIND_REFERENCES": "on"}, "off"),
        ({"JAXBIND_USE_REFERENCE": "strict"}, "strict"),
    ],
)
def test_only_jaxbind_use_reference_sets_the_switch(env, setting):
    """JAX reads no variable of its own for the switch: JAXBIND_REFERENCES neither breaks
    the import nor overrides the documented JAXBIND_USE_REFERENCE, either way."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("JAXBIND_")}
    done = run_python("-c", _SCRIPT, env={**base, **env})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [setting, "6.0", "1" if setting == "off" else "0"]


def test_an_unknown_value_of_the_variable_fails_the_import_naming_it():
    base = {k: v for k, v in os.environ.items() if not k.startswith("JAXBIND_")}
    done = run_python("-c", "import jaxbind", env={**base, "JAXBIND_USE_REFERENCE": "maybe"})
    assert done.returncode != 0 and "JAXBIND_USE_REFERENCE='maybe'" in done.stderr


def test_the_switch_is_not_a_jax_option():
    """jax.config neither lists nor sets it (where JAX would read it from its own variable)."""
    assert not any("reference" in name for name in jax.config.values)
    with pytest.raises(AttributeError):
        jax.config.update("jaxbind_use_reference", "on")
