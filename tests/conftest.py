import jax
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
