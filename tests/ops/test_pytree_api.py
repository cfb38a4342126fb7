"""The pytree API (linear_op, multilinear_op, nonlinear_op) against the JAXbind one."""

import dataclasses
import functools
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.ops import same_as_first
from support.processes import run_script

import jaxbind
from jaxbind.testing import check

pytestmark = pytest.mark.usefixtures("enable_x64")


def _primitives(fn, *args):
    return {str(e.primitive) for e in jax.make_jaxpr(fn)(*args).eqns}


# --- the README's examples, in both forms (kept in sync with README.md) ---------------------


def _scale_protocol(out, args, kwargs_dump):
    out[0][...] = jaxbind.load_kwargs(kwargs_dump)["factor"] * args[0]


def _scale_abstract(x, **kwargs):
    return ((x.shape, x.dtype),)


scale_protocol = jaxbind.get_linear_call(
    _scale_protocol, _scale_protocol, _scale_abstract, _scale_abstract, name="readme.scale"
)


@jaxbind.linear_op(
    shape=lambda x, *, factor: jax.ShapeDtypeStruct(x.shape, x.dtype), name="readme.scale_native"
)
def scale_native(x, *, factor):
    return factor * x


scale_native.def_transpose(scale_native.fn)  # symmetric


def test_readme_example_in_both_forms():
    x = np.arange(4.0)
    a = jax.jit(lambda x: scale_protocol(x, factor=3.0)[0])(x)
    b = jax.jit(lambda x: scale_native(x, factor=3.0))(x)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        jax.grad(lambda x: jnp.sum(scale_protocol(x, factor=3.0)[0]))(x),
        jax.grad(lambda x: jnp.sum(scale_native(x, factor=3.0)))(x),
    )
    assert _primitives(
        lambda x: (scale_protocol(x, factor=2.0), scale_native(x, factor=2.0)), x
    ) == {"jaxbind"}
    assert scale_native.name == "readme.scale_native"
    assert "readme.scale_native:f" in str(jax.make_jaxpr(lambda x: scale_native(x, factor=1.0))(x))


