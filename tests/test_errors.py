"""Bad inputs and failing callables give clear errors naming the binding; the process survives."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_ops import matvec
from support.ops import same_as_first

import jaxbind


def _fails(out, args, kwargs_dump):
    if jaxbind.load_kwargs(kwargs_dump).get("fail", True):
        raise ValueError("the kernel rejected its input")
    out[0][...] = args[0]


failing = jaxbind.get_linear_call(_fails, None, same_as_first, None, name="tests.failing_kernel")


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_callback_exception_becomes_python_error(jit):
    fn = (
        jax.jit(lambda x, **k: failing(x, **k)[0], static_argnames="fail")
        if jit
        else (lambda x, **k: failing(x, **k)[0])
    )
    x = jnp.arange(3.0)
    for _ in range(3):  # the process survives, and keeps failing cleanly
        with pytest.raises(Exception) as info:
            jax.block_until_ready(fn(x))
        text = str(info.value)
        assert "'tests.failing_kernel'" in text
        assert "ValueError: the kernel rejected its input" in text
        assert "in _fails" in text  # the callable's traceback
    np.testing.assert_array_equal(fn(x, fail=False), x)  # later calls work


def test_exception_inside_grad_names_the_transpose():
    def f_T(out, args, kwargs_dump):
        raise KeyError("no adjoint today")

    op = jaxbind.get_linear_call(
        lambda out, args, kd: out[0].__setitem__(..., args[0]),
        f_T,
        same_as_first,
        same_as_first,
        name="tests.bad_transpose",
    )
    with pytest.raises(Exception, match=r"'tests.bad_transpose' \(the transpose\) raised KeyError"):
        jax.grad(lambda x: jnp.sum(op(x)[0]))(jnp.ones(3))


@pytest.mark.parametrize(
    "result, match",
    [
        (None, "returned None; it must return a tuple"),
        (
            ((3,), np.float32),
            r"whose output 0 is \(3,\); it must return a tuple with one \(shape, dtype\)",
        ),
        ((((3,), "not a dtype"),), "output 0 has dtype 'not a dtype'"),
        ((((-1, 3), np.float32),), "negative dimensions"),
        ((((3.5,), np.float32),), "not a tuple of integers"),
        ((((3,), np.dtype("O")),), "has dtype object"),
    ],
)
def test_bad_abstract_result_is_a_clear_error(result, match):
    op = jaxbind.get_linear_call(
        _fails, None, lambda x: result, None, name=f"tests.bad_abstract_{abs(hash(repr(result)))}"
    )
    with pytest.raises((TypeError, ValueError), match=match) as info:
        jax.jit(lambda x: op(x))(jnp.ones(3))
    assert "abstract function of 'tests.bad_abstract" in str(info.value)


def test_bad_out_batch_axis_is_a_clear_error():
    for axis, match in (
        (7, "out_batch_axis 7, outside its 2 dimensions"),
        ((), r"out_batch_axis \(\); when batch_axes is set it must be an integer"),
    ):
        op = jaxbind.get_linear_call(
            _fails,
            None,
            lambda x, axis=axis, **k: ((x.shape, x.dtype, axis),),
            None,
            func_can_batch=True,
            name=f"tests.bad_axis_{axis}",
        )
        with pytest.raises(TypeError if axis == () else ValueError, match=match):
            jax.vmap(lambda x: op(x)[0])(jnp.ones((2, 3)))


def test_unbatched_out_batch_axis_is_ignored_as_in_jaxbind13():
    def f(out, args, kwargs_dump):
        out[0][...] = 2 * args[0]

    def abstract(x, **kwargs):
        ba = kwargs.get("batch_axes")
        return ((x.shape, x.dtype, ba[0][-1] if ba else ()),)

    op = jaxbind.get_linear_call(
        f, f, abstract, abstract, func_can_batch=True, name="tests.jaxbind13_style"
    )
    np.testing.assert_array_equal(op(jnp.ones(3))[0], 2 * np.ones(3))
    np.testing.assert_array_equal(
        jax.vmap(lambda x: op(x)[0])(jnp.ones((2, 3))), 2 * np.ones((2, 3))
    )


def test_abstract_function_failure_names_the_binding():
    with pytest.raises(IndexError) as info:  # the abstract function indexes a.shape[0]
        jax.jit(lambda a, x: matvec(a, x))(jnp.ones(()), jnp.ones(3))
    assert "abstract function of 'reference_ops._matvec'" in info.value.__notes__[0]


def test_wrong_argument_count():
    with pytest.raises(
        TypeError,
        match=r"'reference_ops._matvec' got 1 positional arguments "
        r"but has first_n_args_fixed=1",
    ):
        matvec(jnp.ones((2, 2)))
    with pytest.raises(TypeError) as info:
        matvec(jnp.ones((2, 2)), jnp.ones(2), jnp.ones(2))
    assert "'reference_ops._matvec'" in info.value.__notes__[0]


def test_traced_keyword_argument_is_rejected():
    with pytest.raises(TypeError, match="keyword argument 'fail' is a JAX array or tracer"):
        jax.jit(lambda x, s: failing(x, fail=s))(jnp.ones(3), jnp.ones(()))


def test_unpicklable_keyword_argument_is_rejected():
    with pytest.raises(TypeError, match="keyword arguments must be plain data or picklable"):
        failing(jnp.ones(3), fail=lambda: None)


def test_reserved_batch_axes_keyword():
    op = jaxbind.get_linear_call(
        _fails,
        None,
        lambda x, **k: ((x.shape, x.dtype, 0),),
        None,
        func_can_batch=True,
        name="tests.can_batch",
    )
    with pytest.raises(TypeError, match="'batch_axes' is reserved"):
        op(jnp.ones(3), batch_axes=((0,),))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(f=3), "f must be callable"),
        (dict(abstract=None), "abstract must be callable"),
        (dict(first_n_args_fixed=-1), "first_n_args_fixed must be a non-negative int"),
        (dict(f_T=(None,), abstract_T=(None, None)), "abstract_T must be None or a tuple"),
        (dict(name=""), "name must be a non-empty string"),
    ],
)
def test_bad_construction_arguments(kwargs, match):
    args = dict(f=_fails, f_T=None, abstract=same_as_first, abstract_T=None)
    args.update(kwargs)
    extra = {k: args.pop(k) for k in ("first_n_args_fixed", "name") if k in args}
    with pytest.raises(TypeError, match=match):
        jaxbind.get_linear_call(
            args["f"], args["f_T"], args["abstract"], args["abstract_T"], **extra
        )


def test_explicit_name_clash_is_an_error():
    def other(out, args, kwargs_dump):
        out[0][...] = 0

    with pytest.raises(ValueError, match="'tests.failing_kernel' is already used"):
        jaxbind.get_linear_call(other, None, same_as_first, None, name="tests.failing_kernel")


def test_equal_binding_is_reused():
    again = jaxbind.get_linear_call(_fails, None, same_as_first, None, name="tests.failing_kernel")
    assert again.binding is failing.binding


def test_the_binding_name_shows_in_jaxprs_hlo_metadata_and_attributes():
    jaxpr = jax.make_jaxpr(lambda a, x: matvec(a, x))(jnp.ones((2, 3)), jnp.ones(3))
    assert "jaxbind[spec=reference_ops._matvec:f]" in str(jaxpr)
    lowered = jax.jit(lambda a, x: matvec(a, x)).lower(jnp.ones((2, 3)), jnp.ones(3))
    assert 'binding = "reference_ops._matvec"' in lowered.as_text()
    # op_name, which profilers show: the binding's named scope around the primitive
    assert "/reference_ops._matvec/jaxbind" in lowered.as_text(debug_info=True)
    grad = jax.jit(jax.grad(lambda x: matvec(jnp.ones((2, 3)), x)[0].sum()))
    assert "/reference_ops._matvec/jaxbind" in grad.lower(jnp.ones(3)).as_text(debug_info=True)


def test_bindings_share_one_primitive_and_leave_jax_rule_tables_alone():
    from jax.interpreters import ad, batching, mlir

    batchers = batching.primitive_batchers  # jax 0.12: a proxy of this dict
    batchers = batchers if isinstance(batchers, dict) else batching.fancy_primitive_batchers
    sizes = lambda: (
        len(ad.primitive_jvps),
        len(ad.primitive_transposes),
        len(batchers),
        len(mlir._lowerings),
    )
    before = sizes()
    ops = [
        jaxbind.get_linear_call(
            lambda out, args, kd: None, None, same_as_first, None, name=f"tests.no_tables_{k}"
        )
        for k in range(20)
    ]
    assert all(op.primitive is failing.primitive for op in ops)
    assert failing.primitive.name == "jaxbind"
    del ops
    gc.collect()
    assert sizes() == before
