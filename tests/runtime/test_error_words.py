"""Every error speaks the API the user wrote.

Each case makes the same mistake once with the pytree API (decorators, ``def_*``,
``fixed=``, ``vectorized=``, shape functions) and once with JAXbind's
(``get_linear_call``/``get_nonlinear_call``, ``first_n_args_fixed``, ``func_can_batch``,
abstract functions). The message must name the fix in that API's words, and never a
word of the other.
"""

import itertools
import re
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import copy_last, same_as_last

import jaxbind

_counter = itertools.count()

# Words that belong to one API only: a message about an op of the other must not use them.
NATIVE_ONLY = [
    r"def_transpose",
    r"def_jvp",
    r"def_vjp",
    r"\bvectorized\b",
    r"\bfixed=",
    r"shape function",
    r"linear_op",
    r"out= argument",
]
CALLS_ONLY = [
    r"first_n_args_fixed",
    r"func_can_batch",
    r"get_linear_call",
    r"get_nonlinear_call",
    r"abstract function",
    r"\bf_T\b",
    r"\bf_jvp\b",
    r"\bf_vjp\b",
    r"out\[k\]",
]


def _name(what):
    return f"tests.words.{what}{next(_counter)}"


def _text(info) -> str:
    """The whole message, with its notes (where jaxbind names the binding for user errors)."""
    return "".join(traceback.format_exception_only(info.value))


def _speaks(text: str, api: str, expected: list[str]) -> None:
    for pattern in expected:
        assert re.search(pattern, text), (pattern, text)
    for pattern in NATIVE_ONLY if api == "calls" else CALLS_ONLY:
        assert not re.search(pattern, text), (pattern, text)


def _sds(x, *rest, **kwargs):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _last_sds(*args, **kwargs):
    return jax.ShapeDtypeStruct(args[-1].shape, args[-1].dtype)


X = jnp.arange(3.0)


# --- each mistake, made with each API -------------------------------------------------------


def _no_transpose(api):
    if api == "native":
        op = jaxbind.linear_op(shape=_sds, name=_name("lin"))(lambda x: 2 * x)
        return lambda: jax.grad(lambda x: op(x).sum())(X)
    op = jaxbind.get_linear_call(copy_last, None, same_as_last, name=_name("lin"))
    return lambda: jax.grad(lambda x: op(x)[0].sum())(X)


def _no_multilinear_transpose(api):
    if api == "native":
        op = jaxbind.multilinear_op(shape=_sds, name=_name("bil"))(lambda a, b: a * b)
        op.def_transpose(argnum=0)(lambda b, ct: ct * b)
        return lambda: jax.grad(lambda b: op(X, b).sum())(X)

    def f(out, args, kd):
        out[0][...] = args[0] * args[1]

    op = jaxbind.get_linear_call(f, (f, None), same_as_last, name=_name("bil"))
    return lambda: jax.grad(lambda b: op(X, b)[0].sum())(X)


def _no_jvp(api):
    if api == "native":
        op = jaxbind.nonlinear_op(shape=_sds, name=_name("sin"))(np.sin)
        op.def_vjp(lambda p, c: (np.cos(p[0]) * c,))
        return lambda: jax.jvp(op, (X,), (X,))

    def f(out, args, kd):
        out[0][...] = np.sin(args[0])

    def vjp(out, args, kd):
        out[0][...] = np.cos(args[0]) * args[1]

    op = jaxbind.get_nonlinear_call(f, (None, vjp), same_as_last, name=_name("sin"))
    return lambda: jax.jvp(lambda x: op(x)[0], (X,), (X,))


def _second_order(api):
    if api == "native":
        op = jaxbind.nonlinear_op(shape=_sds, name=_name("sin"))(np.sin)
        op.def_jvp(lambda p, t: np.cos(p[0]) * t[0])
        op.def_vjp(lambda p, c: (np.cos(p[0]) * c,))
        return lambda: jax.hessian(lambda x: op(x).sum())(X)

    def f(out, args, kd):
        out[0][...] = np.sin(args[0])

    def jvp(out, args, kd):
        out[0][...] = np.cos(args[0]) * args[1]

    op = jaxbind.get_nonlinear_call(f, (jvp, jvp), same_as_last, name=_name("sin"))
    return lambda: jax.hessian(lambda x: op(x)[0].sum())(X)


def _fixed_differentiated(api):
    if api == "native":
        op = jaxbind.linear_op(shape=_last_sds, fixed=1, name=_name("scale"))(lambda a, x: a * x)
        op.def_transpose(lambda a, ct: a * ct)
        return lambda: jax.grad(lambda a: op(a, X).sum())(X)

    def f(out, args, kd):
        out[0][...] = args[0] * args[1]

    op = jaxbind.get_linear_call(f, f, same_as_last, first_n_args_fixed=1, name=_name("scale"))
    return lambda: jax.grad(lambda a: op(a, X)[0].sum())(X)


