"""A program partitioned by an op's rule runs only under that rule: run in a subprocess
with 4 CPU devices by test_definition_travels.py (one JSON line per case, as
sharding_cases.py prints them).

The op is a cumulative sum, which must see its whole axis: declared ``"n -> n"`` (split),
each device sums its own part and the result is wrong; ``"n -> k"`` keeps the axis
whole. A program partitioned under one rule and run (or loaded) where the op has the
other, or none, must fail naming the op, never give per-device sums.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.processes import run_case_functions

import jaxbind

mesh = Mesh(np.array(jax.devices()), ("b",))
split = NamedSharding(mesh, P("b"))
X = jnp.arange(1.0, 17.0, dtype=jnp.float32)
RIGHT = np.cumsum(np.arange(1.0, 17.0))
AGAIN = "trace the program again"


def make(name, sharding, replace=False):
    def cumsum(out, args, kwargs_dump):
        out[0][...] = np.cumsum(args[0])

    options = {} if sharding is None else {"sharding": sharding}
    return jaxbind.get_nonlinear_call(
        cumsum,
        (None, None),
        lambda x: ((x.shape, x.dtype),),
        None,
        name=name,
        replace=replace,
        **options,
    )


def _run(fn):
    """('ok', values) or ('error', message)."""
    try:
        return "ok", np.asarray(jax.block_until_ready(fn(jax.device_put(X, split))))
    except Exception as exc:
        return "error", str(exc)


def _right_or_refused(outcome, name):
    kind, value = outcome
    if kind == "ok":
        np.testing.assert_allclose(value, RIGHT)
        return "right result"
    assert f"'{name}'" in value and AGAIN in value, value
    assert "partitioned by the rule" in value, value
    return value[value.index("partitioned") :][:160]


def case_jitted_program_split_by_a_rule_refuses_the_rule_changed():
    name = "definition_cases.jit"
    op = make(name, "n -> n")
    program = jax.jit(lambda x: op(x)[0])
    kind, wrong = _run(program)  # the wrong rule splits the sum: per-device sums
    assert kind == "ok" and not np.allclose(wrong, RIGHT), (kind, wrong)
    op = make(name, "n -> k", replace=True)
    seen = [_right_or_refused(_run(program), name)]
    op = make(name, None, replace=True)
    seen.append(_right_or_refused(_run(program), name))
    assert all(s != "right result" for s in seen), seen
    return seen


def case_loaded_four_device_artifact_refuses_another_rule_or_none():
    name = "definition_cases.export"
    op = make(name, "n -> n")
    blob = jaxbind.export(jax.jit(lambda x: op(x)[0]))(
        jax.ShapeDtypeStruct(X.shape, X.dtype, sharding=split)
    ).serialize()
    seen = []
    for rule in ("n -> k", None, "n -> n"):
        op = make(name, rule, replace=True)
        loaded = jax.export.deserialize(blob)
        outcome = _run(loaded.call)
        if rule == "n -> n":  # the rule it was made for: runs (and splits, as declared)
            assert outcome[0] == "ok", outcome
            seen.append("same rule runs")
        else:
            seen.append(_right_or_refused(outcome, name))
    assert seen[:2] != ["right result"] * 2, seen
    return seen


def case_rule_function_giving_another_rule_refuses_the_program():
    name = "definition_cases.function"
    op = make(name, lambda shape, **kw: "n -> n")
    program = jax.jit(lambda x: op(x)[0])
    _run(program)
    op = make(name, lambda shape, **kw: "n -> k", replace=True)
    return [_right_or_refused(_run(program), name)]


if __name__ == "__main__":
    run_case_functions(globals(), sys.argv[1:])
