"""Helpers shared by the tests, one module per concern (fixtures are in tests/conftest.py).

- ``support.arrays``: random inputs, tolerances and error measures
- ``support.dtypes``: dtype lists, jax_enable_x64, and the (dtype, x64) parametrization
- ``support.ops``: abstract functions, callables and a PTX kernel for small throwaway ops
- ``support.processes``: Python run in a fresh process (tests/ on its path), the case
  scripts' runner and main, several processes joined in one JAX runtime
- ``support.clib``: a C kernel library compiled for a test
- ``support.skips``: what this machine has (CUDA, optional packages)
- ``support.threads``: one function on several Python threads at once
- ``support.dense_sht``: the HEALPix SHT as dense matrices (the reference's oracle, small
  sizes)

The tests, in tests/<feature>/, import them as ``from support.arrays import random``:
tests/conftest.py puts tests/ on sys.path (pytest's default "prepend" import mode, tests/
having no __init__.py; test files' basenames are unique), as for reference_ops.
"""
