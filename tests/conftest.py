import pytest
from support.dtypes import global_x64
from support.skips import has_cuda

pytest_plugins = ["pytester"]  # tests/docs/test_docs_blocks.py runs the docs conftest on a page


@pytest.fixture(params=[False, True], ids=["x32", "x64"])
def x64(request):
    """Run the test with jax_enable_x64 off and on (or as support.dtypes.dtypes_and_x64
    parametrizes it, together with the dtype)."""
    with global_x64(request.param):
        yield request.param


@pytest.fixture
def enable_x64():
    with global_x64(True):
        yield


# --- GPU tests (tests/gpu/): only where JAX has a CUDA backend --------------------


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "/gpu/" in str(item.fspath).replace("\\", "/")]
    if gpu_items and not has_cuda():
        skip = pytest.mark.skip(reason="no CUDA backend in JAX (GPU tests need an NVIDIA GPU)")
        for item in gpu_items:
            item.add_marker(skip)
