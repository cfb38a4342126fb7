"""The trampoline's one error boundary (cpp/boundary.h), as a table: each row is a failure
in one handler, and the shape of the error it becomes. Every such error reads

    <XLA code>: jaxbind: <where>: <what>

where <where> is the site's label ("'name' (the function)") once the site is known, else
"'name'"; a message that names the binding already keeps its own words.

Rows run through XLA (the CPU handler, its kernel fast path and the instantiate stage), or
through the CUDA handler's body on host memory (`_ext.gpu_error_for_tests`, as
tests/runtime/test_gpu_plumbing.py drives it), which reaches everything of that handler but XLA.
"""

import ctypes.util
import functools
import json
import re
import signal
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import ops
from support.clib import compile_c_library

import jaxbind
from jaxbind import _callformat, _definition, _ext, _kwargs
from jaxbind._rules.lowering import CPU_TARGET
from jaxbind._runtime.sites import SiteDescription

# XLA's error codes, as ffi::ErrorCode numbers them
CODES = {1: "CANCELLED", 3: "INVALID_ARGUMENT", 12: "UNIMPLEMENTED", 13: "INTERNAL"}


def _raw_call(x, **attrs):
    call = jax.ffi.ffi_call(CPU_TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype))
    return jax.block_until_ready(call(x, **attrs))


def _attrs(binding, role="f", fmt=4, definition=None):
    """A hand-made call's attributes (valid digest), as a program carries them (format 4's
    record: the binding's definition as it is now, unless `definition`)."""
    if definition is None:
        found = jaxbind._binding.lookup(binding)
        definition = "{}" if found is None else _definition.record(found.options, False)
    blob = _kwargs.encode_kwargs({"row": binding}).blob  # a site of its own
    attrs = dict(
        jaxbind_format=np.int32(fmt),
        binding=binding,
        role=role,
        kwargs=np.frombuffer(blob, np.uint8),
        loop_levels=np.int32(0),
        loop_batched=np.frombuffer(b"\0", np.uint8),
        n_fixed=np.int32(0),
        trees=np.frombuffer(b"", np.uint8),
        definition=definition,
    )
    digest = _callformat.CallAttributes(
        binding, role, blob, 0, b"\0", 0, b"", definition, format=fmt
    ).digest
    attrs["site"] = np.int64(digest)
    return attrs


# --- the failures, one function each: run it, and it raises ---------------------------


def callable_raises():
    def body(out, args, kw):
        raise ValueError("boom")

    op = jaxbind.get_linear_call(body, None, ops.same_as_first, None, name="eb.raises")
    op(jnp.ones(3))[0].block_until_ready()


@jaxbind.kernel
def _negative(out, x):
    if x[0] < 0:
        raise ValueError("negative input")
    out[0] = x[0]


def kernel_raises():
    op = jaxbind.get_linear_call(_negative, None, ops.same_as_last, name="eb.kernel")
    op(jnp.ones(1))[0].block_until_ready()  # warm: the next call takes the fast path
    op(-jnp.ones(1))[0].block_until_ready()


_C_SOURCE = r"""
#include <string.h>
#include "jaxbind/kernel.h"

/* out = x, refusing a negative first element with a message */
int32_t copy_nonnegative(const jaxbind_call *call) {
  const float *x = (const float *)call->inputs[0].data;
  if (x[0] < 0) {
    strncpy(call->error, "the first element is negative", call->error_size);
    return 1;
  }
  ((float *)call->outputs[0].data)[0] = x[0];
  return 0;
}
"""


@pytest.fixture(scope="module")
def clib(tmp_path_factory):
    return compile_c_library(tmp_path_factory, "boundary", _C_SOURCE)


def c_kernel_raises(clib):
    kernel = jaxbind.kernel(clib.copy_nonnegative)
    op = jaxbind.get_linear_call(kernel, None, ops.same_as_last, name="eb.c_kernel")
    op(jnp.ones(1))[0].block_until_ready()
    op(-jnp.ones(1))[0].block_until_ready()


def unknown_binding():
    _raw_call(jnp.ones(3), **_attrs("eb.nope"))


double = ops.doubling("eb.double")


def definition_differs():
    recorded = json.loads(_definition.record(jaxbind._binding.lookup("eb.double").options, False))
    recorded["effect"] = "ordered"
    _raw_call(jnp.ones(3), **_attrs("eb.double", definition=json.dumps(recorded, sort_keys=True)))


def unknown_role():
    _raw_call(jnp.ones(3), **_attrs("eb.double", role="T7"))


def newer_call_format():
    _raw_call(jnp.ones(3), **_attrs("eb.double", fmt=99))


def state_setup_fails():
    op = ops.failing_setup("eb.setup")
    jax.jit(lambda x: op(x, scale=1.0))(jnp.ones(2)).block_until_ready()


def callable_interrupted():
    def body(out, args, kw):
        raise KeyboardInterrupt

    op = jaxbind.get_linear_call(body, None, ops.same_as_first, None, name="eb.interrupted")
    op(jnp.ones(3))[0].block_until_ready()


