"""Programs with random and adversarial jaxbind call attributes: no crash, no garbage.

A jax.export artifact is a file that people send each other, so everything in
a jaxbind custom call may have been crafted: the format, the role, the keyword
arguments, jaxbind's batch loop (explicit attributes in formats 2 and 3, inside the
keyword arguments in format 1), n_fixed, the buffer ranks, counts and dtypes.
The marker's abstract function declares whatever output shapes the keyword
argument "out" names, so that about half the programs pass the check of the
buffers against it and reach the loop.
Every program here carries a *valid* site digest (the worst case: the digest
is an unkeyed hash and guards against accidents only). Each call must either
raise a clean error or write every element of every output; the marker
binding below writes 7 everywhere it is called, so an element that is not 7
after a successful call is memory the trampoline never handed to it.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxbind
from jaxbind import _callformat
from jaxbind._rules.lowering import CPU_TARGET

# Hypothesis' tracing can hold the callable's frame (and so its views) a moment
# longer; the kept-reference warning is tested in test_kept_references.py.
pytestmark = pytest.mark.filterwarnings("ignore:jaxbind.*kept a reference:RuntimeWarning")

calls = []


def _marker(out, args, kd):
    jaxbind.load_kwargs(kd)
    calls.append(len(args))
    for o in out:
        o[...] = 7


def _declared(*args, out=None, **kwargs):
    if out is None:
        return (((1,), np.float32),)
    return tuple((tuple(shape), dtype) for shape, dtype in out)


marker = jaxbind.get_linear_call(_marker, _marker, _declared, _declared, name="fuzz.marker")

DTYPES = [np.float32, np.float64, np.int32, np.uint8, np.complex64, np.bool_, np.float16]
dims = st.lists(st.integers(0, 3), min_size=0, max_size=4).map(tuple)
levels_axes = st.lists(st.integers(-2, 5), min_size=0, max_size=4).map(tuple)


@st.composite
def programs(draw):
    n_in = draw(st.integers(0, 3))
    n_out = draw(st.integers(1, 3))
    inputs = [(draw(dims), draw(st.sampled_from(DTYPES))) for _ in range(n_in)]
    outputs = [
        (draw(dims), draw(st.sampled_from([np.float32, np.float64, np.int32])))
        for _ in range(n_out)
    ]
    role = draw(st.sampled_from(["f", "T", "jvp", "vjp", "T0", "T99", "", "f\x00", "ü"]))
    fmt = draw(st.sampled_from([1, 1, 2, 2, 3, 3, 3, 0, -5, 2**31 - 1]))
    kwargs, levels = {}, 0
    loop = dict(
        levels=draw(st.integers(-2, 5)),
        flags=bytes(draw(st.lists(st.integers(0, 2), min_size=0, max_size=5))),
        n_fixed=draw(st.integers(-2, 4)),
    )
    if fmt >= 3:  # a pytree structure: none (the marker has none), or any bytes
        loop["trees"] = draw(st.sampled_from([b"", b"", b"J{}", b"\x00"]) | st.binary(max_size=8))
    if fmt in (2, 3):
        levels = max(loop["levels"], 0)
    elif draw(st.booleans()):  # format 1: the batch loop comes from kwargs
        n_flags = draw(st.integers(0, 5))
        axes = [list(draw(levels_axes)) for _ in range(n_flags)]
        kwargs["batch_axes"] = {"t": [{"t": ax} for ax in axes]}
        levels = max((len(ax) for ax in axes), default=0)
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.integers(-3, 3))
    if draw(st.booleans()):  # declare the program's own output shapes: the check passes
        kwargs["out"] = {
            "t": [{"t": [list(shape[levels:]), np.dtype(dtype).name]} for shape, dtype in outputs]
        }
    blob = (
        b"J"
        + json.dumps(
            {"d": sorted([k, v] for k, v in kwargs.items())}, separators=(",", ":")
        ).encode()
    )
    if draw(st.integers(0, 9)) == 0:  # sometimes not even valid JSON or tag
        blob = draw(st.binary(min_size=0, max_size=12))
    name = draw(st.sampled_from(["fuzz.marker", "fuzz.marker", "no.such.binding"]))
    return inputs, outputs, role, blob, name, fmt, loop


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(program=programs())
def test_crafted_calls_raise_cleanly_or_write_every_output(program):
    inputs, outputs, role, blob, name, fmt, loop = program
    args = [np.zeros(shape, dtype) for shape, dtype in inputs]
    attrs = dict(
        jaxbind_format=np.int32(fmt),
        binding=name,
        role=role,
        kwargs=np.frombuffer(blob, np.uint8) if blob else np.zeros(0, np.uint8),
    )
    if fmt == 1:
        attrs["site"] = np.int64(_callformat.CallAttributes(name, role, blob, format=1).digest)
    else:
        attrs["site"] = np.int64(
            _callformat.CallAttributes(name, role, blob, **loop, format=fmt).digest
        )
        attrs.update(
            loop_levels=np.int32(loop["levels"]),
            n_fixed=np.int32(loop["n_fixed"]),
            loop_batched=np.frombuffer(loop["flags"], np.uint8)
            if loop["flags"]
            else np.zeros(0, np.uint8),
        )
        if "trees" in loop:
            attrs["trees"] = np.frombuffer(loop["trees"], np.uint8).copy()
    call = jax.ffi.ffi_call(CPU_TARGET, [jax.ShapeDtypeStruct(s, d) for s, d in outputs])
    try:  # JAX may refuse to build some of these programs at all: nothing ran, fine
        compiled = jax.jit(lambda *a: call(*a, **attrs)).lower(*args).compile()
    except Exception:
        return
    try:
        results = jax.block_until_ready(compiled(*args))
    except Exception as exc:  # a clean error that says it is jaxbind's
        assert "jaxbind" in str(exc), str(exc)[:500]
        return
    if all(np.prod(shape) == 0 for shape, _ in outputs):
        return  # XLA skips a call whose outputs are all empty
    assert name == "fuzz.marker" and fmt in (1, 2, 3) and not loop.get("trees"), (
        "a call that should have failed succeeded"
    )
    for r in results:
        assert np.all(np.asarray(r) == 7), "an output element was never written"


def test_the_marker_runs_after_all_that():
    np.testing.assert_array_equal(jax.jit(lambda x: marker(x)[0])(jnp.zeros(3)), [7.0])
