"""Python-callable functions and compiled kernels as first-class JAX primitives.

An op works under jit, grad/vjp, jvp, linear_transpose, vmap, sharding and jax.export,
on CPU and GPU buffers, without copies. Define ops in either API; both make the same
kind of op, and each error speaks the API it was made with.

The pytree API: decorators; arguments and results are pytrees of arrays, output
shapes are jax.ShapeDtypeStruct, the function returns its result.
    linear_op, multilinear_op, nonlinear_op
        decorators that make an op from a function and its shape function
    PytreeOp
        what they make; def_transpose, def_jvp, def_vjp add the derivatives

The JAXbind 1.3 API (drop-in compatible): callables write out[k][...] = ..., abstract
functions return ((shape, dtype), ...).
    get_linear_call
        a linear or multilinear op from f and its transpose(s)
    get_nonlinear_call
        a nonlinear op from f, its JVP and its VJP
    load_kwargs
        a call's keyword arguments, inside a callable
    Op
        what they make

Both APIs:
    jax_function
        mark a nonlinear op's JVP or VJP as a JAX function (then Hessians work)

State that lives with the compiled program (a plan, a handle), set up once per call site:
    state, StateDef
        the decorator (@jaxbind.state) and what it makes; an op's state= option takes it
    load_state
        the object, inside a callable of get_linear_call / get_nonlinear_call

Compiled kernels, any role's body in either API, run without the GIL on XLA's threads:
    kernel, Kernel
        a numba function, a C/C++/Rust/Fortran function pointer, or an address
    kernel_include_dir
        the directory of jaxbind/kernel.h, the kernels' C ABI

Export, programs that call jaxbind ops run in another process:
    export, export_safety_checks, ExportedDefaultNameWarning

Without Python, in a PJRT host written in C or C++ (C kernels native, other bodies their
references):
    bundle
        the program, its compile options, its kernels' libraries and a manifest, in a folder
    runtime_library
        the path of libjaxbind_runtime.so, the C runtime that runs a bundle's calls
    c_state
        an op's state made and freed by C functions, which a bundle carries

JAX references (reference= in both APIs): every platform, portable exports, derived rules:
    use_reference
        run ops' JAX references instead of their native bodies (JAXBIND_USE_REFERENCE=1)
    Reference
        a reference as one value: its function, tolerance and preferred platforms

GPU (CUDA buffers handed to callables; CUDA kernels launched by jaxbind on XLA's stream):
    current_call, CallContext, CudaArray
    cuda_kernel, CudaKernel

Testing:
    jaxbind.testing.check(op, *example_args, **kwargs)
        derivatives, transposes, batching and the declared shapes on example inputs;
        raises AssertionError naming each failed check
    check_outputs
        check, while programs run, that every call writes every element of its outputs
        (a debugging aid, off by default; JAXBIND_CHECK_OUTPUTS=1)

Contrib:
    jaxbind.contrib.jaxducc0
        DUCC's FFTs, spherical harmonics, gridder and NUFFTs as ops (ducc0: pip install
        ".[ducc]" in the clone); jax-finufft's nufft1/2/3 calls

Documentation: docs/index.md in the source tree (mkdocs serve), or the README.
"""

import re as _re

# Before anything imports JAX's internals: is the installed jaxlib new enough
# for the compiled extension? (jaxlib.version loads no XLA code.)
import jaxlib.version as _jaxlib_version

from . import _buildcheck, _ext
from ._versions import NEWEST_TESTED_JAX as _NEWEST
from ._versions import OLDEST_SUPPORTED_JAX as _OLDEST

_buildcheck.check_build(_ext.jaxlib_version, _jaxlib_version.__version__, _OLDEST)

import jax as _jax  # noqa: E402

_buildcheck.check_jax_version(_jax.__version__, _OLDEST, _NEWEST)

from . import _rules, _runtime  # noqa: E402
from ._api import Op, get_linear_call, get_nonlinear_call  # noqa: E402
from ._bundle import bundle, runtime_library  # noqa: E402
from ._errors import ExportedDefaultNameWarning  # noqa: E402
from ._export import export, export_safety_checks  # noqa: E402
from ._kernels import Kernel, kernel, kernel_include_dir  # noqa: E402
from ._kernels.c_state import c_state  # noqa: E402
from ._kernels.cuda import CudaKernel, cuda_kernel  # noqa: E402
from ._kwargs import load_kwargs  # noqa: E402
from ._pytree_api import PytreeOp, linear_op, multilinear_op, nonlinear_op  # noqa: E402
from ._references import use_reference  # noqa: E402
from ._roles import Reference, jax_function  # noqa: E402
from ._rules import spmd as _spmd  # noqa: E402
from ._runtime import check_outputs  # noqa: E402
from ._runtime.gpu import CallContext, CudaArray, current_call  # noqa: E402
from ._state import StateDef, load_state, state  # noqa: E402

_rules.register_rules()  # trace time: the jaxbind primitive's rules
_rules.targets.register_targets()  # XLA: the FFI handlers, one per row of the target table
_spmd.register()  # compile time, XLA's SPMD partitioner: calls with a declared sharding rule
_runtime.install()  # run time: what the handlers call back into

from . import testing  # noqa: E402  (jaxbind.testing.check)

__version__ = "2.0.0.dev0"

__all__ = [
    "CallContext",
    "CudaArray",
    "CudaKernel",
    "ExportedDefaultNameWarning",
    "Kernel",
    "PytreeOp",
    "Op",
    "Reference",
    "StateDef",
    "bundle",
    "c_state",
    "check_outputs",
    "cuda_kernel",
    "current_call",
    "export",
    "export_safety_checks",
    "get_linear_call",
    "get_nonlinear_call",
    "jax_function",
    "kernel",
    "kernel_include_dir",
    "linear_op",
    "load_kwargs",
    "load_state",
    "multilinear_op",
    "nonlinear_op",
    "runtime_library",
    "state",
    "use_reference",
    "__version__",
]


# The docs site links names in docstrings with mkdocstrings' markup ([`Op`][jaxbind.Op]),
# which reads as noise in help() and IDEs: there, docstrings show the names alone. (The
# site reads the source files, so it keeps its links.)
_CROSS_REFERENCE = _re.compile(r"\[([^\[\]]+)\]\[(?:jaxbind\.[\w.]+)?\]")


def _plain_docstrings(*objects: object) -> None:
    for obj in objects:
        members = list(vars(obj).values()) if isinstance(obj, type) else []
        for item in (obj, *members):
            doc = getattr(item, "__doc__", None)
            if isinstance(doc, str) and "][" in doc:
                try:
                    item.__doc__ = _CROSS_REFERENCE.sub(r"\1", doc)
                except (AttributeError, TypeError):  # read-only (a slot, a builtin)
                    pass


_plain_docstrings(
    *(globals()[name] for name in __all__ if name != "__version__"),
    *(getattr(testing, name) for name in testing.__all__),
)