XLA_ROWS = {
    # failure: (code, what follows "jaxbind: ", a regular expression)
    "CPU callable raises": ("INTERNAL", r"'eb.raises' \(the function\) raised ValueError: boom"),
    "numba kernel (fast path) raises": (
        "INTERNAL",
        r"kernel of 'eb.kernel' \(the function\) failed: the numba kernel raised an exception",
    ),
    "C kernel (fast path) fails with a message": (
        "INTERNAL",
        r"kernel of 'eb.c_kernel' \(the function\) failed: the first element is negative$",
    ),
    "unknown binding (instantiate refuses)": (
        "INVALID_ARGUMENT",
        r"no binding named 'eb.nope' is registered",
    ),
    "definition differs": ("INVALID_ARGUMENT", r"'eb.double'.*traced with ordered=True"),
    "bad attribute: unknown role": (
        "INVALID_ARGUMENT",
        r"binding 'eb.double' \(linear\) has no role 'T7'",
    ),
    "bad attribute: newer call format": (
        "UNIMPLEMENTED",
        r"'eb.double': program uses jaxbind call format 99",
    ),
    # (where no slot keeps the site, jaxlib 0.7, it is made at the first call: the same)
    "instantiate: the state's setup fails": (
        "INVALID_ARGUMENT",
        r"'eb.setup' \(the function\).*setup of its state.*no plan today",
    ),
    "KeyboardInterrupt in a callable": (
        "CANCELLED",
        r"'eb.interrupted' \(the function\): interrupted \(KeyboardInterrupt\)",
    ),
}
FAILURES = {
    "CPU callable raises": callable_raises,
    "numba kernel (fast path) raises": kernel_raises,
    "C kernel (fast path) fails with a message": c_kernel_raises,
    "unknown binding (instantiate refuses)": unknown_binding,
    "definition differs": definition_differs,
    "bad attribute: unknown role": unknown_role,
    "bad attribute: newer call format": newer_call_format,
    "instantiate: the state's setup fails": state_setup_fails,
    "KeyboardInterrupt in a callable": callable_interrupted,
}


def _shape_of(text, code, what):
    """The error's code, and its message from "jaxbind: " on, match the row; "jaxbind: "
    comes once, and the binding is not named twice in a row."""
    assert f"{code}: jaxbind: " in text, text
    message = text[text.index(f"{code}: jaxbind: ") + len(code) + 2 :]
    assert re.match("jaxbind: " + what, message), message
    assert message.count("jaxbind: ") == 1 or "Traceback" in message, message
    name = re.search(r"'[^']*'", message).group(0)
    assert f"{name}: {name}" not in message and f"{name} ({name}" not in message, message


@pytest.mark.parametrize("row", list(XLA_ROWS))
def test_every_failure_becomes_one_error_in_one_format(row, request):
    code, what = XLA_ROWS[row]
    fail = FAILURES[row]
    if fail is c_kernel_raises:
        fail = functools.partial(fail, request.getfixturevalue("clib"))
    interrupts = []
    # the boundary raises a KeyboardInterrupt again (PyErr_SetInterrupt): recorded here
    before = signal.signal(signal.SIGINT, lambda *a: interrupts.append(a))
    try:
        with pytest.raises(Exception) as info:
            fail()
        deadline = time.monotonic() + 5
        while code == "CANCELLED" and not interrupts and time.monotonic() < deadline:
            time.sleep(0.01)  # (the handler runs in the main thread, between bytecodes)
    finally:
        signal.signal(signal.SIGINT, before)
    _shape_of(str(info.value), code, what)
    assert bool(interrupts) == (code == "CANCELLED")  # raised again only for an interrupt


# --- the CUDA handler's body, on host memory ------------------------------------------


def _site(body=None, *, levels=0, batched=(False,), check=None, cuda_kernel=None):
    description = SiteDescription(
        "eb.gpu",
        "'eb.gpu' (the function)",
        body,
        None,
        levels,
        batched,
        "device",
        check or (lambda ins, outs: None),
        None,
        cuda_kernel,
    )
    return _ext.Site(description)


def _buffers(a):
    return ((a.ctypes.data, a.shape, 11),)  # float32


def _gpu_plan_raises():
    def body(out, args, kw):
        raise ValueError("boom")

    return _site(body), np.ones(3, np.float32), np.ones(3, np.float32)


def _gpu_bad_batch():
    return (
        _site(lambda *a: None, levels=1, batched=(True,)),
        np.ones((2, 3), np.float32),
        np.ones((4, 3), np.float32),
    )


def _gpu_refused():
    site = _site(
        lambda *a: None, check=lambda ins, outs: "jaxbind: 'eb.gpu' (the function): refused"
    )
    return site, np.ones(3, np.float32), np.ones(3, np.float32)


def _gpu_cuda_kernel_without_driver():
    kernel = types.SimpleNamespace(
        image=b"not a module", entry="scale", launch=lambda ins, outs: ((1, 1, 1), (1, 1, 1), 0, ())
    )
    return _site(cuda_kernel=kernel), np.ones(3, np.float32), np.ones(3, np.float32)


GPU_ROWS = {
    "GPU plan: the callable raises": (
        _gpu_plan_raises,
        "INTERNAL",
        r"'eb.gpu' \(the function\) raised ValueError: boom",
    ),
    "GPU: a bad batch loop": (
        _gpu_bad_batch,
        "INVALID_ARGUMENT",
        r"'eb.gpu' \(the function\): input 0 does not lead with the batch axes",
    ),
    "GPU: the site's check refuses": (
        _gpu_refused,
        "INVALID_ARGUMENT",
        r"'eb.gpu' \(the function\): refused$",
    ),
    "CUDA kernel: no driver": (
        _gpu_cuda_kernel_without_driver,
        "INTERNAL",
        r"'eb.gpu' \(the function\): cannot load the CUDA driver",
    ),
}


@pytest.mark.parametrize("row", list(GPU_ROWS))
def test_every_failure_of_the_cuda_handler_becomes_one_error_in_one_format(row):
    make, code, what = GPU_ROWS[row]
    if row.startswith("CUDA kernel") and ctypes.util.find_library("cuda"):
        pytest.skip("a CUDA driver is installed: the launch would be tried")
    site, x, y = make()
    got = _ext.gpu_error_for_tests(site, 0, 0, _buffers(x), _buffers(y))
    assert got is not None
    _shape_of(f"{CODES[got[0]]}: {got[1]}", code, what)
