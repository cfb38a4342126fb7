import jax
import numpy as np
import pytest


@pytest.fixture(params=[False, True], ids=["x32", "x64"])
def x64(request):
    """Run the test with jax_enable_x64 off and on."""
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", request.param)
    yield request.param
    jax.config.update("jax_enable_x64", old)


@pytest.fixture
def enable_x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


FLOAT_DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def skip_unless_x64(dtype, x64):
    if np.dtype(dtype) in (np.float64, np.complex128) and not x64:
        pytest.skip("64-bit dtype needs jax_enable_x64")


def random(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def tol(dtype):
    return 2e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12


# --- GPU tests (tests/gpu/): only where JAX has a CUDA backend --------------------


def _has_cuda() -> bool:
    try:
        import jax

        return bool(jax.devices("cuda"))
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "/gpu/" in str(item.fspath).replace("\\", "/")]
    if gpu_items and not _has_cuda():
        skip = pytest.mark.skip(reason="no CUDA backend in JAX (GPU tests need an NVIDIA GPU)")
        for item in gpu_items:
            item.add_marker(skip)
