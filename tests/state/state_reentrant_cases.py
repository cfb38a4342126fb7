"""Re-entrant uses of a state, run in a subprocess (see test_state_reentrant.py): a body
that calls its own op (eagerly, or through a jitted program) on the thread whose call
holds the state's object, under each concurrency policy, with Python bodies and with a
C kernel (its library's path: the first argument).

`python state_reentrant_cases.py LIB` prints one JSON line per case: {"case": name,
"ok": bool, "detail": str}. Each case runs on a thread of its own with a time limit: a
case that waits for itself prints "hung", and the process then ends with os._exit(3)
(the waiting thread cannot be stopped); otherwise the process exits as usual (jaxbind's
exit hook included), which must not wait either.
"""

import ctypes
import json
import os
import sys
import threading
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import jaxbind

LIMIT_S = 30  # per case; a case takes well under a second


class Plan(ctypes.Structure):  # the C kernel's object (see test_state_reentrant.py)
    _fields_ = [("scale", ctypes.c_double)]


def python_op(name, nested, **state_options):
    """x -> scale * x, whose function calls the op again once (through `nested`, a
    function of the op and the call's arguments) and returns scale * (the nested
    result); the nested call's object is recorded in `objects`."""
    objects = []

    @jaxbind.state(**state_options)
    def plan(*, scale):
        return {"scale": scale}

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name=name, replace=True)
    def op(x, *, state, scale):
        objects.append(state)
        if len(objects) == 1:
            try:
                inner = np.asarray(nested(op, jnp.asarray(x), scale))
            finally:
                objects.append("returned")
            return inner * state["scale"]
        return x * state["scale"]

    @op.def_transpose
    def _(ct, *, state, scale):
        return ct * state["scale"]

    return op, objects


def eager(op, x, scale):
    return op(x, scale=scale)


def jitted(op, x, scale):
    return jax.jit(lambda x: op(x, scale=scale))(x)


def _refused(name, nested, words, **state_options):
    """The nested call fails with an error naming the op and the fix (and so does its
    caller); afterwards the op works again (its object was given back)."""
    op, objects = python_op(name, nested, **state_options)
    x = jnp.arange(3.0)
    problem = refusal_problem(
        lambda: jax.jit(lambda x: op(x, scale=2.0))(x).block_until_ready(),
        (f"'{name}'", "called again", *words),
    )
    if problem is not None:
        return False, problem
    objects[:] = ["again", "again"]  # (no nesting now)
    got = jax.jit(lambda x: op(x, scale=3.0))(x)
    return bool(np.allclose(got, 3 * np.arange(3.0))), "after the refusal"


LOCK_WORDS = ['plan\' (concurrency="lock"', 'concurrency="pool"']  # the state, the fix


def case_lock_eager():
    return _refused("reentrant.lock_eager", eager, LOCK_WORDS)


def case_lock_jitted():
    return _refused("reentrant.lock_jit", jitted, LOCK_WORDS)


def case_pool_of_one():
    return _refused("reentrant.pool_one", eager, ["pool_size"], concurrency="pool", pool_size=1)


def _nested_result(name, **state_options):
    op, objects = python_op(name, jitted, **state_options)
    got = jax.jit(lambda x: op(x, scale=2.0))(jnp.arange(3.0))
    ok = np.allclose(got, 4 * np.arange(3.0))
    return bool(ok), f"{np.asarray(got)}; objects {[id(o) for o in objects]}"


def case_pool_gives_the_nested_call_its_own_object():
    return _nested_result("reentrant.pool_two", concurrency="pool", pool_size=2)


def case_shared():
    return _nested_result("reentrant.shared", concurrency="shared")


def case_kernel_under_a_python_body_lock():
    """The op's transpose is a C kernel: the function, holding the object, runs the
    transpose; the kernel's C++ side refuses as Python's does."""
    lib = ctypes.CDLL(sys.argv[1])

    @jaxbind.state
    def plan(*, scale):
        return Plan(scale=scale)

    name = "reentrant.kernel_lock"

    @jaxbind.linear_op(shape=lambda x, **kw: x, state=plan, name=name, replace=True)
    def op(x, *, state, scale):
        if nest:
            t = jax.linear_transpose(lambda y: op(y, scale=scale), jnp.asarray(x))
            return np.asarray(jax.jit(t)(jnp.asarray(x))[0])
        return x * state.scale

    op.def_transpose(jaxbind.kernel(lib.scaled, name="scaled"))
    x = jnp.arange(3.0, dtype=jnp.float32)
    nest = True
    try:
        jax.jit(lambda x: op(x, scale=2.0))(x).block_until_ready()
    except Exception as exc:
        text = str(exc)
    else:
        return False, "the nested kernel call did not fail"
    if f"'{name}'" not in text or 'concurrency="pool"' not in text:
        return False, text[:1500]
    nest = False
    got = jax.jit(jax.linear_transpose(lambda y: op(y, scale=2.0), x))(x)[0]
    return bool(np.allclose(got, 2 * np.arange(3.0))), "after the refusal"


def refusal_problem(run, words) -> str | None:
    """None if `run()` raised with every one of `words` in its message, else what went
    wrong instead (it did not raise, or the message lacks some words)."""
    try:
        run()
    except Exception as exc:
        text = str(exc)
    else:
        return "the call did not fail"
    missing = [w for w in words if w not in text]
    return f"missing {missing} in: {text[:1500]}" if missing else None


def run_with_limit(cases):
    """Run each case (a function returning (ok, detail)) on a thread of its own with the
    time limit, printing its JSON line; a hung case ends the process (os._exit(3))."""
    hung = False
    for case in cases:
        result = {}

        def run(case=case, result=result):
            try:
                result["ok"], result["detail"] = case()
            except Exception:
                result["ok"], result["detail"] = False, traceback.format_exc()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(LIMIT_S)
        if thread.is_alive():
            hung = True
            result = {"ok": False, "detail": "hung"}
        print(json.dumps({"case": case.__name__[len("case_") :], **result}), flush=True)
        if hung:
            break  # (a later case may wait on the hung one's object)
    if hung:
        os._exit(3)


def main():
    run_with_limit(
        [
            case_lock_eager,
            case_lock_jitted,
            case_pool_of_one,
            case_pool_gives_the_nested_call_its_own_object,
            case_shared,
            case_kernel_under_a_python_body_lock,
        ]
    )


if __name__ == "__main__":
    main()
