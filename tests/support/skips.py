"""What this machine has, for tests that need it: a CUDA backend, optional packages."""

import importlib


def has_cuda() -> bool:
    """Whether JAX has a CUDA backend here."""
    try:
        import jax

        return bool(jax.devices("cuda"))
    except Exception:
        return False


def importable(module: str) -> bool:
    """Whether `module` imports here (an optional dependency such as ducc0 or numba)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