def test_readme_first_op_runs_and_both_forms_agree():
    """The README's example, as written there: both APIs give the same results."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## A first op, in each API") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env: dict = {}
    exec(compile(code, "README.md", "exec"), env)
    x = env["x"]
    np.testing.assert_allclose(env["y"], env["y13"], rtol=1e-6)
    np.testing.assert_allclose(env["y"], jnp.fft.fftn(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(env["g"], 2 * x.size * jnp.conj(x), rtol=1e-4)
    np.testing.assert_allclose(env["ys"][1], 2 * env["y"], rtol=1e-5, atol=1e-4)
    assert _primitives(lambda v: (env["fft"](v), env["fft_op"](v)), x) == {"jaxbind"}


# --- pytrees, ShapeDtypeStruct, returning or writing ---------------------------------------


@jaxbind.nonlinear_op(
    shape=lambda d: {
        "p": jax.ShapeDtypeStruct(d["a"].shape, d["a"].dtype),
        "s": jax.ShapeDtypeStruct((), d["a"].dtype),
    },
    name="tests.native_prodsum",
)
def prodsum(d, *, out):  # writes in place: out is the pytree of output arrays
    out["p"][...] = d["a"] * d["b"]
    out["s"][...] = np.sum(d["a"])


@prodsum.def_jvp
def _(primals, tangents):
    (d,), (t,) = primals, tangents
    return {"p": d["a"] * t["b"] + t["a"] * d["b"], "s": np.sum(t["a"])}


@prodsum.def_vjp
def _(primals, ct):
    (d,) = primals
    return ({"a": ct["p"] * d["b"] + ct["s"], "b": ct["p"] * d["a"]},)


def _prodsum_ref(d):
    return {"p": d["a"] * d["b"], "s": jnp.sum(d["a"])}


D = {"a": jnp.arange(1.0, 4.0), "b": jnp.full(3, 2.0)}


def test_pytrees_in_and_out_with_every_transformation():
    got = jax.jit(prodsum)(D)
    assert set(got) == {"p", "s"} and got["s"].shape == ()
    np.testing.assert_array_equal(got["p"], [2.0, 4.0, 6.0])
    loss = lambda f: lambda d: jnp.sum(f(d)["p"] ** 2) + f(d)["s"]
    for a, b in zip(
        jax.tree.leaves(jax.grad(loss(prodsum))(D)),
        jax.tree.leaves(jax.grad(loss(_prodsum_ref))(D)),
    ):
        np.testing.assert_allclose(a, b)
    for a, b in zip(
        jax.tree.leaves(jax.jvp(prodsum, (D,), (D,))),
        jax.tree.leaves(jax.jvp(_prodsum_ref, (D,), (D,))),
    ):
        np.testing.assert_allclose(a, b)
    batched = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones((2, 3))}
    for a, b in zip(
        jax.tree.leaves(jax.vmap(prodsum)(batched)),
        jax.tree.leaves(jax.vmap(_prodsum_ref)(batched)),
    ):
        np.testing.assert_allclose(a, b)
    check(prodsum, D, verbose=False)


def test_returning_a_result_of_the_wrong_shape_or_structure_is_a_clear_error():
    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.native_bad_shape"
    )
    def bad(x):
        return x[:1]

    with pytest.raises(
        Exception,
        match=r"tests\.native_bad_shape.*returned output 0 with shape "
        r"\(1,\), where the shape function declares \(3,\): return that shape",
    ):
        jax.block_until_ready(bad(jnp.ones(3)))

    @jaxbind.linear_op(
        shape=lambda x: (jax.ShapeDtypeStruct(x.shape, x.dtype),) * 2, name="tests.native_bad_tree"
    )
    def bad_tree(x):
        return x

    with pytest.raises(Exception, match=r"tests\.native_bad_tree.*structure"):
        jax.block_until_ready(bad_tree(jnp.ones(3)))


def _returns_despite_out(x, *, out):
    return 2 * x  # the mistake: the result is returned, not written into out


def _shape_of(x, *rest, **kwargs):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


# every route by which a callable with out= runs: eager, jit, vmap (jaxbind's loop and the
# op's own batching), and each rule body (transpose, JVP, VJP); the ops made once
@functools.cache
def _out_routes():
    x = jnp.arange(1.0, 4.0)
    lin = jaxbind.linear_op(shape=_shape_of, name="tests.native_out_returned")(_returns_despite_out)
    vec = jaxbind.linear_op(shape=_shape_of, vectorized=True, name="tests.native_out_vec")(
        lambda x, *, out, batch_axes=None: 2 * x
    )
    tr = jaxbind.linear_op(shape=_shape_of, name="tests.native_out_T")(lambda x: 2 * x)
    tr.def_transpose(_returns_despite_out)
    nl = jaxbind.nonlinear_op(shape=_shape_of, name="tests.native_out_rules")(jnp.sin)
    nl.def_jvp(lambda primals, tangents, *, out: np.cos(primals[0]) * tangents[0])
    nl.def_vjp(lambda primals, ct, *, out: (np.cos(primals[0]) * ct,))
    d = jaxbind.nonlinear_op(
        shape=lambda x: {"a": jax.ShapeDtypeStruct(x.shape, x.dtype)}, name="tests.native_out_dict"
    )(lambda x, *, out: {"a": 2 * x})
    xs = jnp.stack([x, x + 1])
    return {
        "eager": (lambda: lin(x), "the function"),
        "jit": (lambda: jax.jit(lin)(x), "the function"),
        "vmap": (lambda: jax.vmap(lin)(xs), "the function"),
        "vmap, vectorized": (lambda: jax.vmap(vec)(xs), "the function"),
        "dict output": (lambda: d(x), "the function"),
        "transpose": (lambda: jax.grad(lambda x: tr(x).sum())(x), "the transpose"),
        "jvp": (lambda: jax.jvp(nl, (x,), (x,)), "the JVP"),
        "vjp": (lambda: jax.grad(lambda x: nl(x).sum())(x), "the VJP"),
    }


@pytest.mark.parametrize("route", list(_out_routes()))
def test_a_callable_with_out_that_returns_its_result_is_refused_naming_the_op(route):
    """Not the uninitialised outputs it would leave: an error naming the op and the role,
    as the 1.3 API refuses a callable that returns a value."""
    call, role = _out_routes()[route]
    with pytest.raises(Exception) as info:
        jax.block_until_ready(call())
    text = str(info.value)
    assert re.search(r"'tests\.native_out_\w+' \(" + role, text), text
    assert "takes out= but returned a" in text and "instead of None" in text, text
    assert "write into out, or drop the out= parameter and return the results" in text, text


def test_a_callable_that_returns_its_out_argument_wrote_its_results():
    """NumPy's ufuncs take out= and return it: np.sin as a body is no mistake."""
    x = jnp.arange(1.0, 4.0)
    op = jaxbind.nonlinear_op(shape=_shape_of, name="tests.native_ufunc")(np.sin)
    for run in (op, jax.jit(op)):
        np.testing.assert_allclose(run(x), np.sin(x), rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(op)(jnp.stack([x, -x])), np.sin([x, -x]), rtol=1e-12)


