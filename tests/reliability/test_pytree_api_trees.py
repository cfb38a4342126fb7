"""The pytree API takes and returns every pytree that jax.custom_vjp accepts.

namedtuples, OrderedDicts (in their own key order), registered dataclasses and
custom nodes, as arguments and as results, under jit, grad, linear_transpose and
vmap, compared with the same function written in jax.numpy.
"""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbind

Pt = collections.namedtuple("Pt", "a b")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Pair:
    a: jax.Array
    b: jax.Array


class Node:
    """A custom pytree node."""

    def __init__(self, a, b):
        self.a, self.b = a, b


jax.tree_util.register_pytree_node(
    Node, lambda n: ((n.b, n.a), None), lambda _, children: Node(children[1], children[0])
)

TREES = {
    "namedtuple": lambda a, b: Pt(a, b),
    "OrderedDict": lambda a, b: collections.OrderedDict([("z", a), ("a", b)]),
    "dataclass": lambda a, b: Pair(a, b),
    "custom node": lambda a, b: Node(a, b),
}


def _get(tree):
    if isinstance(tree, dict):
        return tree["z"], tree["a"]
    return tree.a, tree.b


@pytest.mark.parametrize("kind", sorted(TREES))
def test_a_linear_op_on_a_pytree_matches_jax_numpy(kind):
    make = TREES[kind]

    def shape(p, **kw):
        a, b = _get(p)
        return make(jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(b.shape, b.dtype))

    def scale(p, **kw):
        a, b = _get(p)
        return make(2 * np.asarray(a), 3 * np.asarray(b))

    op = jaxbind.linear_op(shape=shape, name=f"reliability.pytree_{kind.replace(' ', '_')}")(scale)
    op.def_transpose(scale)

    def ref(p):
        a, b = _get(p)
        return make(2 * a, 3 * b)

    p = make(jnp.arange(2.0), jnp.arange(3.0))
    for fn in (op, jax.jit(op)):
        got = fn(p)
        assert type(got) is type(p)
        for g, w in zip(_get(got), _get(ref(p))):
            np.testing.assert_allclose(g, w)
    loss = lambda f: lambda p: sum(jnp.sum(x**2) for x in _get(f(p)))
    for g, w in zip(_get(jax.grad(loss(op))(p)), _get(jax.grad(loss(ref))(p))):
        np.testing.assert_allclose(g, w)
    (ct,) = jax.linear_transpose(op, p)(p)
    assert type(ct) is type(p)
    batched = make(jnp.ones((4, 2)), jnp.ones((4, 3)))
    out = jax.vmap(op)(batched)
    assert type(out) is type(p) and _get(out)[1].shape == (4, 3)


def test_a_nonlinear_op_with_a_namedtuple_in_and_an_ordered_dict_out():
    def shape(p, **kw):
        s = jax.ShapeDtypeStruct(p.a.shape, p.a.dtype)
        return collections.OrderedDict([("sin", s), ("cos", s)])

    @jaxbind.nonlinear_op(shape=shape, name="reliability.pytree_nonlinear")
    def trig(p, **kw):
        return collections.OrderedDict([("sin", np.sin(p.a) * p.b), ("cos", np.cos(p.a))])

    @trig.def_jvp
    def trig_jvp(primals, tangents, **kw):
        (p,), (t,) = primals, tangents
        return collections.OrderedDict(
            [("sin", np.cos(p.a) * t.a * p.b + np.sin(p.a) * t.b), ("cos", -np.sin(p.a) * t.a)]
        )

    @trig.def_vjp
    def trig_vjp(primals, cts, **kw):
        (p,) = primals
        return (
            Pt(np.cos(p.a) * p.b * cts["sin"] - np.sin(p.a) * cts["cos"], np.sin(p.a) * cts["sin"]),
        )

    def ref(p):
        return collections.OrderedDict([("sin", jnp.sin(p.a) * p.b), ("cos", jnp.cos(p.a))])

    p = Pt(jnp.linspace(0, 1, 3), jnp.linspace(1, 2, 3))
    got = jax.jit(trig)(p)
    assert list(got) == ["sin", "cos"]
    np.testing.assert_allclose(got["sin"], ref(p)["sin"], rtol=1e-6)
    loss = lambda f: lambda p: jnp.sum(f(p)["sin"]) + jnp.sum(f(p)["cos"] ** 2)
    g, w = jax.grad(loss(trig))(p), jax.grad(loss(ref))(p)
    assert type(g) is Pt
    np.testing.assert_allclose(g.a, w.a, rtol=1e-6)
    np.testing.assert_allclose(g.b, w.b, rtol=1e-6)
    _, jvp = jax.jvp(trig, (p,), (p,))
    _, want = jax.jvp(ref, (p,), (p,))
    np.testing.assert_allclose(jvp["sin"], want["sin"], rtol=1e-6)
