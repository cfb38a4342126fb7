"""A reference that is not the op's: its outputs are checked against the op's declaration
wherever it is traced (derived rules, their vmaps and Hessians, the switch, portable
exports), and every failure of it names the op, in both APIs."""

import itertools
import re
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind

X = jnp.linspace(0.1, 1.0, 3, dtype=jnp.float32)
_names = itertools.count()


def _sine(out, args, kd):
    out[0][...] = np.sin(args[0])


def _same(x):
    return ((x.shape, x.dtype),)


def _two_like(x):
    return ((x.shape, x.dtype),) * 2


def _op(api: str, reference, outputs: int = 1):
    """A forward-only op (its JVP, VJP derived from `reference`) in one API, as a function
    of x that returns its first output."""
    name = f"tests.references.errors.{api}{next(_names)}"
    if api == "1.3":
        op = jaxbind.get_nonlinear_call(
            _sine,
            (None, None),
            _same if outputs == 1 else _two_like,
            reference=reference,
            name=name,
        )
        return name, lambda x: op(x)[0]

    def shape(x):
        sds = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return sds if outputs == 1 else (sds, sds)

    native = jaxbind.nonlinear_op(shape=shape, reference=reference, name=name)(
        lambda x: np.sin(x) if outputs == 1 else (np.sin(x), np.cos(x))
    )
    return name, native if outputs == 1 else (lambda x: native(x)[0])


def _portable(f, x):
    return jaxbind.export(f, portable=True)(x)


def _use_reference(f, x):
    with jaxbind.use_reference():
        return jax.jit(f)(x)


ROUTES = {
    "grad": lambda f, x: jax.grad(lambda x: f(x).sum())(x),
    "jvp": lambda f, x: jax.jvp(f, (x,), (x,)),
    "vjp": lambda f, x: jax.vjp(f, x)[1](jnp.ones_like(x)),
    "vmap of the derived JVP": lambda f, x: jax.vmap(lambda x: jax.jvp(f, (x,), (x,))[1])(
        jnp.stack([x, x])
    ),
    "hessian": lambda f, x: jax.hessian(lambda x: f(x).sum())(x),
    "use_reference": _use_reference,
    "portable export": _portable,
}
APIS = ["1.3", "native"]


def _text(info) -> str:
    """The whole message, with its notes (where jaxbind names the op in a user's error)."""
    return "".join(traceback.format_exception_only(info.value))


WRONG = {
    "shape": (lambda x: jnp.stack([jnp.sin(x)] * 2), r"\[float32\[2, 3\]\]"),
    "dtype": (lambda x: jnp.sin(x).astype(jnp.float16), r"\[float16\[3\]\]"),
}


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("wrong", list(WRONG))
@pytest.mark.parametrize("api", APIS)
def test_a_reference_of_the_wrong_shape_or_dtype_is_an_error_naming_both_lists(api, wrong, route):
    """Not a silently wrong gradient (relative error 0.49) or a tangent of the wrong shape:
    an error naming the op, what the reference gave, what the op declares, and the fix."""
    reference, gave = WRONG[wrong]
    name, f = _op(api, reference)
    with pytest.raises(TypeError) as info:
        jax.block_until_ready(ROUTES[route](f, X))
    text = _text(info)
    assert f"'{name}'" in text, text
    assert "its JAX reference gave" in text, text
    assert "but the op declares [float32[3]]" in text, text
    assert re.search(gave, text), text
    assert "must return the op's outputs" in text, text


@pytest.mark.parametrize("route", ["grad", "use_reference"])
@pytest.mark.parametrize("api", APIS)
def test_a_reference_that_returns_too_few_outputs_names_the_op(api, route):
    name, f = _op(api, jnp.sin, outputs=2)
    with pytest.raises(Exception) as info:
        jax.block_until_ready(ROUTES[route](f, X))
    text = _text(info)
    assert f"'{name}'" in text and "its JAX reference" in text, text


def _raises(x):
    raise ValueError("the reference's own failure")


def _callback(x):
    return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


FAILING = {
    "raises": (_raises, ValueError, "own failure"),
    "pure_callback": (_callback, ValueError, ""),
}