def test_both_apis_refuse_a_callable_that_returns_where_it_should_write():
    x = jnp.arange(1.0, 4.0)
    calls = jaxbind.get_linear_call(
        lambda out, args, kd: 2 * args[0], None, same_as_first, name="tests.calls_returns"
    )
    native = jaxbind.linear_op(shape=_shape_of, name="tests.native_returns")(_returns_despite_out)
    for op, name in ((calls, "calls_returns"), (native, "native_returns")):
        with pytest.raises(Exception, match=rf"'tests\.{name}'.*instead of None"):
            jax.block_until_ready(op(x))


def test_definitions_after_the_first_call_and_misuse_are_errors():
    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.native_late"
    )
    def late(x):
        return 2 * x

    late(jnp.ones(2))
    with pytest.raises(RuntimeError, match="already called"):
        late.def_transpose(late.fn)
    with pytest.raises(TypeError, match="use def_transpose"):
        late.def_jvp(late.fn)


def test_fixed_argument_and_multilinear_op():
    @jaxbind.multilinear_op(
        shape=lambda w, a, b: jax.ShapeDtypeStruct(a.shape, a.dtype),
        fixed=1,
        name="tests.native_weighted_product",
    )
    def wprod(w, a, b):
        return w * a * b

    wprod.def_transpose(lambda w, b, ct: w * b * ct, argnum=1)
    wprod.def_transpose(lambda w, a, ct: w * a * ct, argnum=2)
    w, a, b = jnp.full(3, 2.0), jnp.arange(3.0), jnp.ones(3) * 5
    ga, gb = jax.grad(lambda a, b: jnp.sum(wprod(w, a, b)), argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(ga, w * b)
    np.testing.assert_array_equal(gb, w * a)
    with pytest.raises(TypeError, match="argument 0 is fixed"):
        jax.grad(lambda w: jnp.sum(wprod(w, a, b)))(w)


def test_vectorized_op_sees_batch_axes_in_front_and_nests():
    seen = []

    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        vectorized=True,
        name="tests.native_vectorized",
    )
    def rev(x):
        seen.append(x.shape)
        return x[..., ::-1]

    rev.def_transpose(rev.fn)
    xs = jnp.arange(24.0).reshape(2, 3, 4)
    got = jax.vmap(jax.vmap(rev, in_axes=1), in_axes=2)(xs)  # batch axes 2 and 1
    want = jax.vmap(jax.vmap(lambda v: v[::-1], in_axes=1), in_axes=2)(xs)
    np.testing.assert_array_equal(got, want)
    assert seen[-1] == (4, 3, 2)  # one call: outer level first, then inner, then the core
    np.testing.assert_array_equal(
        jax.grad(lambda x: jnp.sum(jax.vmap(rev)(x) * xs[0]))(xs[0]),
        jax.vmap(lambda v: v[::-1])(xs[0]),
    )


def test_hessian_with_jax_function_derivatives():
    @jaxbind.nonlinear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.native_sin"
    )
    def sin(x):
        return np.sin(x)

    sin.def_jvp(jaxbind.jax_function(lambda p, t: jnp.cos(p[0]) * t[0]))
    sin.def_vjp(jaxbind.jax_function(lambda p, ct: (jnp.cos(p[0]) * ct,)))
    x = jnp.linspace(0.1, 1.0, 4)
    np.testing.assert_allclose(
        jax.hessian(lambda x: jnp.sum(sin(x) ** 2))(x),
        jax.hessian(lambda x: jnp.sum(jnp.sin(x) ** 2))(x),
        atol=1e-12,
    )


