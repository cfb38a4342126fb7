"""A program runs only against the definition it was made for.

A program names its op by string; when the op it finds was defined differently (redefined
with ``replace=True``, or defined otherwise in the process that loads an exported
program), every role of the call is checked against it before any body runs: the fixed
arguments, the number of inputs and outputs, and their shapes and dtypes, whether the
role declares its shapes or took them from the primals. A mismatch fails the call with
an error naming the op and saying what to do; it never hands back outputs no body wrote.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.processes import run_isolated

import jaxbind

SAME = lambda *args, **kw: jax.ShapeDtypeStruct(args[-1].shape, args[-1].dtype)
AGAIN = "trace the program again"


def _scale_op(name, fixed, **options):
    """A nonlinear op a * x, with `fixed` leading fixed arguments (0 or 1)."""

    @jaxbind.nonlinear_op(shape=SAME, name=name, fixed=fixed, **options)
    def scale(a, x):
        return a * x

    @scale.def_jvp
    def _(primals, tangents):
        (a, x) = primals
        if fixed:
            (dx,) = tangents
            return a * dx
        da, dx = tangents
        return da * x + a * dx

    @scale.def_vjp
    def _(primals, ct):
        a, x = primals
        return (a * ct,) if fixed else (x * ct, a * ct)

    return scale


A, X = jnp.array([1.0, 2.0, 3.0]), jnp.ones(3)


def test_grad_compiled_before_fixed_changes_fails_naming_the_op():
    op = _scale_op("tests.defcheck.native2", 0)
    grad = jax.jit(jax.grad(lambda a, x: jnp.sum(op(a, x)), argnums=1))
    np.testing.assert_array_equal(grad(A, X), A)
    op = _scale_op("tests.defcheck.native2", 1, replace=True)
    with pytest.raises(Exception, match=r"'tests.defcheck.native2'.*fixed=1") as err:
        jax.block_until_ready(grad(A, X))
    assert AGAIN in str(err.value)


def test_jvp_compiled_before_fixed_changes_fails():
    op = _scale_op("tests.defcheck.jvp", 0)
    jvp = jax.jit(lambda a, x: jax.jvp(lambda x: op(a, x), (x,), (jnp.ones(3),))[1])
    np.testing.assert_array_equal(jvp(A, X), A)
    op = _scale_op("tests.defcheck.jvp", 1, replace=True)
    with pytest.raises(Exception, match=r"'tests.defcheck.jvp' \(the JVP\).*fixed=1"):
        jax.block_until_ready(jvp(A, X))


def _linear_13(name, n_out, replace=False, fixed=0):
    """A JAXbind 1.3 linear op (x -> x[:n_out] padded), no abstract_T: its transpose's
    shapes come from the primals."""

    def f(out, args, kd):
        out[0][...] = 0
        m = min(n_out, args[-1].size)
        out[0][:m] = args[-1][:m]

    def f_t(out, args, kd):
        out[0][...] = 0
        m = min(n_out, out[0].size)
        out[0][:m] = args[-1][:m]

    def abstract(*args, **kw):
        return (((n_out,), args[-1].dtype),)

    return jaxbind.get_linear_call(
        f, f_t, abstract, None, name=name, replace=replace, first_n_args_fixed=fixed
    )


def test_transpose_without_abstract_function_is_checked_against_f():
    op = _linear_13("tests.defcheck.linear", 3)
    vjp = jax.jit(lambda x, ct: jax.vjp(lambda x: op(x)[0], x)[1](ct)[0])
    np.testing.assert_array_equal(vjp(X, A), A)
    op = _linear_13("tests.defcheck.linear", 4, replace=True)  # f now declares 4 outputs
    with pytest.raises(Exception, match=r"'tests.defcheck.linear'.*the transpose.*float32\[4\]"):
        jax.block_until_ready(vjp(X, A))


def test_transpose_compiled_before_the_fixed_count_changes_fails():
    op = _linear_13("tests.defcheck.linear_fixed", 3)
    t = jax.jit(lambda ct: jax.linear_transpose(lambda x: op(x)[0], X)(ct)[0])
    np.testing.assert_array_equal(t(A), A)
    op = _linear_13("tests.defcheck.linear_fixed", 3, replace=True, fixed=1)
    with pytest.raises(Exception, match=r"first_n_args_fixed=0.*first_n_args_fixed=1"):
        jax.block_until_ready(t(A))


def test_multilinear_transpose_is_checked_against_f():
    def make(n, replace=False):
        @jaxbind.multilinear_op(
            shape=lambda a, b: jax.ShapeDtypeStruct((n,), a.dtype),
            name="tests.defcheck.multilinear",
            replace=replace,
        )
        def mul(a, b):
            return np.resize(a * b, n)

        @mul.def_transpose(argnum=0)
        def _(b, ct):
            return np.resize(b * ct[: b.size], b.size)

        @mul.def_transpose(argnum=1)
        def _(a, ct):
            return np.resize(a * ct[: a.size], a.size)

        return mul

    op = make(3)
    grad = jax.jit(jax.grad(lambda a, b: jnp.sum(op(a, b))))
    np.testing.assert_array_equal(grad(A, X), X)
    op = make(5, replace=True)
    with pytest.raises(Exception, match=r"'tests.defcheck.multilinear'.*argument 0"):
        jax.block_until_ready(grad(A, X))


def test_forward_whose_declared_outputs_changed_fails():
    op = _linear_13("tests.defcheck.forward", 3)
    fn = jax.jit(lambda x: op(x)[0])
    np.testing.assert_array_equal(fn(X), X)
    op = _linear_13("tests.defcheck.forward", 2, replace=True)
    with pytest.raises(Exception, match=r"'tests.defcheck.forward'.*output 0 is float32\[3\]"):
        jax.block_until_ready(fn(X))


def test_a_compatible_redefinition_runs_the_new_body():
    op = _scale_op("tests.defcheck.compatible", 1)
    grad = jax.jit(jax.grad(lambda a, x: jnp.sum(op(a, x)), argnums=1))
    np.testing.assert_array_equal(grad(A, X), A)

    @jaxbind.nonlinear_op(shape=SAME, name="tests.defcheck.compatible", fixed=1, replace=True)
    def twice(a, x):
        return 2 * a * x

    twice.def_jvp(lambda primals, tangents: 2 * primals[0] * tangents[0])
    twice.def_vjp(lambda primals, ct: (2 * primals[0] * ct,))
    np.testing.assert_array_equal(grad(A, X), 2 * A)


@pytest.mark.parametrize("api", ["native", "jaxbind13"])
def test_exported_grad_loaded_where_the_op_is_defined_differently(tmp_path, api):
    """An exported grad program, loaded in a fresh process whose op has a fixed argument
    where the exporting process's had none, fails there naming the op."""
    define = {
        "native": """
            import sys, jax, numpy as np, jaxbind
            SAME = lambda a, x: jax.ShapeDtypeStruct(x.shape, x.dtype)
            @jaxbind.nonlinear_op(shape=SAME, name="tests.defcheck.exported", fixed=FIXED)
            def op(a, x):
                return a * x
            op.def_jvp(lambda p, t: p[0] * t[-1] + (0 if FIXED else t[0] * p[1]))
            op.def_vjp(lambda p, ct: (p[0] * ct,) if FIXED else (p[1] * ct, p[0] * ct))
            call = op
        """,
        "jaxbind13": """
            import sys, jax, numpy as np, jaxbind
            def f(out, args, kd):
                out[0][...] = args[0] * args[1]
            def f_jvp(out, args, kd):
                a, x, *t = args
                out[0][...] = a * t[-1] + (0 if FIXED else t[0] * x)
            def f_vjp(out, args, kd):
                a, x, ct = args
                if FIXED:
                    out[0][...] = a * ct
                else:
                    out[0][...] = x * ct
                    out[1][...] = a * ct
            def abstract(a, x, **kw):
                return ((x.shape, x.dtype),)
            op = jaxbind.get_nonlinear_call(f, (f_jvp, f_vjp), abstract, None,
                name="tests.defcheck.exported", first_n_args_fixed=FIXED)
            call = lambda a, x: op(a, x)[0]
        """,
    }[api]
    export = (
        define.replace("FIXED", "0")
        + """
            import jax.numpy as jnp
            a, x = jnp.array([1.0, 2.0, 3.0]), jnp.ones(3)
            g = jax.grad(lambda a, x: jnp.sum(call(a, x)), argnums=1)
            exported = jaxbind.export(jax.jit(g))(a, x)
            open(sys.argv[1], "wb").write(exported.serialize())
            print(np.asarray(g(a, x)).tolist())
    """
    )
    load = (
        define.replace("FIXED", "1")
        + """
            import jax.numpy as jnp
            from jax import export
            a, x = jnp.array([1.0, 2.0, 3.0]), jnp.ones(3)
            loaded = export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
            try:
                print("RESULT", np.asarray(loaded.call(a, x)).tolist())
            except Exception as e:
                print("ERROR", e)
    """
    )
    artifact = tmp_path / "grad.bin"
    made = run_isolated(tmp_path, export, artifact, name="export.py")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "[1.0, 2.0, 3.0]"
    ran = run_isolated(tmp_path, load, artifact)
    assert ran.returncode == 0, ran.stderr
    assert "RESULT" not in ran.stdout, ran.stdout
    assert "'tests.defcheck.exported'" in ran.stdout and "export it again" in ran.stdout


