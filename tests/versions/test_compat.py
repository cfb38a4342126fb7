"""The JAX version check and the newest-tested warning."""

import warnings

import jax
import pytest
from support.processes import run_python

from jaxbind import _buildcheck, _versions

OLDEST, NEWEST = _versions.OLDEST_SUPPORTED_JAX, _versions.NEWEST_TESTED_JAX


def check_jax_version(installed):
    return _buildcheck.check_jax_version(installed, OLDEST, NEWEST)


def test_installed_jax_is_supported():
    assert _buildcheck.version_tuple(jax.__version__) >= _buildcheck.version_tuple(OLDEST)


def test_newer_jax_warns_with_the_fix(monkeypatch):
    monkeypatch.delenv("JAXBIND_SILENCE_JAX_VERSION_WARNING", raising=False)
    with pytest.warns(RuntimeWarning, match=r"tested with jax up to .* found jax 99.0.0.*pip"):
        check_jax_version("99.0.0")


def test_warning_can_be_silenced(monkeypatch):
    monkeypatch.setenv("JAXBIND_SILENCE_JAX_VERSION_WARNING", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "99.0.0" in check_jax_version("99.0.0")


def test_tested_versions_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_jax_version(NEWEST) is None
        assert check_jax_version("0.7.0") is None


def test_too_old_jax_is_an_import_error():
    with pytest.raises(ImportError, match=r"needs jax>=0.7.0, found jax 0.6.2"):
        check_jax_version("0.6.2")


def test_import_with_docstrings_stripped():
    """python -OO removes docstrings; importing jaxbind and its DUCC module must still work."""
    code = "import jaxbind, jaxbind.testing; print(jaxbind.get_linear_call.__doc__)"
    proc = run_python("-OO", "-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "None"
