"""A GPU call site without a GPU: what XLA's CUDA instantiate stage makes for an op's
role, to run the CUDA handler's body on host memory standing in for device memory
(``_ext.gpu_call_for_tests``)."""

import numpy as np

from jaxbind import _definition
from jaxbind._callformat import NO_LOOP, CallAttributes
from jaxbind._kwargs import encode_kwargs
from jaxbind._runtime.sites import instantiate_site

# XLA element types
CODES = {
    np.dtype(np.float32): 11,
    np.dtype(np.float64): 12,
    np.dtype(np.int64): 5,
    np.dtype(np.int32): 4,
    np.dtype(np.complex64): 15,
    np.dtype(np.complex128): 18,
}


def site_on_cuda(op, kwargs=None, loop=NO_LOOP, role="f", n_args=1, n_fixed=0):
    """The site XLA's CUDA instantiate stage would make for `op`'s `role` (no buffers
    there) called with `kwargs`."""
    binding = op.binding
    record = _definition.record(binding.options, binding.role(role).kind.calls == "kernel")
    blob = encode_kwargs(kwargs or {}).blob
    call = CallAttributes.of_call(
        binding.name, role, blob, loop, n_args, n_fixed, definition=record
    )
    found = {
        k: (v.tobytes() if isinstance(v, np.ndarray) else v)
        for k, v in call.ffi_attributes().items()
    }
    for name in ("jaxbind_format", "site", "loop_levels", "n_fixed"):
        found[name] = int(found[name])
    site, _ = instantiate_site(dict(found, platform="cuda"))
    return site


def buffers(*arrays):
    """Host arrays as the trampoline describes buffers: (address, shape, XLA type)."""
    return tuple((a.ctypes.data, a.shape, CODES[a.dtype]) for a in arrays)