@pytest.mark.parametrize("before", [True, False])
def test_program_traced_with_other_native_batching_fails(before):
    """func_can_batch changed: the program's callable would get (or miss) batch_axes."""

    def f(out, args, kd):
        out[0][...] = 2 * args[0]

    def abstract(x, batch_axes=None, **kw):
        return ((x.shape, x.dtype, 0),) if batch_axes else ((x.shape, x.dtype),)

    def make(vectorized, replace=False):
        return jaxbind.get_linear_call(
            f,
            f,
            abstract,
            abstract,
            name="tests.defcheck.batching",
            func_can_batch=vectorized,
            replace=replace,
        )

    op = make(before)
    fn = jax.jit(jax.vmap(lambda x: op(x)[0]))
    np.testing.assert_array_equal(fn(jnp.ones((2, 3))), 2 * jnp.ones((2, 3)))
    op = make(not before, replace=True)
    with pytest.raises(Exception, match=rf"func_can_batch={before}.*func_can_batch={not before}"):
        jax.block_until_ready(fn(jnp.ones((2, 3))))


# --- code a program inlined at trace time -------------------------------------------------


def _scaled_with_reference(api: str, name: str, scale: float, replace: bool = False):
    """A linear op scale * x with no transpose of its own: grad inlines the transpose
    derived from its JAX reference (scale * x, closing over `scale`); one array out."""
    reference = lambda x, **kw: scale * x
    if api == "native":
        return jaxbind.linear_op(shape=SAME, name=name, replace=replace, reference=reference)(
            lambda x: scale * np.asarray(x)
        )

    def f(out, args, kd):
        out[0][...] = scale * np.asarray(args[0])

    abstract = lambda x, **kw: ((x.shape, x.dtype),)
    op = jaxbind.get_linear_call(f, None, abstract, name=name, replace=replace, reference=reference)
    return lambda x: op(x)[0]


