"""The extension's build against jaxlib: the import-time check, and the claim behind it.

The claim: the extension is compiled against the XLA FFI headers of the oldest
supported jaxlib, and XLA runs such a handler on every newer jaxlib. CI builds
one wheel and runs this suite with it under the oldest and the newest JAX;
`test_extension_built_against_the_oldest_jaxlib_runs_here` is the check that
makes that run say something.
"""

import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import jaxlib.version
import numpy as np
import pytest
from reference_ops import axpy
from support.processes import run_python

from jaxbind import _buildcheck, _ext, _versions

RELEASES = json.loads(
    (pathlib.Path(__file__).parents[1] / "data" / "jax_releases.json").read_text()
)["dates"]
V = _buildcheck.version_tuple


def _installed_ffi_api_version():
    """(major, minor) of the XLA FFI API of the running jaxlib, read from its headers."""
    text = (pathlib.Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h").read_text()
    return tuple(
        int(re.search(rf"#define XLA_FFI_API_{part} (\d+)", text).group(1))
        for part in ("MAJOR", "MINOR")
    )


def test_extension_built_against_the_oldest_jaxlib_runs_here():
    # pip install . and the wheels build against the pinned oldest jaxlib
    # (a --no-build-isolation build may use a newer one; then it is that one).
    assert V(_ext.jaxlib_version) >= V(_versions.OLDEST_SUPPORTED_JAX)
    assert V(_ext.jaxlib_version) <= V(jaxlib.version.__version__)
    built, running = tuple(_ext.ffi_api_version), _installed_ffi_api_version()
    assert built[0] == running[0] and built[1] <= running[1], (built, running)
    # The handler, compiled against those headers, runs on this jaxlib: jitted,
    # eager, and differentiated.
    x, y = np.arange(4.0, dtype=np.float32), np.ones(4, np.float32)
    np.testing.assert_allclose(
        jax.jit(lambda a, b: axpy(a, b, scale=2.0)[0])(x, y), 2 * (x + 2 * y)
    )
    np.testing.assert_allclose(axpy(x, y)[0], x + 2 * y)
    g = jax.grad(lambda a: jnp.sum(axpy(a, y, scale=3.0)[0]))(x)
    np.testing.assert_allclose(g, np.full(4, 3.0))


@pytest.mark.parametrize("installed", sorted((v for v in RELEASES if V(v) >= V("0.7.0")), key=V))
def test_every_supported_jaxlib_passes_the_check(installed):
    _buildcheck.check_build("0.7.0", installed, "0.7.0")


@pytest.mark.parametrize("installed", ["0.6.2", "0.4.38", "0.7.0rc1", "0.6.9.dev20250101"])
def test_too_old_jaxlib_is_an_import_error_naming_both(installed):
    with pytest.raises(ImportError) as info:
        _buildcheck.check_build("0.7.0", installed, "0.7.0")
    text = str(info.value)
    assert f"needs jaxlib>=0.7.0, but jaxlib {installed} is installed" in text
    assert "compiled against the XLA FFI headers of jaxlib 0.7.0" in text
    assert "pip install -U 'jax>=0.7.0' 'jaxlib>=0.7.0'" in text


def test_a_build_against_newer_headers_needs_that_jaxlib():
    _buildcheck.check_build("0.10.2", "0.12.0.1", "0.7.0")
    with pytest.raises(ImportError, match=r"needs jaxlib>=0.10.2, but jaxlib 0.9.2"):
        _buildcheck.check_build("0.10.2", "0.9.2", "0.7.0")


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("0.12.0.1", (0, 12, 0, 1, 0)),
        ("0.7.0", (0, 7, 0, 0, 0)),
        ("0.8.0.dev20250101", (0, 8, 0, 0, -1)),
        ("0.7.0rc1", (0, 7, 0, 0, -1)),
        ("0.10.2+cuda13", (0, 10, 2, 0, 0)),
    ],
)
def test_version_tuple(text, parsed):
    assert V(text) == parsed


def test_prereleases_sort_below_their_release():
    assert V("0.7.0rc1") < V("0.7.0") < V("0.7.0.1") < V("0.7.1") < V("0.10.0")
    assert V("0.8.0.dev20250101") < V("0.8.0")


def test_import_with_a_fake_old_jaxlib_raises_the_clear_error():
    """`import jaxbind` in a process whose jaxlib claims to be 0.6.2."""
    code = (
        "import jaxlib.version\n"
        "jaxlib.version.__version__ = '0.6.2'\n"
        "try:\n"
        "    import jaxbind\n"
        "except ImportError as exc:\n"
        "    print('IMPORT ERROR:', exc)\n"
        "else:\n"
        "    print('IMPORTED')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXBIND")}
    proc = run_python("-c", code, timeout=120, env=env)
    assert (
        f"IMPORT ERROR: jaxbind needs jaxlib>={_ext.jaxlib_version}, but jaxlib 0.6.2 is "
        f"installed" in proc.stdout
    ), proc.stdout + proc.stderr


def test_import_with_the_real_jaxlib_is_silent():
    code = "import jaxbind; print('OK')"
    env = dict(os.environ, JAXBIND_SILENCE_JAX_VERSION_WARNING="1")
    proc = run_python("-c", code, timeout=120, env=env)
    assert proc.stdout.strip() == "OK", proc.stdout + proc.stderr
