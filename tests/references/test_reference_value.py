"""A reference is one value, `jaxbind.Reference`: its function, the tolerance of an
approximate native body, and the platforms where it is preferred, given as ``reference=``
in both APIs or to ``@op.def_reference``. The older spellings (a plain function,
``prefer_reference=``, a function's ``tolerance`` attribute) make the same value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_ops as ro

import jaxbind
from jaxbind import _definition

A = jnp.linspace(0.1, 1.0, 5, dtype=jnp.float32)
X = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
M = jnp.ones((4, 2), jnp.float32)


def _matvec(name: str, reference, **options):
    return jaxbind.get_linear_call(
        ro._matvec, ro._matvec_T, ro._matvec_abstract, ro._matvec_abstract_T,
        reference=reference, name=name, replace=True, **options,
    )  # fmt: skip


def _lowered_natively(op, *args) -> bool:
    return "stablehlo.custom_call" in jax.jit(lambda *a: op(*a)[0]).lower(*args).as_text()


def test_platforms_of_the_value_choose_the_reference_as_prefer_reference_does():
    value = _matvec("tests.refvalue.value", jaxbind.Reference(ro.matvec_ref, platforms=("cpu",)))
    option = _matvec("tests.refvalue.option", ro.matvec_ref, prefer_reference=("cpu",))
    plain = _matvec("tests.refvalue.plain", ro.matvec_ref)
    assert value.binding.reference == option.binding.reference
    assert value.binding.reference.platforms == ("cpu",)
    assert not _lowered_natively(value, M, A[:2]) and not _lowered_natively(option, M, A[:2])
    assert _lowered_natively(plain, M, A[:2])
    np.testing.assert_allclose(value(M, A[:2])[0], plain(M, A[:2])[0], rtol=1e-6)


def test_the_same_platforms_stated_twice_are_one_statement_and_other_ones_an_error():
    same = _matvec(
        "tests.refvalue.twice",
        jaxbind.Reference(ro.matvec_ref, platforms="cpu"),
        prefer_reference=("cpu",),
    )
    assert same.binding.reference.platforms == ("cpu",)
    with pytest.raises(ValueError, match="'tests.refvalue.conflict': prefer_reference="):
        _matvec(
            "tests.refvalue.conflict",
            jaxbind.Reference(ro.matvec_ref, platforms=("cuda",)),
            prefer_reference=("cpu",),
        )


def test_a_tolerance_attribute_of_the_function_is_read_once_into_the_value():
    def ref(a, x):
        return ro.matvec_ref(a, x)

    ref.tolerance = lambda **kw: 0.25  # the older spelling
    op = _matvec("tests.refvalue.attribute", ref)
    ref.tolerance = lambda **kw: 0.5  # read once: the op keeps what it was given
    assert op.binding.reference.tolerance_for({}) == 0.25
    given = _matvec("tests.refvalue.given", jaxbind.Reference(ro.matvec_ref, tolerance=1e-3))
    assert given.binding.reference.tolerance_for({"epsilon": 1.0}) == 1e-3
    assert _matvec("tests.refvalue.none", ro.matvec_ref).binding.reference.tolerance_for({}) is None


def test_the_definition_record_is_the_functions_whatever_the_spelling():
    """A program inlines the function; a Reference of it is the same inlined code."""
    plain = _matvec("tests.refvalue.record", ro.matvec_ref)
    before = _definition.inlined(plain.binding)
    wrapped = _matvec(
        "tests.refvalue.record", jaxbind.Reference(ro.matvec_ref, tolerance=0.1, platforms="cpu")
    )
    assert _definition.inlined(wrapped.binding) == before is not None


def test_the_native_api_takes_the_value_in_the_decorator_and_in_def_reference():
    shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)

    @jaxbind.nonlinear_op(
        shape=shape,
        reference=jaxbind.Reference(lambda x: jnp.sin(x), platforms=("cpu",)),
        name="tests.refvalue.native",
        replace=True,
    )
    def given(x):
        return np.sin(x)

    assert given.binding.reference.platforms == ("cpu",)
    assert "stablehlo.custom_call" not in jax.jit(given).lower(A).as_text()

    @jaxbind.nonlinear_op(
        shape=shape, prefer_reference="cpu", name="tests.refvalue.later", replace=True
    )
    def later(x):
        return np.sin(x)

    later.def_reference(jaxbind.Reference(lambda x: jnp.sin(x), tolerance=0.01))
    assert later.binding.reference.platforms == ("cpu",)
    assert later.binding.reference.tolerance_for({}) == 0.01
    np.testing.assert_allclose(later(A), np.sin(A), rtol=1e-6)


def test_a_decorated_op_that_prefers_a_reference_it_never_got_is_refused_at_its_first_call():
    @jaxbind.nonlinear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        prefer_reference=("cpu",),
        name="tests.refvalue.never",
        replace=True,
    )
    def never(x):
        return np.sin(x)

    with pytest.raises(TypeError, match="'tests.refvalue.never' has prefer_reference"):
        never(A)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"function": 3}, TypeError, "function must be a JAX function"),
        ({"function": jnp.sin, "tolerance": -1.0}, TypeError, "tolerance must be"),
        ({"function": jnp.sin, "tolerance": "3"}, TypeError, "tolerance must be"),
        ({"function": jnp.sin, "platforms": ("tpu",)}, ValueError, "platforms must be"),
        (
            {"function": jaxbind.Reference(jnp.sin)},
            TypeError,
            "function is a Reference already",
        ),
    ],
    ids=["not-callable", "negative", "text", "tpu", "nested"],
)
def test_a_bad_value_is_refused_when_made_saying_what_it_takes(kwargs, error, match):
    function = kwargs.pop("function")
    with pytest.raises(error, match=f"jaxbind.Reference: {match}"):
        jaxbind.Reference(function, **kwargs)


def test_the_value_is_frozen_callable_and_pickles():
    import pickle

    value = jaxbind.Reference(ro.matvec_ref, tolerance=0.5, platforms=["cuda", "cpu", "cpu"])
    assert value.platforms == ("cpu", "cuda")
    with pytest.raises(AttributeError, match="frozen"):
        value.tolerance = 1.0
    np.testing.assert_allclose(value(M, A[:2]), ro.matvec_ref(M, A[:2]))
    assert pickle.loads(pickle.dumps(value)) == value
    assert "platforms=('cpu', 'cuda')" in repr(value)