@pytest.mark.parametrize("route", ["grad", "vjp", "use_reference"])
@pytest.mark.parametrize("failing", list(FAILING))
@pytest.mark.parametrize("api", APIS)
def test_a_failing_reference_keeps_its_error_and_names_the_op_and_role(api, failing, route):
    reference, error, own = FAILING[failing]
    if failing == "pure_callback" and route == "use_reference":
        pytest.skip("a pure_callback runs under the switch (not in a portable export)")
    name, f = _op(api, reference)
    with pytest.raises(error) as info:
        jax.block_until_ready(ROUTES[route](f, X))
    text = _text(info)
    assert own in text, text
    role = "the function" if route == "use_reference" else "the JVP"
    assert f"jaxbind: '{name}' ({role}): its JAX reference failed" in text, text
    assert "not jax.pure_callback" in text, text


@pytest.mark.parametrize("route", ["grad", "jvp", "use_reference", "portable export"])
@pytest.mark.parametrize("api", APIS)
def test_a_reference_that_calls_its_own_op_is_refused_naming_it(api, route):
    """Not a bare RecursionError from deep inside JAX."""
    ops = {}
    name, f = _op(api, lambda x: ops["f"](x))
    ops["f"] = f
    with pytest.raises(RecursionError) as info:
        jax.block_until_ready(ROUTES[route](f, X))
    text = str(info.value)
    assert f"jaxbind: '{name}': its JAX reference calls the op itself" in text, text
    assert "without calling it" in text, text


@pytest.mark.usefixtures("enable_x64")
@pytest.mark.parametrize("api", APIS)
def test_a_float64_reference_of_a_float32_op_is_an_error_not_a_float64_tangent(api):
    """A float64 constant in the reference (jax_enable_x64) made the derived JVP return a
    float64 tangent for a float32 output."""
    name, f = _op(api, lambda x: jnp.sin(x) * np.float64(2.0))
    with pytest.raises(
        TypeError, match=rf"'{name}'.*gave \[float64\[3\]\].*declares \[float32\[3\]\]"
    ):
        jax.jvp(f, (X,), (X,))


def _mixed(out, args, kd):
    out[0][...] = np.sin(args[0]) * args[1]


def _mixed_abstract(a, b):
    return ((b.shape, b.dtype),)


def _mixed_reference(a, b):
    return jnp.sin(a).astype(b.dtype) * b


@pytest.mark.usefixtures("enable_x64")
def test_derived_tangents_and_cotangents_take_the_dtypes_of_outputs_and_inputs():
    """float32 and float64 in, float64 out: the derived JVP's tangent is float64, the
    derived VJP's cotangents float32 and float64, with JAX's values of the reference."""
    op = jaxbind.get_nonlinear_call(
        _mixed,
        (None, None),
        _mixed_abstract,
        reference=_mixed_reference,
        name="tests.references.errors.mixed",
    )
    a, b = X, jnp.linspace(1.0, 2.0, 3, dtype=jnp.float64)

    def f(a, b):
        return op(a, b)[0]

    y, t = jax.jvp(f, (a, b), (a, b))
    want_y, want_t = jax.jvp(_mixed_reference, (a, b), (a, b))
    assert t.dtype == jnp.float64
    np.testing.assert_allclose(t, want_t, rtol=1e-6)
    ca, cb = jax.vjp(f, a, b)[1](jnp.ones(3, jnp.float64))
    assert (ca.dtype, cb.dtype) == (jnp.float32, jnp.float64)
    want_a, want_b = jax.vjp(_mixed_reference, a, b)[1](jnp.ones(3, jnp.float64))
    np.testing.assert_allclose(ca, want_a, rtol=1e-6)
    np.testing.assert_allclose(cb, want_b, rtol=1e-12)


@pytest.mark.parametrize("strict", ["portable export", "use_reference(strict=True)"])
@pytest.mark.parametrize("api", APIS)
def test_a_reference_that_calls_back_into_python_is_refused_where_references_only_are_asked(
    api, strict
):
    """A pure_callback is a custom call: not in a portable artifact (JAX's own refusal,
    "serialization of host_callbacks", named no op)."""
    name, f = _op(api, _callback)

    def run():
        if strict == "portable export":
            return _portable(f, X)
        with jaxbind.use_reference(strict=True):
            return jax.jit(f)(X)

    with pytest.raises(
        TypeError, match=rf"'{name}' \(the function\): its JAX reference calls back"
    ):
        run()
    with jaxbind.use_reference():  # where custom calls may stay, it runs
        np.testing.assert_allclose(jax.jit(f)(X), np.sin(X), rtol=1e-6)
