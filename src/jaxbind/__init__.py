"""jaxbind: Python-callable functions as first-class JAX primitives.

Public API (drop-in compatible with JAXbind 1.3):

- :func:`get_linear_call`: a linear or multilinear op from ``f`` and its transpose(s);
- :func:`get_nonlinear_call`: a nonlinear op from ``f``, its JVP and its VJP;
- :func:`load_kwargs`: the keyword arguments of a call, inside a callable.
"""

from ._compat import check_jax_version as _check_jax_version

_check_jax_version()

from . import _lowering  # noqa: E402
from ._api import Op, get_linear_call, get_nonlinear_call  # noqa: E402
from ._kwargs import load_kwargs  # noqa: E402

_lowering.register_targets()

__version__ = "2.0.0.dev0"

__all__ = ["Op", "get_linear_call", "get_nonlinear_call", "load_kwargs", "__version__"]