@pytest.mark.parametrize("api", ["native", "jaxbind13"])
def test_grad_compiled_before_the_reference_changes_fails_naming_the_op(api):
    """Body and reference go from 2 x to 3 x: the old program's forward would run the new
    body (3 x) and its derived transpose the old reference's (2 x), giving 12 x where
    d/dx (2x)^2 is 8 x and d/dx (3x)^2 is 18 x. It fails instead, naming the op."""
    name = f"tests.defcheck.reference.{api}"
    op = _scaled_with_reference(api, name, 2.0)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(op(x) ** 2)))
    np.testing.assert_allclose(grad(X), 8 * X)
    op = _scaled_with_reference(api, name, 3.0, replace=True)
    with pytest.raises(Exception, match=rf"'{name}'.*inlined the op's JAX reference") as err:
        jax.block_until_ready(grad(X))
    assert AGAIN in str(err.value)
    jax.clear_caches()  # traced again, the program runs the new definition throughout
    np.testing.assert_allclose(grad(X), 18 * X)


@pytest.mark.parametrize("api", ["native", "jaxbind13"])
def test_a_redefinition_with_an_equal_reference_keeps_old_programs(api):
    """Equal code closing over equal values is the same reference (as a body defined again
    is the same body): the old program runs on."""
    name = f"tests.defcheck.same_reference.{api}"
    op = _scaled_with_reference(api, name, 2.0)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(op(x) ** 2)))
    np.testing.assert_allclose(grad(X), 8 * X)
    op = _scaled_with_reference(api, name, 2.0, replace=True)
    np.testing.assert_allclose(grad(X), 8 * X)