def test_native_op_exports_and_loads_in_a_fresh_process(tmp_path):
    code = """
        import jax, jax.numpy as jnp, numpy as np, jaxbind
        jax.config.update("jax_enable_x64", True)

        @jaxbind.linear_op(shape=lambda t, **kw: (jax.ShapeDtypeStruct(t[1].shape, t[1].dtype),
                                                  jax.ShapeDtypeStruct(t[0].shape, t[0].dtype)),
                           name="tests.native_swap")
        def swap(t, *, k):
            return (k * t[1], k * t[0])
        swap.def_transpose(swap.fn)
    """
    script = textwrap.dedent(code) + textwrap.dedent("""
        import sys
        path = sys.argv[1]
        if sys.argv[2] == "export":
            exp = jaxbind.export(lambda a, b: swap((a, b), k=2.0))(np.ones(2), np.arange(3.0))
            open(path, "wb").write(exp.serialize())
        else:
            exp = jax.export.deserialize(bytearray(open(path, "rb").read()))
            print([np.asarray(r).tolist() for r in exp.call(np.ones(2), np.arange(3.0))])
    """)
    blob = str(tmp_path / "swap.bin")
    for mode in ("export", "load"):
        proc = run_script(tmp_path, script, blob, mode, name="s.py", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[[0.0, 2.0, 4.0], [2.0, 2.0]]"


def test_package_is_typed():
    import pathlib

    assert (pathlib.Path(jaxbind.__file__).parent / "py.typed").exists()


def test_extension_stub_names_what_the_extension_has():
    """_ext.pyi, what type checkers read for the compiled extension, declares exactly its
    public names, and those of each of its classes (Site, StateCell; the exception
    ReentrantUse)."""
    import ast
    import pathlib

    from jaxbind import _ext

    stub = ast.parse((pathlib.Path(jaxbind.__file__).parent / "_ext.pyi").read_text())

    def declared(body):
        return {
            node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else node.target.id
            for node in body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AnnAssign))
        } - {"__init__"}

    def public(obj):
        return {name for name in dir(obj) if not name.startswith("_")}

    assert declared(stub.body) == public(_ext)
    classes = [node for node in stub.body if isinstance(node, ast.ClassDef)]
    assert {c.name for c in classes} == {"Site", "StateCell", "ReentrantUse"}
    for c in classes:
        if issubclass(getattr(_ext, c.name), BaseException):
            continue  # an exception type: its members are Python's
        assert declared(c.body) == public(getattr(_ext, c.name)), c.name


_CELL = """
import jax, jaxbind

@jaxbind.linear_op(shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.cell")
def cell(x):
    return {factor} * x

cell.def_transpose(cell.fn)

def _f(out, args, kw):
    out[0][...] = {factor} * args[0]

cell13 = jaxbind.get_linear_call(_f, _f, lambda x: ((x.shape, x.dtype),), None,
                                 name="tests.cell13")
"""


def test_a_named_definition_run_again_replaces_its_binding():
    """A notebook cell (or a module) run again defines its ops again at the same place:
    the new binding replaces the old one. Another definition under a taken name is refused,
    as are closures of one definition (they differ by what they close over)."""
    first, again, edited = {}, {}, {}
    code = compile(_CELL.format(factor=3), "<cell-a>", "exec")
    exec(code, first)
    exec(code, again)
    x = jnp.ones(2)
    for ns in (first, again):
        np.testing.assert_array_equal(ns["cell"](x), [3.0, 3.0])
        np.testing.assert_array_equal(ns["cell13"](x)[0], [3.0, 3.0])
    assert again["cell"].binding is not first["cell"].binding
    assert jaxbind._binding.lookup("tests.cell") is again["cell"].binding
    with pytest.raises(ValueError, match=r"'tests.cell' is already used.*<cell-a>"):
        exec(compile(_CELL.format(factor=4), "<cell-b>", "exec"), edited)

    def make(k):
        def scale(out, args, kw):
            out[0][...] = k * args[0]

        return scale

    kept = jaxbind.get_linear_call(make(1), None, same_as_first, None, name="tests.closure_named")
    with pytest.raises(ValueError, match="'tests.closure_named' is already used"):
        jaxbind.get_linear_call(make(2), None, same_as_first, None, name="tests.closure_named")
    np.testing.assert_array_equal(kept(jnp.ones(2))[0], [1.0, 1.0])


