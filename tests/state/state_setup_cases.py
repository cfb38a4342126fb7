"""Re-entrant uses of a state that involve its setup or teardown, run in a subprocess (see
test_state_setup_reentrant.py) under state_reentrant_cases' time limit:

- a setup that calls an op using the state it is making (eagerly, under jit, through a
  jitted function, through an exported program, with both APIs, with key=) fails at
  once, naming the op, the state and the fix; the op works afterwards;
- a setup that calls its op with other setup arguments is not refused;
- a nested call that drops its caller's key value from the site's last few does not
  wait for the caller: the caller's object is torn down after its body returns.

`python state_setup_cases.py` prints one JSON line per case.
"""

import jax
import jax.numpy as jnp
import numpy as np
from state_reentrant_cases import refusal_problem, run_with_limit

import jaxbind

X = jnp.arange(3.0)
REFUSAL = ["being set up", "A setup must not call an op that uses the state it is making"]


def decorated(name, nested):
    """x -> scale * x, whose state's setup calls `nested(op, scale)` once (while
    `flag["nest"]`)."""
    flag = {"nest": True}

    @jaxbind.state
    def plan(*, scale):
        if flag["nest"]:
            flag["nest"] = False
            nested(op, scale)
        return scale

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name=name, replace=True)
    def op(x, *, state, scale):
        return x * state

    @op.def_transpose
    def _(ct, *, state, scale):
        return ct * state

    return op, flag


def jaxbind13(name, nested):
    """The same op through get_nonlinear_call (its callable reads load_state)."""
    flag = {"nest": True}

    @jaxbind.state
    def plan(*, scale):
        if flag["nest"]:
            flag["nest"] = False
            nested(lambda x, scale: op(x, scale=scale)[0], scale)
        return scale

    def f(out, args, kwargs_dump):
        out[0][...] = args[0] * jaxbind.load_state(kwargs_dump)

    def shape(x, **kwargs):
        return ((x.shape, x.dtype),)

    op = jaxbind.get_nonlinear_call(f, (None, None), shape, state=plan, name=name, replace=True)
    return (lambda x, scale: op(x, scale=scale)[0]), flag


def refused(make, name, nested):
    """The outer program fails, its message naming the op, the state and the fix; with
    the setup corrected, the op works."""
    op, flag = make(name, nested)
    problem = refusal_problem(
        lambda: np.asarray(jax.jit(lambda x: op(x, scale=2.0))(X)), (f"'{name}'", "plan'", *REFUSAL)
    )
    if problem is not None:
        return False, problem
    flag["nest"] = False
    got = jax.jit(lambda x: op(x, scale=3.0))(X)
    return bool(np.allclose(got, 3 * X)), f"after the refusal: {got}"


def eagerly(op, scale):
    np.asarray(op(X, scale=scale))


def under_jit(op, scale):
    np.asarray(jax.jit(lambda x: op(x, scale=scale))(X))


def case_setup_calling_its_op_eagerly():
    return refused(decorated, "setup.eager", eagerly)


def case_setup_calling_its_op_under_jit():
    return refused(decorated, "setup.jit", under_jit)


def case_setup_calling_a_jitted_function_with_the_op():
    programs = {}

    def nested(op, scale):
        np.asarray(programs["f"](X))

    op, flag = decorated("setup.jitted_function", nested)
    programs["f"] = jax.jit(lambda x: 1.0 + op(x, scale=2.0))
    return refused(lambda name, nested: (op, flag), "setup.jitted_function", nested)


def case_setup_calling_its_op_jaxbind13_api():
    return refused(jaxbind13, "setup.jaxbind13", eagerly)


def case_setup_calling_an_exported_program():
    """No trace on the setup's thread: the exported program is compiled on another
    thread and its call finds the setup in progress."""
    exported = {}

    def nested(op, scale):
        np.asarray(exported["call"].call(X))

    op, flag = decorated("setup.exported", nested)
    exported["call"] = jaxbind.export(jax.jit(lambda x: op(x, scale=2.0)))(X)
    return refused(lambda name, nested: (op, flag), "setup.exported", nested)


