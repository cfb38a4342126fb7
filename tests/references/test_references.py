"""An op's JAX reference: lowered where the native body cannot run, exported without custom
calls, switched on at run time, and the source of the rules an op does not declare.

The ops here are SciPy's FFT (linear; its transpose is itself) and a nonlinear
elementwise product, each in both APIs, against jax.numpy.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft
from support.processes import refusing_imports, run_python

import jaxbind

X = jnp.asarray(np.random.default_rng(0).standard_normal(8), jnp.float32)
A = jnp.linspace(0.1, 1.0, 5, dtype=jnp.float32)
B = jnp.linspace(-1.0, 2.0, 5, dtype=jnp.float32)

# native bodies run on these; every other platform needs the reference
NATIVE = ("cpu", "cuda")


def _calls() -> dict:
    """How many times each body ran, by name (native bodies count themselves)."""
    return {"fft": 0, "product": 0}


CALLS = _calls()


def _fft_abstract(x, **kw):
    return ((x.shape, jnp.complex64),)


def _fft(out, args, kd):
    CALLS["fft"] += 1
    out[0][...] = scipy.fft.fft(args[0])


def _fft_reference(x):
    return jnp.fft.fft(x.astype(jnp.complex64))


def _product_reference(a, b):
    return jnp.sin(a) * b**2


def fft_13(name="tests.references.fft13", **options):
    """The FFT in the 1.3 API, with no transpose: it is derived from the reference."""
    return jaxbind.get_linear_call(
        _fft,
        None,
        _fft_abstract,
        reference=_fft_reference,
        name=name,
        **options,
    )


def _product(out, args, kd):
    CALLS["product"] += 1
    a, b = args
    out[0][...] = np.sin(a) * b**2


def _product_abstract(a, b):
    return ((a.shape, a.dtype),)


def product_13(name="tests.references.product13", reference=True, **options):
    """A forward-only nonlinear op: JVP and VJP come from the reference."""
    ref = _product_reference if reference else None
    return jaxbind.get_nonlinear_call(
        _product,
        (None, None),
        _product_abstract,
        reference=ref,
        name=name,
        **options,
    )


@jaxbind.nonlinear_op(
    shape=lambda p: jax.ShapeDtypeStruct(p["a"].shape, p["a"].dtype),
    name="tests.references.product_native",
)
def product_native(p):
    CALLS["product"] += 1
    return np.sin(p["a"]) * p["b"] ** 2


@product_native.def_reference
def _product_native_reference(p):
    return jnp.sin(p["a"]) * p["b"] ** 2


def expected_product(a, b):
    return jnp.sin(a) * b**2


# --- lowering per platform ---------------------------------------------------------------


def test_export_for_cpu_cuda_and_tpu_gives_one_artifact_that_runs_the_native_body_on_cpu():
    op = fft_13()
    exported = jaxbind.export(lambda x: op(x)[0], platforms=("cpu", "cuda", "tpu"))(X)
    assert exported.platforms == ("cpu", "cuda", "tpu")
    text = exported.mlir_module()
    assert text.count("stablehlo.custom_call @jaxbind_cpu") == 1
    assert text.count("stablehlo.custom_call @jaxbind_cuda") == 1
    assert "stablehlo.fft" in text  # TPU's branch: the reference
    before = CALLS["fft"]
    got = jax.export.deserialize(exported.serialize()).call(X)
    assert CALLS["fft"] == before + 1  # the CPU branch ran the native body
    np.testing.assert_allclose(got, np.fft.fft(np.asarray(X)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("platform", ["tpu", "rocm"])
def test_platform_without_a_body_lowers_the_reference(platform):
    op = product_13()
    lowered = jax.jit(lambda a, b: op(a, b)[0]).trace(A, B).lower(lowering_platforms=(platform,))
    text = lowered.as_text()
    assert "stablehlo.custom_call" not in text and "sine" in text


def test_op_without_a_reference_names_itself_the_platform_and_the_fix():
    op = product_13(name="tests.references.noref", reference=False)
    with pytest.raises(NotImplementedError) as info:
        jax.jit(lambda a, b: op(a, b)[0]).trace(A, B).lower(lowering_platforms=("cpu", "tpu"))
    message = str(info.value)
    assert "'tests.references.noref'" in message and "tpu" in message
    assert "reference=" in message
    # on CPU alone it lowers as always
    jax.jit(lambda a, b: op(a, b)[0]).trace(A, B).lower(lowering_platforms=("cpu",))


# --- portable export ---------------------------------------------------------------------

# Run in a process where importing jaxbind or ducc0 fails: the artifact needs JAX only.
_LOAD_WITHOUT_JAXBIND = (
    refusing_imports("jaxbind", "ducc0")
    + """
