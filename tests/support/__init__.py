"""Helpers shared by the tests, one module per concern (fixtures are in tests/conftest.py).

- ``support.arrays``: random inputs, tolerances and error measures
- ``support.dtypes``: dtype lists, jax_enable_x64, and the (dtype, x64) parametrization
- ``support.ops``: abstract functions and callables for small throwaway ops
- ``support.processes``: Python run in a fresh process
- ``support.clib``: a C kernel library compiled for a test
- ``support.skips``: what this machine has (CUDA, optional packages)
- ``support.threads``: one function on several Python threads at once

The tests import them as ``from support.arrays import random`` (tests/ is on sys.path,
as for reference_ops).
"""