def test_decorators_take_replace_and_linear_in():
    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.replaced"
    )
    def twice(x):
        return 2 * x

    @jaxbind.linear_op(
        shape=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), name="tests.replaced", replace=True
    )
    def thrice(x):
        return 3 * x

    np.testing.assert_array_equal(thrice(jnp.ones(2)), [3.0, 3.0])
    assert jaxbind._binding.lookup("tests.replaced") is thrice.binding

    @jaxbind.nonlinear_op(
        shape=lambda p, v: jax.ShapeDtypeStruct(v.shape, v.dtype),
        linear_in=(1,),
        name="tests.native_linear_in",
    )
    def scaled(p, v):
        return np.sin(p) * v

    @scaled.def_jvp
    def _(primals, tangents):
        (p, v), (dp, dv) = primals, tangents
        return np.cos(p) * v * dp + np.sin(p) * dv

    @scaled.def_vjp
    def _(primals, ct):
        p, v = primals
        return np.cos(p) * v * ct, np.sin(p) * ct

    p, v = jnp.linspace(0.1, 1.0, 4), jnp.ones(4)
    (t,) = jax.linear_transpose(lambda v: scaled(p, v), v)(jnp.arange(4.0))
    np.testing.assert_allclose(t, np.sin(np.asarray(p)) * np.arange(4.0), rtol=1e-6)
    with pytest.raises(TypeError, match="'tests.native_linear_in' is a nonlinear op"):
        jax.linear_transpose(lambda p: scaled(p, v), p)(jnp.ones(4))


_OPTION_VALUES = {
    "platform_mode": "host",
    "input_output_aliases": {0: 0},
    "has_side_effect": True,
    "ordered": True,
    "linear_in": (0,),
    "state": jaxbind.state(lambda **kwargs: "set up"),
    "sharding": "i -> i",
    "reduction": ("i",),
    "prefer_reference": ("cuda",),
}
# options that need another one with them (prefer_reference: the reference it prefers)
_OPTION_WITH = {"reduction": {"sharding": "i -> j"}, "prefer_reference": {"reference": jnp.copy}}


@pytest.mark.parametrize("option", sorted(_OPTION_VALUES))
def test_both_apis_take_every_option_into_one_options_value(option):
    from jaxbind._options import OPTION_NAMES

    assert set(OPTION_NAMES) == set(_OPTION_VALUES)  # a new option needs a value here
    given = {option: _OPTION_VALUES[option], **_OPTION_WITH.get(option, {})}

    def f(out, args, kw):
        out[0][...] = args[0]

    def fn(x, **kwargs):  # (kwargs: the state, for state=)
        return np.asarray(x)

    shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
    classic = jaxbind.get_nonlinear_call(f, (None, None), same_as_first, None, **given)
    native = jaxbind.nonlinear_op(shape=shape, **given)(fn)
    # the same value, but for the API that made it (which decides the words of errors)
    assert dataclasses.replace(classic.binding.options, pytree_api=True) == native.binding.options
    assert not classic.binding.options.pytree_api
    if option == "prefer_reference":  # (part of the op's reference, not of its options)
        assert classic.binding.reference.platforms == native.binding.reference.platforms
        assert native.binding.reference.platforms == ("cuda",)
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(classic(x)[0], x)
    np.testing.assert_array_equal(native(x), x)


@pytest.mark.parametrize(
    "make",
    [
        lambda: jaxbind.get_linear_call(
            lambda out, args, kw: None,
            None,
            same_as_first,
            None,
            platfrom_mode="host",
        ),
        lambda: jaxbind.multilinear_op(shape=lambda x: x, platfrom_mode="host"),
    ],
)
def test_a_misspelt_option_is_refused_with_the_options_listed(make):
    with pytest.raises(TypeError, match=r"unknown option 'platfrom_mode'.*platform_mode"):
        make()