def case_keyed_setup_calling_its_op_with_its_key():
    name = "setup.keyed"
    flag = {"nest": True}

    @jaxbind.state(key=("p",))
    def plan(*, p, scale):
        if flag["nest"]:
            flag["nest"] = False
            np.asarray(op(jnp.asarray(p), X, scale=scale))
        return float(p.sum()) * scale

    @jaxbind.linear_op(shape=lambda p, x, **kw: x, fixed=1, state=plan, name=name, replace=True)
    def op(p, x, *, state, scale):
        return x * state

    f = jax.jit(lambda p, x: op(p, x, scale=2.0))
    problem = refusal_problem(
        lambda: np.asarray(f(jnp.ones(2), X)), (f"'{name}'", "plan'", *REFUSAL)
    )
    if problem is not None:
        return False, problem
    got = f(jnp.ones(2), X)
    return bool(np.allclose(got, 4 * X)), f"after the refusal: {got}"


def case_setup_calling_its_op_with_other_arguments_works():
    def nested(op, scale):
        np.asarray(op(X, scale=scale + 1.0))

    op, _ = decorated("setup.other_arguments", nested)
    got = jax.jit(lambda x: op(x, scale=2.0))(X)
    return bool(np.allclose(got, 2 * X)), f"{got}"


def dropping_the_callers_key(concurrency):
    """The body, for key value 2, calls its own program (the same site) with five other
    values: the site keeps four, so key value 2's state is freed while its object is
    the caller's. Its teardown waits for the body to return. (Key value 2's call is
    itself made by a body, for key value 1: a program called inside a body is compiled
    apart from one called outside, so only calls made inside reach the same site.)"""
    events = []
    nest = {"on": False, "evict": False}

    @jaxbind.state(key=("p",), concurrency=concurrency, teardown=lambda o: events.append(o))
    def plan(*, p):
        return ("object", float(p[0]))

    name = f"teardown.{concurrency}"

    @jaxbind.linear_op(shape=lambda p, x, **kw: x, fixed=1, state=plan, name=name, replace=True)
    def op(p, x, *, state):
        if nest["on"] and state[1] == 1.0:
            np.asarray(f(jnp.full(1, 2.0), X))
        elif nest["on"] and state[1] == 2.0 and nest["evict"]:
            nest["on"] = False
            for k in range(5):
                np.asarray(f(jnp.full(1, 10.0 + k), X))
            events.append(("returned", state))
        return x * state[1]

    f = jax.jit(lambda p, x: op(p, x))
    np.asarray(f(jnp.zeros(1), X))  # (compiled, key value 0 set up)
    nest["on"] = True
    np.asarray(f(jnp.ones(1), X))  # (compiled inside a body, once)
    nest["evict"] = True
    got = f(jnp.ones(1), X)
    if not np.allclose(got, X):
        return False, f"{got}"
    caller = ("object", 2.0)
    if ("returned", caller) not in events or caller not in events:
        return False, f"events: {events}"
    after = events.index(caller) > events.index(("returned", caller))
    again = np.allclose(f(jnp.ones(1), 2 * X), 2 * X)
    return bool(after and again), f"events: {events}"


def case_nested_call_dropping_the_callers_key_lock():
    return dropping_the_callers_key("lock")


def case_nested_call_dropping_the_callers_key_shared():
    return dropping_the_callers_key("shared")


def case_nested_call_dropping_the_callers_key_pool():
    return dropping_the_callers_key("pool")


CASES = [
    case_setup_calling_its_op_eagerly,
    case_setup_calling_its_op_under_jit,
    case_setup_calling_a_jitted_function_with_the_op,
    case_setup_calling_its_op_jaxbind13_api,
    case_setup_calling_an_exported_program,
    case_keyed_setup_calling_its_op_with_its_key,
    case_setup_calling_its_op_with_other_arguments_works,
    case_nested_call_dropping_the_callers_key_lock,
    case_nested_call_dropping_the_callers_key_shared,
    case_nested_call_dropping_the_callers_key_pool,
]

if __name__ == "__main__":
    run_with_limit(CASES)
