"""Keyword arguments that hold themselves (a list or dict in a cycle): picklable, so they
work eagerly and under jit, held in this process as other values that are not data are;
the callable gets the same cycle, copied afresh at every call. jax.export refuses them
with the documented TypeError ("must be plain data") naming the op and the argument.
Both APIs; a list, a dict, and a cycle deeper down. (JAXbind 1.3.1, with the JAX it is
compared against, refuses every list or dict keyword argument: unhashable.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import simple_op

import jaxbind

RECEIVED: list = []  # per call: (whether the callable got the cycle expected, its copy)
EXPECTED = [lambda opt: False]


def _received(opt):
    """Record what a body got, then change it (which no later call may see)."""
    RECEIVED.append((EXPECTED[0](opt), opt))
    if isinstance(opt, dict):
        opt["changed"] = "by the callable"
    else:
        opt.append("by the callable")


def _record(out, args, kwargs_dump):
    _received(jaxbind.load_kwargs(kwargs_dump)["opt"])
    out[0][...] = args[0]


OP = simple_op(_record, "tests.kwargs_cycle")


@jaxbind.linear_op(
    shape=lambda x, *, opt: jax.ShapeDtypeStruct(x.shape, x.dtype),
    name="tests.kwargs_cycle_native",
)
def native(x, *, out, opt):
    _received(opt)
    out[...] = x


def _cyclic(kind):
    """A cyclic value and a function that says whether a value has the same cycle."""
    if kind == "list":
        a = [1.5, "x"]
        a.append(a)
        return a, lambda b: len(b) == 3 and b[:2] == [1.5, "x"] and b[2] is b
    if kind == "dict":
        d = {"n": 3}
        d["me"] = d
        return d, lambda e: list(e) == ["n", "me"] and e["n"] == 3 and e["me"] is e
    deep = {"x": [1, {"y": (2, [])}]}
    deep["x"][1]["y"][1].append(deep)
    return deep, lambda e: list(e) == ["x"] and e["x"][1]["y"][1][0] is e


_APIS = {
    "get_linear_call": lambda x, opt: OP(x, opt=opt)[0],
    "linear_op": lambda x, opt: native(x, opt=opt),
}


@pytest.mark.parametrize("kind", ["list", "dict", "nested"])
@pytest.mark.parametrize("api", list(_APIS))
def test_a_cyclic_keyword_argument_reaches_the_callable_eagerly_and_under_jit(api, kind):
    value, EXPECTED[0] = _cyclic(kind)
    f = _APIS[api]
    x = jnp.arange(3.0)
    for route in (lambda x: f(x, value), jax.jit(lambda x: f(x, value))):
        RECEIVED.clear()
        for _ in range(2):
            np.testing.assert_array_equal(route(x), x)
        # the cycle each time, in a fresh copy: not the caller's, nor the last call's
        assert [same for same, _ in RECEIVED] == [True, True]
        assert all(got is not value for _, got in RECEIVED)
        assert RECEIVED[0][1] is not RECEIVED[1][1]
    assert EXPECTED[0](value)  # the caller's value untouched


@pytest.mark.parametrize("kind", ["list", "dict", "nested"])
@pytest.mark.parametrize("api", list(_APIS))
def test_a_cyclic_keyword_argument_is_refused_by_export_naming_the_op_and_argument(api, kind):
    value, _ = _cyclic(kind)
    f = _APIS[api]
    name = "tests.kwargs_cycle" if api == "get_linear_call" else "tests.kwargs_cycle_native"
    with pytest.raises(TypeError) as info:
        jaxbind.export(jax.jit(lambda x: f(x, value)))(jnp.arange(3.0))
    text = str(info.value)
    assert f"jaxbind: cannot export '{name}': its keyword arguments must be plain data" in text
    assert "opt" in text and "holds itself" in text


def test_a_cyclic_keyword_argument_changed_between_calls_reaches_the_next_call():
    value, _ = _cyclic("list")
    EXPECTED[0] = lambda opt: True
    RECEIVED.clear()
    for first in (1.5, 2.5):
        value[0] = first
        jax.block_until_ready(OP(jnp.ones(2), opt=value)[0])
    assert [got[0] for _, got in RECEIVED] == [1.5, 2.5]


def test_a_value_inside_a_cycle_is_checked_as_anywhere_else_naming_the_op_and_its_path():
    value = []
    value.append(value)
    value.append(lambda: None)
    with pytest.raises(
        TypeError, match=r"'tests.kwargs_cycle'.* 'opt\[1\]' \(function\) is neither"
    ):
        OP(jnp.ones(2), opt=value)
    value[1] = jnp.ones(2)
    with pytest.raises(TypeError, match=r"'tests.kwargs_cycle'.* 'opt\[1\]' is a JAX array"):
        OP(jnp.ones(2), opt=value)