def _only_fixed_arguments(api):
    if api == "native":
        op = jaxbind.linear_op(shape=_last_sds, fixed=1, name=_name("scale"))(lambda a, x: a * x)
        return lambda: op(X)
    op = jaxbind.get_linear_call(
        copy_last, None, same_as_last, first_n_args_fixed=1, name=_name("scale")
    )
    return lambda: op(X)


@jaxbind.kernel
def _copy_kernel(out, x):
    for i in range(x.size):
        out.flat[i] = x.flat[i]


def _kernel_vectorized(api):
    if api == "native":
        return lambda: jaxbind.linear_op(shape=_sds, vectorized=True, name=_name("k"))(_copy_kernel)
    return lambda: jaxbind.get_linear_call(
        _copy_kernel, None, same_as_last, func_can_batch=True, name=_name("k")
    )


def _generator_transpose(api):
    def gen(*args, **kwargs):
        yield

    if api == "native":
        op = jaxbind.linear_op(shape=_sds, name=_name("gen"))(lambda x: x)
        return lambda: op.def_transpose(gen)
    return lambda: jaxbind.get_linear_call(copy_last, gen, same_as_last, name=_name("gen"))


def _shapes_raise(api):
    def shapes(x, **kwargs):
        raise ValueError("no shapes today")

    if api == "native":
        op = jaxbind.linear_op(shape=shapes, name=_name("raise"))(lambda x: x)
        return lambda: op(X)
    op = jaxbind.get_linear_call(copy_last, None, shapes, name=_name("raise"))
    return lambda: op(X)


def _no_outputs(api):
    if api == "native":
        op = jaxbind.linear_op(shape=lambda x: None, name=_name("none"))(lambda x: None)
        return lambda: op(X)
    op = jaxbind.get_linear_call(copy_last, None, lambda x: (), name=_name("none"))
    return lambda: op(X)


def _keyword_not_in_shapes(api):
    """The docs' shape-lambda style, without **kwargs, and a keyword argument in the call."""
    if api == "native":
        op = jaxbind.linear_op(shape=lambda x: _sds(x), name=_name("kw"))(
            lambda x, factr=1.0: factr * x
        )
        return lambda: op(X, factr=2.0)
    op = jaxbind.get_linear_call(copy_last, None, lambda x: ((x.shape, x.dtype),), name=_name("kw"))
    return lambda: op(X, factr=2.0)


def _keyword_missing_from_call(api):
    def shapes(x, *, n):
        return _sds(x) if api == "native" else ((x.shape, x.dtype),)

    if api == "native":
        op = jaxbind.linear_op(shape=shapes, name=_name("kwonly"))(lambda x, *, n: n * x)
        return lambda: op(X)
    op = jaxbind.get_linear_call(copy_last, None, shapes, name=_name("kwonly"))
    return lambda: op(X)


def _too_many_arguments(api):
    if api == "native":
        op = jaxbind.nonlinear_op(shape=lambda x: _sds(x), name=_name("args"))(lambda x, y: x * y)
        return lambda: op(X, X)
    op = jaxbind.get_nonlinear_call(
        copy_last, (None, None), lambda x: ((x.shape, x.dtype),), name=_name("args")
    )
    return lambda: op(X, X)


