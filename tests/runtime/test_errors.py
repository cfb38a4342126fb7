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
            r"returned \(\(3,\), .*\); it must return a tuple with one \(shape, dtype\).*"
            r"put it in a tuple of outputs, \(\(shape, dtype\),\)",
        ),
        (  # the same, two-dimensional: once read as a shape 3 and a dtype 3
            ((3, 3), np.float32),
            r"returned \(\(3, 3\), .*\); it must return a tuple with one \(shape, dtype\).*"
            r"e\.g\. return \(\(x\.shape, x\.dtype\),\)",
        ),
        ((((3, np.float32)),), r"output 0 has shape 3, .* write \(3,\) for one dimension"),
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
    assert (
        "the abstract function of 'reference_ops._matvec' takes 2 positional arguments "
        "(its parameters: (a, x, **kwargs)), but the call passes 3" in str(info.value)
    )


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


# --- errors a newcomer meets: each says what was expected, what came, and what to write ----

X32 = jnp.arange(3.0, dtype=jnp.float32)


def _complex_fft(x):
    return np.fft.fft(x)


def _float_shape(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_complex_result_where_float_is_declared_says_both_fixes(jit):
    op = jaxbind.linear_op(shape=_float_shape, name=f"tests.complex_for_float_{jit}")(_complex_fft)
    call = jax.jit(op) if jit else op
    with pytest.raises(Exception) as info:
        jax.block_until_ready(call(X32))
    text = str(info.value)
    assert f"'tests.complex_for_float_{jit}' (the function)" in text
    assert "returned output 0 as complex64, where the shape function declares float32" in text
    assert "np.real(...)" in text and "jax.ShapeDtypeStruct(x.shape, np.complex64)" in text
    assert "according to the rule 'same_kind'" not in text  # NumPy's own words


def test_complex_cotangent_for_a_float_argument_says_to_return_float():
    op = jaxbind.linear_op(shape=_float_shape, name="tests.complex_cotangent")(lambda x: 2 * x)
    op.def_transpose(_complex_fft)
    with pytest.raises(Exception) as info:
        jax.block_until_ready(jax.grad(lambda x: op(x).sum())(X32))
    text = str(info.value)
    assert "'tests.complex_cotangent' (the transpose)" in text
    assert "returned output 0 as complex64" in text and "return float32 values" in text
    assert "declare complex64" not in text  # its shapes are the primals': nothing to declare


def _assigns_out(out, args, kwargs_dump):
    out[0] = 2 * args[0]


def _assigns_a_tuple(out, args, kwargs_dump):
    shape = tuple(args[0].shape)
    shape[0] = 1  # a tuple of its own: no hint about outputs


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_item_assignment_into_out_says_to_write_in_place(jit):
    op = jaxbind.get_linear_call(
        _assigns_out, None, same_as_first, name=f"tests.out_assigned_{jit}"
    )
    call = jax.jit(lambda x: op(x)) if jit else op
    with pytest.raises(Exception) as info:
        jax.block_until_ready(call(X32))
    text = str(info.value)
    assert f"'tests.out_assigned_{jit}' (the function) raised TypeError" in text
    assert "write into the array in place instead: out[0][...] = ..." in text


def test_item_assignment_into_the_native_out_argument_says_to_write_in_place():
    def halves(x, out):
        out[1] = x / 2

    op = jaxbind.linear_op(shape=lambda x: (_float_shape(x),) * 2, name="tests.out_native")(halves)
    with pytest.raises(Exception) as info:
        jax.block_until_ready(op(X32))
    assert "out[1][...] = ..." in str(info.value)


def test_item_assignment_into_another_tuple_gets_no_hint_about_outputs():
    op = jaxbind.get_linear_call(_assigns_a_tuple, None, same_as_first, name="tests.own_tuple")
    with pytest.raises(Exception) as info:
        jax.block_until_ready(op(X32))
    assert "does not support item assignment" in str(info.value)
    assert "[...] = ..." not in str(info.value)


def test_kernel_parameters_out_of_order_say_which_got_what():
    """The transpose of docs/kernels.md's matvec with its parameters out of order: numba
    alone says "tuple index out of range" (a.shape[1] of the 1-d output)."""
    pytest.importorskip("numba")

    @jaxbind.kernel
    def matvec(y, a, x):
        for i in range(a.shape[0]):
            y[i] = 0.0
            for j in range(a.shape[1]):
                y[i] += a[i, j] * x[j]

    @jaxbind.kernel
    def matvec_T(a, y_ct, x_ct):  # its output belongs first: (x_ct, a, y_ct)
        for j in range(a.shape[1]):
            acc = 0.0
            for i in range(a.shape[0]):
                acc += a[i, j] * y_ct[i]
            x_ct[j] = acc

    op = jaxbind.get_linear_call(
        matvec,
        matvec_T,
        lambda a, x: (((a.shape[0],), x.dtype),),
        lambda a, ct: (((a.shape[1],), ct.dtype),),
        first_n_args_fixed=1,
        name="tests.kernel_order",
    )
    with pytest.raises(Exception) as info:
        jax.grad(lambda x: op(jnp.ones((2, 3)), x)[0].sum())(jnp.ones(3))
    text = str(info.value)
    assert "'tests.kernel_order' (the transpose)" in text
    assert "Its parameters got a = output 0, y_ct = input 0, x_ct = input 1" in text
    assert "a kernel takes its role's outputs first, then its inputs" in text


def test_an_unnamed_kernel_op_is_named_after_its_function():
    """Not after the kernel's class: errors about it said 'jaxbind._kernels.Kernel'."""
    pytest.importorskip("numba")

    @jaxbind.kernel
    def twice_kernel(out, x):
        for i in range(x.size):
            out.flat[i] = 2 * x.flat[i]

    op = jaxbind.get_linear_call(twice_kernel, twice_kernel, same_as_first)
    assert op.name.startswith(f"{__name__}.test_an_unnamed_kernel_op_is_named_after_its_function")
    assert op.name.split("#")[0].endswith(".twice_kernel")
    native = jaxbind.linear_op(shape=_float_shape)(twice_kernel)
    assert native.name.split("#")[0].endswith(".twice_kernel")
