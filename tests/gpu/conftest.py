"""GPU tests: run only where JAX has a CUDA backend; skipped cleanly elsewhere."""

import pytest


def _cuda_devices():
    try:
        import jax
        return jax.devices("cuda")
    except Exception:
        return []


HAS_CUDA = bool(_cuda_devices())


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA backend in JAX (GPU tests need an NVIDIA GPU)")
    for item in items:
        if "/gpu/" in str(item.fspath):
            item.add_marker(skip)