CASES = {
    "grad without a transpose": (
        _no_transpose,
        NotImplementedError,
        {"native": [r"@op\.def_transpose"], "calls": [r"get_linear_call as f_T"]},
    ),
    "grad without one transpose of a multilinear op": (
        _no_multilinear_transpose,
        NotImplementedError,
        {
            "native": [r"def_transpose\(argnum=1\)"],
            "calls": [r"get_linear_call as f_T\[1\]"],
        },
    ),
    "jvp without a JVP": (
        _no_jvp,
        NotImplementedError,
        {"native": [r"@op\.def_jvp"], "calls": [r"get_nonlinear_call as f_jvp"]},
    ),
    "a Hessian with callable derivatives": (
        _second_order,
        NotImplementedError,
        {
            "native": [r"@op\.def_jvp", r"@op\.def_vjp", r"jaxbind\.jax_function"],
            "calls": [r"get_nonlinear_call", r"f_jvp and f_vjp", r"jaxbind\.jax_function"],
        },
    ),
    "grad of a fixed argument": (
        _fixed_differentiated,
        TypeError,
        {"native": [r"argument 0 is fixed \(fixed=1\)"], "calls": [r"first_n_args_fixed=1"]},
    ),
    "only fixed arguments": (
        _only_fixed_arguments,
        TypeError,
        {"native": [r"\bfixed=1"], "calls": [r"first_n_args_fixed=1"]},
    ),
    "kernels with vectorized batching": (
        _kernel_vectorized,
        TypeError,
        {"native": [r"vectorized=True"], "calls": [r"func_can_batch=True"]},
    ),
    "a generator as transpose": (
        _generator_transpose,
        TypeError,
        {"native": [r"generator", r"out= argument"], "calls": [r"generator", r"out\[k\]"]},
    ),
    "the shapes fail": (
        _shapes_raise,
        ValueError,
        {"native": [r"the shape function of '"], "calls": [r"the abstract function of '"]},
    ),
    "a keyword argument the shape function does not take": (
        _keyword_not_in_shapes,
        TypeError,
        {
            "native": [
                r"the shape function of '[\w.]+' does not take the keyword argument 'factr'",
                r"its parameters: \(x\)",
                r"write shape=lambda x, \*\*kwargs: \.\.\.",
            ],
            "calls": [
                r"the abstract function of '[\w.]+' does not take the keyword argument 'factr'",
                r"its parameters: \(x\)",
                r"write lambda x, \*\*kwargs: \.\.\.",
            ],
        },
    ),
    "a keyword argument the shape function requires": (
        _keyword_missing_from_call,
        TypeError,
        {
            "native": [r"the shape function of '[\w.]+' requires the keyword argument n=\.\.\."],
            "calls": [r"the abstract function of '[\w.]+' requires the keyword argument n=\.\.\."],
        },
    ),
    "more arguments than the shape function takes": (
        _too_many_arguments,
        TypeError,
        {
            "native": [r"the shape function of '[\w.]+' takes 1 positional argument \(its"],
            "calls": [r"the abstract function of '[\w.]+' takes 1 positional argument \(its"],
        },
    ),
    "no outputs and no effect": (
        _no_outputs,
        TypeError,
        {
            "native": [r"shape function returned None", r"no outputs"],
            "calls": [r"abstract function of '.*' declares no outputs", r"has_side_effect"],
        },
    ),
}


@pytest.mark.parametrize("api", ["native", "calls"])
@pytest.mark.parametrize("case", list(CASES))
def test_error_speaks_the_api_used(case, api):
    make, error, expected = CASES[case]
    with pytest.raises(error) as info:
        make(api)()
    text = _text(info)
    assert re.search(r"'tests\.words\.\w+'", text), text  # names the binding
    _speaks(text, api, expected[api])


def _named_shapes(x):
    return _sds(x)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_shape_function_that_refuses_a_keyword_is_named_whatever_its_signature(jit):
    """Not the body: the shape function, a def here, named as the user wrote it."""
    name = _name("kwdef")
    op = jaxbind.linear_op(shape=_named_shapes, name=name)(lambda x, factr=1.0: factr * x)
    call = jax.jit(lambda x: op(x, factr=2.0)) if jit else (lambda x: op(x, factr=2.0))
    with pytest.raises(TypeError) as info:
        call(X)
    text = _text(info)
    assert f"the shape function of '{name}' does not take the keyword argument 'factr'" in text
    assert "write def _named_shapes(x, **kwargs): ..." in text
    assert "<lambda>()" not in text
    _speaks(text, "native", [])


def test_a_type_error_inside_the_shape_function_is_still_its_own():
    """Its parameters take the call: the error is the function's, with the op in a note."""
    name = _name("inside")
    op = jaxbind.linear_op(shape=lambda x: _sds(x.shape), name=name)(lambda x: x)
    with pytest.raises(AttributeError) as info:
        op(X)
    assert f"the shape function of '{name}' failed" in _text(info)


BODY_KEYWORD_ROLES = {
    "the function": lambda op: op(X, factor=2.0),
    "the transpose": lambda op: jax.grad(lambda x: op(x, factor=2.0).sum())(X),
}


@pytest.mark.parametrize("role", list(BODY_KEYWORD_ROLES))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_body_that_refuses_a_keyword_is_named_at_trace_time(role, jit):
    """The shape function takes **kwargs, a body does not: a TypeError before the program
    runs, naming the role and the line to write, not the callable's own TypeError."""
    name = _name("body")

    def takes(x, **kwargs):
        return 2 * x

    def refuses(x):
        return 2 * x

    op = jaxbind.linear_op(shape=_sds, name=name)(refuses if role == "the function" else takes)
    op.def_transpose(takes if role == "the function" else refuses)
    run = BODY_KEYWORD_ROLES[role]
    with pytest.raises(TypeError) as info:
        jax.jit(lambda x: run(op))(X) if jit else run(op)
    text = _text(info)
    assert f"'{name}' ({role}) does not take the keyword argument 'factor'" in text
    assert "write def refuses(x, **kwargs): ..." in text
    _speaks(text, "native", [r"\*\*kwargs"])