import sys, json, numpy as np, jax, jax.export
blob = open(sys.argv[1], "rb").read()
args = [np.asarray(a, dtype=d) for a, d in json.load(open(sys.argv[2]))]
out = jax.export.deserialize(blob).call(*args)
print(json.dumps([np.asarray(o).tolist() for o in (out if isinstance(out, tuple) else [out])]))
"""
)


def test_portable_artifact_has_no_custom_call_and_runs_where_jaxbind_is_not_installed(tmp_path):
    fft, product = fft_13(), product_13()

    def program(x, a, b):
        return jnp.abs(fft(x)[0]).sum() * product(a, b)[0]

    exported = jaxbind.export(program, portable=True, platforms=("cpu", "tpu"))(X, A, B)
    assert "stablehlo.custom_call" not in exported.mlir_module()
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    args = [(np.asarray(v).tolist(), str(v.dtype)) for v in (X, A, B)]
    (tmp_path / "args.json").write_text(json.dumps(args))
    script = tmp_path / "load.py"
    script.write_text(_LOAD_WITHOUT_JAXBIND)
    done = run_python(script, tmp_path / "program.bin", tmp_path / "args.json", timeout=120)
    assert done.returncode == 0, done.stderr
    (got,) = json.loads(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got, program(X, A, B), rtol=1e-5)


def test_portable_export_refuses_an_op_without_a_reference_by_name():
    op = product_13(name="tests.references.portable.noref", reference=False)
    with pytest.raises(TypeError, match="'tests.references.portable.noref' has no JAX reference"):
        jaxbind.export(lambda a, b: op(a, b)[0], portable=True)(A, B)


def test_portable_export_does_not_change_the_native_export_of_the_same_function():
    op = fft_13()
    fn = jax.jit(lambda x: op(x)[0])
    portable = jaxbind.export(fn, portable=True)(X).mlir_module()
    native = jaxbind.export(fn)(X).mlir_module()
    assert (
        "stablehlo.custom_call" not in portable and "stablehlo.custom_call @jaxbind_cpu" in native
    )


# --- the run-time switch -----------------------------------------------------------------


@pytest.mark.parametrize("api", ["jaxbind13", "native"])
def test_use_reference_runs_the_reference_in_jit_and_eager_calls_and_only_inside(api):
    if api == "native":
        op = lambda a, b: product_native({"a": a, "b": b})
    else:
        op = lambda a, b: product_13()(a, b)[0]
    program = jax.jit(op)
    start = CALLS["product"]
    program(A, B)
    assert CALLS["product"] == start + 1
    with jaxbind.use_reference():
        np.testing.assert_allclose(program(A, B), expected_product(A, B), rtol=1e-6)
        np.testing.assert_allclose(op(A, B), expected_product(A, B), rtol=1e-6)
    assert CALLS["product"] == start + 1  # neither ran the native body
    program(A, B)
    assert CALLS["product"] == start + 2  # the program traced outside runs natively again


def test_use_reference_keeps_native_bodies_of_ops_without_one_unless_strict():
    op = product_13(name="tests.references.switch.noref", reference=False)
    with jaxbind.use_reference():
        np.testing.assert_allclose(op(A, B)[0], expected_product(A, B), rtol=1e-6)
    with jaxbind.use_reference(strict=True), pytest.raises(TypeError, match="no JAX reference"):
        jax.jit(lambda a, b: op(a, b)[0])(A, B)


def test_prefer_reference_runs_the_reference_on_that_platform_only():
    op = product_13(name="tests.references.prefer", prefer_reference=("cpu",))
    text = jax.jit(lambda a, b: op(a, b)[0]).lower(A, B).as_text()
    assert "stablehlo.custom_call" not in text
    other = product_13(name="tests.references.prefer.cuda", prefer_reference=("cuda",))
    text = jax.jit(lambda a, b: other(a, b)[0]).lower(A, B).as_text()
    assert "stablehlo.custom_call @jaxbind_cpu" in text


def test_prefer_reference_without_a_reference_is_an_error_naming_the_op_when_defined():
    with pytest.raises(TypeError, match="'tests.references.prefer.noref' has prefer_reference"):
        product_13(name="tests.references.prefer.noref", reference=False, prefer_reference="cpu")


@pytest.mark.parametrize("value", [("tpu",), 3, ("cpu", "gpu")])
def test_prefer_reference_takes_native_platforms_only(value):
    with pytest.raises(ValueError, match="prefer_reference must be"):
        product_13(name="tests.references.prefer.bad", prefer_reference=value)


# --- derived rules -----------------------------------------------------------------------


@pytest.mark.parametrize("api", ["jaxbind13", "native"])
def test_forward_only_op_differentiates_to_second_order_from_its_reference(api):
    if api == "native":
        op = lambda a, b: product_native({"a": a, "b": b})
    else:
        op13 = product_13()
        op = lambda a, b: op13(a, b)[0]
    loss = lambda a, b: jnp.sum(op(a, b) ** 2)
    want = lambda a, b: jnp.sum(expected_product(a, b) ** 2)
    for argnums in (0, 1, (0, 1)):
        got = jax.grad(loss, argnums)(A, B)
        np.testing.assert_allclose(
            jnp.concatenate(jnp.atleast_1d(*got)) if isinstance(got, tuple) else got,
            jnp.concatenate(jnp.atleast_1d(*jax.grad(want, argnums)(A, B)))
            if isinstance(got, tuple)
            else jax.grad(want, argnums)(A, B),
            rtol=1e-5,
        )
    _, tangent = jax.jvp(lambda a: op(a, B), (A,), (B,))
    np.testing.assert_allclose(tangent, jax.jvp(lambda a: expected_product(a, B), (A,), (B,))[1])
    np.testing.assert_allclose(
        jax.hessian(loss)(A, B), jax.hessian(want)(A, B), rtol=1e-4, atol=1e-5
    )
    hvp = jax.jvp(jax.grad(lambda a: loss(a, B)), (A,), (B,))[1]
    np.testing.assert_allclose(
        hvp, jax.jvp(jax.grad(lambda a: want(a, B)), (A,), (B,))[1], rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        jax.jit(jax.vmap(jax.grad(loss)))(jnp.stack([A, B]), jnp.stack([B, A])),
        jax.vmap(jax.grad(want))(jnp.stack([A, B]), jnp.stack([B, A])),
        rtol=1e-5,
    )


def test_linear_op_without_a_transpose_gets_it_from_its_reference():
    op = fft_13()
    ct = jnp.asarray(np.random.default_rng(1).standard_normal(8) * (1 + 1j), jnp.complex64)
    (got,) = jax.linear_transpose(lambda x: op(x.astype(jnp.float32))[0], X)(ct)
    want = jax.linear_transpose(lambda x: jnp.fft.fft(x.astype(jnp.complex64)), X)(ct)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda x: jnp.abs(op(x)[0]).sum())(X)
    np.testing.assert_allclose(
        grad, jax.grad(lambda x: jnp.abs(jnp.fft.fft(x)).sum())(X), rtol=1e-4
    )


def test_multilinear_op_without_transposes_gets_each_from_its_reference():
    def f(out, args, kd):
        out[0][...] = args[0] @ args[1]

    op = jaxbind.get_linear_call(
        f,
        (None, None),
        lambda a, b: (((a.shape[0], b.shape[1]), a.dtype),),
        reference=lambda a, b: a @ b,
        name="tests.references.matmul",
    )
    a = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    b = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
    for argnums in (0, 1):
        got = jax.grad(lambda a, b: jnp.sum(jnp.sin(op(a, b)[0])), argnums)(a, b)
        want = jax.grad(lambda a, b: jnp.sum(jnp.sin(a @ b)), argnums)(a, b)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert op.binding.role("T1").derived and op.binding.role("T7").derived


def test_a_declared_rule_wins_over_the_derived_one():
    vjp_calls = []

    def f_vjp(out, args, kd):
        vjp_calls.append(1)
        a, b, ct = args
        out[0][...] = np.cos(a) * b**2 * ct
        out[1][...] = np.sin(a) * 2 * b * ct

    op = jaxbind.get_nonlinear_call(
        _product,
        (None, f_vjp),
        lambda a, b: ((a.shape, a.dtype),),
        reference=lambda a, b: jnp.sin(a) * b**2,
        name="tests.references.declared_vjp",
    )
    roles = op.binding.roles
    assert roles["jvp"].derived and not roles["vjp"].derived
    got = jax.grad(lambda a: op(a, B)[0].sum())(A)
    assert vjp_calls  # the declared VJP ran
    np.testing.assert_allclose(got, jnp.cos(A) * B**2, rtol=1e-6)


def test_vmap_of_a_reference_lowering_matches_for_looped_and_natively_batched_ops():
    def f(out, args, kd):
        out[0][...] = np.sin(args[0]) * args[1] ** 2

    def f_batched(out, args, kd):  # func_can_batch: broadcasting does it
        out[0][...] = np.sin(args[0]) * args[1] ** 2

    looped = product_13(name="tests.references.vmap.looped")
    batched = jaxbind.get_nonlinear_call(
        f_batched,
        (None, None),
        lambda a, b, batch_axes=None: (
            (a.shape, a.dtype) if batch_axes is None else (a.shape, a.dtype, 0),
        ),
        reference=lambda a, b: jnp.sin(a) * b**2,
        func_can_batch=True,
        name="tests.references.vmap.batched",
    )
    a, b = jnp.stack([A, B, A]), jnp.stack([B, A, B])
    for op in (looped, batched):
        fn = jax.vmap(lambda a, b, op=op: op(a, b)[0])
        native = fn(a, b)
        with jaxbind.use_reference():
            ref = jax.jit(fn)(a, b)
        np.testing.assert_allclose(ref, native, rtol=1e-6)
        np.testing.assert_allclose(ref, expected_product(a, b), rtol=1e-6)


def test_a_reference_that_returns_other_shapes_is_an_error_naming_the_op():
    op = jaxbind.get_nonlinear_call(
        _product,
        (None, None),
        lambda a, b: ((a.shape, a.dtype),),
        reference=lambda a, b: (jnp.sin(a) * b**2)[:2],
        name="tests.references.wrong_shape",
    )
    with jaxbind.use_reference(), pytest.raises(TypeError) as info:
        jax.jit(lambda a, b: op(a, b)[0])(A, B)
    message = str(info.value)
    assert "'tests.references.wrong_shape'" in message
    assert "float32[2]" in message and "float32[5]" in message


def test_an_op_with_side_effects_refuses_a_reference():
    with pytest.raises(TypeError, match="side effects"):
        product_13(name="tests.references.effect", has_side_effect=True)
    with pytest.raises(TypeError, match="must be a JAX function"):
        jaxbind.get_nonlinear_call(
            _product, (None, None), lambda a, b: ((a.shape, a.dtype),), reference=3
        )


def test_errors_name_the_way_each_api_gives_a_reference():
    op = product_13(name="tests.references.words.noref", reference=False)
    with pytest.raises(NotImplementedError, match="reference= to get_linear_call"):
        jax.jit(lambda a, b: op(a, b)[0]).trace(A, B).lower(lowering_platforms=("tpu",))

    @jaxbind.nonlinear_op(shape=lambda a: a, name="tests.references.words.native")
    def native(a):
        return np.sin(a)

    with pytest.raises(NotImplementedError, match="@op.def_reference"):
        jax.jit(native).trace(A).lower(lowering_platforms=("tpu",))
