"""Each bad input gives its own clear error naming the binding; nothing crashes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import copy_last, simple_op
from support.processes import run_python

from jaxbind.testing import check


@pytest.mark.parametrize(
    "result, error, match",
    [
        ([((3,), np.float32)][0], TypeError, r"one output's \(shape, dtype\)"),  # not nested
        ({"shape": (3,)}, TypeError, r"returned \{'shape': \(3,\)\}"),  # wrong container
        (
            (((3,), np.float32, 0, 1),),
            TypeError,
            "must return a tuple with one \\(shape, dtype\\)",
        ),  # too long
        ((((3,), "float17"),), TypeError, "'float17', which is not a NumPy dtype"),  # unknown dtype
        (
            (((3,), np.dtype("U5")),),
            TypeError,
            "has dtype str160, which jaxbind cannot",
        ),  # unsupported
        ((((-3,), np.float32),), ValueError, "negative dimensions"),  # negative dim
    ],
)
def test_bad_abstract_results(result, error, match):
    op = simple_op(copy_last, f"reliability.bad_{abs(hash(str(result)))}", lambda x: result)
    with pytest.raises(error, match=match) as info:
        jax.jit(lambda x: op(x))(jnp.ones(3))
    assert "reliability.bad_" in str(info.value)


def test_callable_raising_keeps_the_process_alive():
    def boom(out, args, kd):
        raise ZeroDivisionError("division by zero in the kernel")

    op = simple_op(boom, "reliability.raises")
    for _ in range(20):
        with pytest.raises(
            Exception,
            match="'reliability.raises' \\(the function\\) raised "
            "ZeroDivisionError: division by zero in the kernel",
        ):
            jax.block_until_ready(jax.jit(lambda x: op(x)[0])(jnp.ones(3)))


def test_writing_into_a_copy_is_caught_by_check():
    def into_copy(out, args, kd):
        result = np.asarray(args[0]) * 2  # computed, never written into out[0]
        del result

    op = simple_op(into_copy, "reliability.into_copy")
    with pytest.raises(AssertionError, match="100% of the elements left unwritten"):
        check(op, np.ones(4, np.float32), verbose=False)


def test_unpicklable_kwargs():
    op = simple_op(copy_last, "reliability.kwargs")
    with pytest.raises(
        TypeError, match="'reliability.kwargs': keyword arguments must be plain data or picklable"
    ):
        op(jnp.ones(3), callback=lambda: 0)


def test_wrong_number_of_arguments():
    def one_arg_abstract(x, **kwargs):
        return ((x.shape, x.dtype),)

    op = simple_op(copy_last, "reliability.arity", one_arg_abstract)
    with pytest.raises(TypeError) as info:
        op(jnp.ones(3), jnp.ones(3))
    assert "abstract function of 'reliability.arity' takes 1 positional" in str(info.value)
    with pytest.raises(TypeError, match="'reliability.arity' got 0 positional arguments"):
        op()


_ROOT_CALL_PROGRAMS = r"""
import jax, jax.numpy as jnp, numpy as np, jaxbind

def double(out, args, kd):
    for o in out:
        o[...] = args[0] * 2

def spec(n):
    return lambda x, **k: ((x.shape, x.dtype),) * n

one = jaxbind.get_linear_call(double, double, spec(1), spec(1), name="root.one")
two = jaxbind.get_linear_call(double, None, spec(2), None, name="root.two")
alias = jaxbind.get_linear_call(double, None, spec(1), None, name="root.alias",
                                input_output_aliases={0: 0})
effect = jaxbind.get_linear_call(double, None, spec(1), None, name="root.effect",
                                 has_side_effect=True)
ordered = jaxbind.get_linear_call(double, None, spec(1), None, name="root.ordered",
                                  ordered=True)
x = jnp.arange(6.0).reshape(2, 1, 3)
y = x + 10
want = 2 * np.concatenate([x, y], axis=1)
cat = lambda a, b: jnp.concatenate([a, b], axis=1)
for name, f in [
    ("one", lambda a, b: one(cat(a, b))[0]),
    ("two", lambda a, b: two(cat(a, b))),
    ("alias", lambda a, b: alias(cat(a, b))[0]),
    ("effect", lambda a, b: effect(cat(a, b))[0]),
    ("ordered", lambda a, b: ordered(cat(a, b))[0]),
    ("stack", lambda a, b: one(jnp.stack([a, b]))[0]),
    ("complex", lambda a, b: one(cat(a.astype(jnp.complex64), b.astype(jnp.complex64)))[0]),
    ("transpose", lambda a, b: jax.linear_transpose(lambda t: one(t)[0], cat(a, b))(cat(a, b))[0]),
    ("vmap", lambda a, b: jax.vmap(lambda t: one(t)[0])(cat(a, b))),
    ("vmap_int", lambda a, b: jax.vmap(lambda t: one(t)[0])(cat(a, b).astype(jnp.int32))),
    ("vmap_complex", lambda a, b: jax.vmap(lambda t: one(t)[0])(cat(a, b) * (1 + 0j))),
    ("nested_jit", lambda a, b: one(jax.jit(cat)(a, b))[0]),
    ("cond", lambda a, b: jax.lax.cond(a[0, 0, 0] < 1, lambda: one(cat(a, b))[0],
                                       lambda: jnp.zeros((2, 2, 3)))),
]:
    got = jax.jit(f)(x, y)
    got = got[1] if isinstance(got, (list, tuple)) else got
    ref = 2 * np.stack([x, y]) if name == "stack" else want
    np.testing.assert_allclose(np.asarray(got), ref, err_msg=name)
    print(name, "ok")
# the operand guard of batched calls on jaxlib < 0.8 is exact
special = jnp.array([1e-45, -0.0, np.inf, -np.inf, np.nan, 3.4e38], jnp.float32)
def copy(out, args, kd):
    out[0][...] = args[0]
ident = jaxbind.get_linear_call(copy, copy, spec(1), spec(1), name="root.copy")
got = jax.jit(jax.vmap(lambda t: ident(t)[0]))(jnp.stack([special, special]))
assert np.asarray(got).tobytes() == np.asarray(jnp.stack([special, special])).tobytes()
print("special ok")
# around XLA's 256 KiB bound: just under it (aborted), and large operands, which
# batched calls take unguarded
for rows in (8191, 8192, 1 << 16):
    a = jnp.ones((4, rows), jnp.float32)
    for t in (jnp.float32, jnp.int32):
        got = jax.jit(jax.vmap(lambda v: one(v)[0]))(cat(a.astype(t), a.astype(t)))
        np.testing.assert_array_equal(np.asarray(got), 2 * np.ones((4, 2 * rows), t))
big = jnp.ones((4, 1 << 16), jnp.float32)
hlo = jax.jit(jax.vmap(lambda v: one(v)[0])).lower(big).compile().as_text()
assert "reduce-precision" not in hlo
print("sizes ok")
"""


def test_a_concatenate_feeding_the_programs_root_call_compiles():
    """jaxlib 0.7's CPU compiler aborted the process on these programs (see _lowering)."""
    proc = run_python("-c", _ROOT_CALL_PROGRAMS, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = (
        "one",
        "two",
        "alias",
        "effect",
        "ordered",
        "stack",
        "complex",
        "transpose",
        "vmap",
        "vmap_int",
        "vmap_complex",
        "nested_jit",
        "cond",
        "special",
        "sizes",
    )
    assert proc.stdout.split() == [w for n in names for w in (n, "ok")]