def test_jvp_that_refuses_a_keyword_is_named():
    name = _name("jvp")
    op = jaxbind.nonlinear_op(shape=lambda x, *, n: _sds(x), name=name)(lambda x, *, n: n * x)
    op.def_jvp(lambda primals, tangents: tangents[0])
    with pytest.raises(TypeError) as info:
        jax.jvp(lambda x: op(x, n=2.0), (X,), (X,))
    text = _text(info)
    assert f"'{name}' (the JVP) does not take the keyword argument 'n'" in text
    assert "lambda primals, tangents, **kwargs: ..." in text


# --- the shape function's mistakes (pytree API) -----------------------------------------

SHAPE_MISTAKES = {
    "JAXbind 1.3's form": (lambda x: ((x.shape, x.dtype),), r"JAXbind 1\.3's form"),
    "a bare (shape, dtype)": (lambda x: (x.shape, x.dtype), r"for \(shape, dtype\), write"),
    "None": (lambda x: None, r"returned None \(no outputs"),
    "an int": (lambda x: 3, r"returned 3\."),
    "a shape alone": (lambda x: x.shape, r"returned \(3,\)"),
    "a dict with a dtype": (lambda x: {"y": x.dtype}, r"returned \{'y': dtype"),
}


@pytest.mark.parametrize("mistake", list(SHAPE_MISTAKES))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_shape_function_mistakes_are_the_shape_functions(mistake, jit):
    shape, said = SHAPE_MISTAKES[mistake]
    name = _name("shape")
    op = jaxbind.linear_op(shape=shape, name=name)(lambda x: x)
    call = jax.jit(op) if jit else op
    with pytest.raises(TypeError) as info:
        call(X)
    text = _text(info)
    assert f"'{name}': the shape function returned" in text
    assert re.search(said, text), text
    assert "must return a jax.ShapeDtypeStruct" in text
    _speaks(text, "native", [])


def test_shape_function_may_return_arrays_and_pytrees():
    """Anything with a tuple shape and a dtype is a shape, as for jax.pure_callback."""
    op = jaxbind.linear_op(shape=lambda x: np.zeros(x.shape, x.dtype), name=_name("arr"))(
        lambda x: 2 * x
    )
    np.testing.assert_array_equal(op(X), 2 * X)
    op = jaxbind.linear_op(shape=lambda x: {"a": _sds(x), "b": [_sds(x)]}, name=_name("tree"))(
        lambda x: {"a": x, "b": [3 * x]}
    )
    out = op(X)
    np.testing.assert_array_equal(out["b"][0], 3 * X)


def test_shape_function_without_outputs_for_an_effect():
    """An op with a side effect may declare no outputs: it is called for the effect."""
    seen = []

    def record(x):
        seen.append(float(np.sum(x)))

    op = jaxbind.linear_op(shape=lambda x: None, has_side_effect=True, name=_name("log"))(record)
    assert op(X) is None
    jax.jit(lambda x: op(x))(X)
    jax.effects_barrier()
    assert seen == [3.0, 3.0]


# --- the abstract function's mistakes (JAXbind's API) ---------------------------------------

ABSTRACT_MISTAKES = {
    "the decorators' form": (
        lambda x, **kw: (jax.ShapeDtypeStruct(x.shape, x.dtype),),
        r"jax\.ShapeDtypeStruct is how the shape functions",
    ),
    "one bare jax.ShapeDtypeStruct": (
        lambda x, **kw: jax.ShapeDtypeStruct(x.shape, x.dtype),
        r"jax\.ShapeDtypeStruct is how the shape functions",
    ),
    "a bare (shape, dtype)": (
        lambda x, **kw: (x.shape, x.dtype),
        r"put it in a tuple of outputs, \(\(shape, dtype\),\)",
    ),
    "a bare (shape, dtype) of two dimensions": (
        lambda x, **kw: ((3, 3), x.dtype),
        r"\(\(3, 3\), dtype\('float32'\)\); it must .* put it in a tuple of outputs",
    ),
    "None": (lambda x, **kw: None, r"returned None"),
}


@pytest.mark.parametrize("mistake", list(ABSTRACT_MISTAKES))
def test_abstract_function_mistakes(mistake):
    abstract, said = ABSTRACT_MISTAKES[mistake]
    name = _name("abstract")
    op = jaxbind.get_linear_call(copy_last, None, abstract, name=name)
    with pytest.raises(TypeError) as info:
        op(X)
    text = _text(info)
    assert f"the abstract function of '{name}'" in text
    assert re.search(said, text), text
    assert "must return a tuple with one (shape, dtype)" in text
