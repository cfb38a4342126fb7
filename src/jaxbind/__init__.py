"""jaxbind: Python-callable functions as first-class JAX primitives.

Two ways to define the same ops. The JAX-native one:

- [`linear_op`][jaxbind.linear_op], [`multilinear_op`][jaxbind.multilinear_op],
  [`nonlinear_op`][jaxbind.nonlinear_op]: decorators, with
  ``def_transpose`` / ``def_jvp`` / ``def_vjp``, pytrees and ``jax.ShapeDtypeStruct``.

The JAXbind 1.3 one (drop-in compatible):

- [`get_linear_call`][jaxbind.get_linear_call]: a linear or multilinear op from ``f`` and its
  transpose(s);
- [`get_nonlinear_call`][jaxbind.get_nonlinear_call]: a nonlinear op from ``f``, its JVP and
  its VJP;
- [`jax_function`][jaxbind.jax_function]: mark a JAX function as a nonlinear op's JVP or VJP
  (differentiable again: Hessians);
- [`load_kwargs`][jaxbind.load_kwargs]: the keyword arguments of a call, inside a callable;
- [`kernel`][jaxbind.kernel]: a compiled op body (numba, C, ...), called without the GIL;
- [`export`][jaxbind.export]: ``jax.export.export`` with jaxbind's custom call allowed;
- [`jaxbind.testing.check`][jaxbind.testing.check]: check an op's abstract function, derivatives,
  transposes and batching on example inputs;
- [`check_outputs`][jaxbind.check_outputs]: check, while programs run, that every call
  writes every element of its outputs (a debugging aid, off by default).
"""

# Before anything imports JAX's internals: is the installed jaxlib new enough
# for the compiled extension? (jaxlib.version loads no XLA code.)
import jaxlib.version as _jaxlib_version

from . import _buildcheck, _ext
from ._versions import OLDEST_SUPPORTED_JAX as _OLDEST

_buildcheck.check_build(_ext.jaxlib_version, _jaxlib_version.__version__, _OLDEST)

from ._compat import check_jax_version as _check_jax_version  # noqa: E402

_check_jax_version()

from . import _rules, _runtime  # noqa: E402
from ._api import Op, get_linear_call, get_nonlinear_call  # noqa: E402
from ._errors import ExportedDefaultNameWarning  # noqa: E402
from ._export import export, export_safety_checks  # noqa: E402
from ._kernels import Kernel, kernel, kernel_include_dir  # noqa: E402
from ._kwargs import load_kwargs  # noqa: E402
from ._native import NativeOp, linear_op, multilinear_op, nonlinear_op  # noqa: E402
from ._roles import jax_function  # noqa: E402
from ._runtime import check_outputs  # noqa: E402
from ._runtime.gpu import CallContext, CudaArray, current_call  # noqa: E402

_rules.register_rules()  # trace time: the jaxbind primitive's rules
_rules.lowering.register_targets()  # XLA: the FFI handlers
_runtime.install()  # run time: what the handlers call back into

from . import testing  # noqa: E402, F401  (jaxbind.testing.check)

__version__ = "2.0.0.dev0"

__all__ = [
    "CallContext",
    "CudaArray",
    "ExportedDefaultNameWarning",
    "Kernel",
    "NativeOp",
    "Op",
    "check_outputs",
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
    "multilinear_op",
    "nonlinear_op",
    "__version__",
]
