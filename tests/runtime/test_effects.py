"""Side effects (has_side_effect=True, ordered=True): counted and ordered executions.

Each test runs a program that XLA or JAX would otherwise simplify: a pure op is
dropped when its result is unused, merged with an identical call, and reordered
when its input is ready earlier. The same program with a side-effecting op keeps
every execution; with an ordered op, also the program order.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_first

import jaxbind

LOG = []


def _record(out, args, kwargs_dump):
    LOG.append(float(np.asarray(args[0]).ravel()[0]))
    out[0][...] = args[0]


pure = jaxbind.get_linear_call(
    _record, _record, same_as_first, same_as_first, name="tests.effects_pure"
)
side = jaxbind.get_linear_call(
    _record, _record, same_as_first, same_as_first, name="tests.effects_side", has_side_effect=True
)
ordered = jaxbind.get_linear_call(
    _record, _record, same_as_first, same_as_first, name="tests.effects_ordered", ordered=True
)


def _run(fn, *args):
    LOG.clear()
    jax.block_until_ready(jax.jit(fn)(*args))
    jax.effects_barrier()
    return list(LOG)


@pytest.fixture(autouse=True)
def _clear():
    LOG.clear()
    yield
    LOG.clear()


def test_unused_result_is_not_removed():
    dead = lambda op: lambda x: (op(x), x)[1]
    assert _run(dead(pure), jnp.ones(3)) == []  # what a pure op gets
    assert _run(dead(side), jnp.ones(3)) == [1.0]
    assert _run(dead(ordered), jnp.ones(3)) == [1.0]


def test_identical_calls_are_not_merged():
    twice = lambda op: lambda x: op(x)[0] + op(x)[0]
    assert _run(twice(pure), jnp.ones(3)) == [1.0]  # XLA merges the pure calls
    assert _run(twice(side), jnp.ones(3)) == [1.0, 1.0]
    assert _run(twice(ordered), jnp.ones(3)) == [1.0, 1.0]


def _late_then_early(op):
    """Program order: a call on a slow result, then one on an input that is ready at once."""

    def prog(x):
        h = x
        for _ in range(30):
            h = jnp.sin(h @ jnp.ones((200, 200)) / 200)
        a = op(h[:1] * 0 + 1.0)[0]
        b = op(x[:1] * 0 + 2.0)[0]
        return a, b

    return prog


def test_ordered_calls_keep_program_order():
    assert _run(_late_then_early(pure), jnp.ones(200)) == [2.0, 1.0]  # XLA runs b first
    assert _run(_late_then_early(ordered), jnp.ones(200)) == [1.0, 2.0]


def test_order_with_ordered_io_callback():
    def prog(x):
        jax.experimental.io_callback(
            lambda v: LOG.append(float(v)) or np.int32(0),
            jax.ShapeDtypeStruct((), np.int32),
            x[0] * 0 + 5.0,
            ordered=True,
        )
        ordered(x[:1] * 0 + 6.0)
        jax.experimental.io_callback(
            lambda v: LOG.append(float(v)) or np.int32(0),
            jax.ShapeDtypeStruct((), np.int32),
            x[0] * 0 + 7.0,
            ordered=True,
        )
        return x

    import jax.experimental

    assert _run(prog, jnp.ones(2)) == [5.0, 6.0, 7.0]


def test_ordered_calls_in_scan_while_and_cond():
    def scan(x):
        return jax.lax.scan(lambda c, _: (c + 1, ordered(c)[0]), x, None, length=4)

    assert _run(scan, jnp.zeros(2)) == [0.0, 1.0, 2.0, 3.0]

    def loop(x):
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: ordered(c)[0] + 1, x)

    assert _run(loop, jnp.zeros(2)) == [0.0, 1.0, 2.0]

    def branch(p, x):
        return jax.lax.cond(p, lambda x: ordered(x + 10)[0], lambda x: ordered(x + 20)[0], x)

    assert _run(branch, True, jnp.zeros(2)) == [10.0]
    assert _run(branch, False, jnp.zeros(2)) == [20.0]


def test_order_across_programs_and_eager_calls():
    f = jax.jit(lambda x: ordered(x + 1)[0])
    g = jax.jit(lambda x: ordered(x + 2)[0])
    f(jnp.zeros(1))
    g(jnp.zeros(1))
    ordered(jnp.zeros(1) + 3)
    f(jnp.zeros(1))
    jax.effects_barrier()
    assert LOG == [1.0, 2.0, 3.0, 1.0]


def test_vmap_is_one_call_that_runs_the_batch_in_order():
    got = jax.jit(jax.vmap(lambda x: ordered(x)[0]))(jnp.arange(8.0).reshape(4, 2))
    jax.effects_barrier()
    np.testing.assert_array_equal(got, np.arange(8.0).reshape(4, 2))
    assert LOG == [0.0, 2.0, 4.0, 6.0]
    LOG.clear()
    jax.vmap(lambda x: side(x)[0])(jnp.arange(4.0).reshape(2, 2))
    jax.effects_barrier()
    assert LOG == [0.0, 2.0]


@pytest.mark.parametrize("op", [side, ordered], ids=["side", "ordered"])
def test_grad_runs_the_function_and_the_transpose_once_each(op):
    g = jax.jit(jax.grad(lambda x: jnp.sum(op(x)[0] * 3)))(jnp.full(2, 4.0))
    jax.effects_barrier()
    np.testing.assert_array_equal(g, [3.0, 3.0])
    assert LOG == [4.0, 3.0]  # f at the primal, then the transpose at the cotangent


@pytest.mark.parametrize("op", [side, ordered], ids=["side", "ordered"])
def test_export_is_refused_with_the_reason(op):
    with pytest.raises(TypeError, match=r"cannot export 'tests\.effects_.*': it has side effects"):
        jaxbind.export(lambda x: op(x)[0])(jnp.ones(2))


def test_options_are_validated():
    with pytest.raises(TypeError, match="has_side_effect and ordered must be bools"):
        jaxbind.get_linear_call(_record, None, same_as_first, None, has_side_effect="yes")