def test_an_exported_grad_loaded_after_the_reference_changed_fails_naming_the_op():
    """An artifact carries the identity of the reference whose derived transpose it holds:
    loaded where the op has another one, it fails; where it has an equal one, it runs."""
    name = "tests.defcheck.reference.exported"
    op = _scaled_with_reference("native", name, 2.0)
    g = jax.jit(jax.grad(lambda x: jnp.sum(op(x) ** 2)))
    blob = jaxbind.export(g)(X).serialize()
    op = _scaled_with_reference("native", name, 2.0, replace=True)
    np.testing.assert_allclose(jax.export.deserialize(blob).call(X), 8 * X)
    op = _scaled_with_reference("native", name, 3.0, replace=True)  # (kept: held weakly)
    with pytest.raises(Exception, match=rf"'{name}'.*inlined the op's JAX reference"):
        jax.block_until_ready(jax.export.deserialize(blob).call(X))


def test_a_jvp_given_as_a_jax_function_that_changes_fails_naming_the_op():
    """A rule given as a JAX function is inlined at trace time as a derived one is: a
    forward-mode program whose JVP the op no longer has fails."""
    name = "tests.defcheck.jax_jvp"

    def make(scale, replace=False):
        @jaxbind.nonlinear_op(shape=SAME, name=name, replace=replace)
        def op(x):
            return scale * np.asarray(x)

        op.def_jvp(jaxbind.jax_function(lambda primals, tangents: scale * tangents[0]))
        return op

    op = make(2.0)
    jvp = jax.jit(lambda x, t: jax.jvp(op, (x,), (t,)))
    np.testing.assert_allclose(jvp(X, X)[1], 2 * X)
    op = make(2.0, replace=True)
    np.testing.assert_allclose(jvp(X, X)[1], 2 * X)
    op = make(3.0, replace=True)  # (kept: the registry holds bindings weakly)
    with pytest.raises(Exception, match=rf"'{name}'.*rules given as JAX functions"):
        jax.block_until_ready(jvp(X, X))


def test_code_identity_is_by_code_and_values_never_by_address():
    """The identity a program records: equal for a function defined again with equal
    values (another object), different for other closed-over values or other code."""
    from jaxbind._definition import identity

    def make(scale, offset=0.0):
        return lambda x: scale * x + offset

    assert identity(make(2.0)) == identity(make(2.0))
    assert identity(make(2.0)) != identity(make(3.0))
    assert identity(make(2.0)) != identity(make(2.0, np.float32(1.0)))
    assert identity(make(np.arange(3.0))) == identity(make(np.arange(3.0)))
    assert identity(make(np.arange(3.0))) != identity(make(np.arange(3.0) + 1))
    assert identity(lambda x: 2 * x) != identity(lambda x: 3 * x)
    assert str(id(make)) not in repr(identity(make))
