"""The import-time check of the extension's build against the installed jaxlib."""

import jaxlib.version
import pytest

from jaxbind import _buildcheck, _ext


def test_this_build_matches_the_installed_jaxlib():
    runtime = _buildcheck.runtime_ffi_api_version()
    assert runtime is not None
    _buildcheck.check_build(_ext.jaxlib_version, _ext.ffi_api_version,
                            jaxlib.version.__version__, runtime)


def test_newer_compatible_jaxlib_is_accepted():
    _buildcheck.check_build("0.7.0", (0, 1), "0.12.0", (0, 5))


@pytest.mark.parametrize("built, runtime", [((0, 5), (0, 1)), ((1, 0), (0, 9)), ((0, 1), (1, 1))])
def test_incompatible_build_is_an_import_error_naming_both(built, runtime):
    with pytest.raises(ImportError) as info:
        _buildcheck.check_build("0.12.0", built, "0.7.0", runtime)
    text = str(info.value)
    assert "built against jaxlib 0.12.0 (XLA FFI API %d.%d)" % built in text
    assert "installed jaxlib 0.7.0 has XLA FFI API %d.%d" % runtime in text
    assert "pip install --force-reinstall" in text


def test_import_fails_cleanly_with_a_mismatched_record(tmp_path):
    """Simulate an installed jaxlib older than the build: `import jaxbind` must refuse."""
    import subprocess
    import sys
    major, minor = _ext.ffi_api_version
    header = tmp_path / "xla" / "ffi" / "api" / "c_api.h"
    header.parent.mkdir(parents=True)
    header.write_text(f"#define XLA_FFI_API_MAJOR {major + 1}\n#define XLA_FFI_API_MINOR 0\n")
    code = ("import jax.ffi\n"
            f"jax.ffi.include_dir = lambda: {str(tmp_path)!r}\n"
            "try:\n"
            "    import jaxbind\n"
            "except ImportError as exc:\n"
            "    print('IMPORT ERROR:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert "IMPORT ERROR: jaxbind's extension was built against jaxlib" in proc.stdout, \
        proc.stdout + proc.stderr
    assert f"has XLA FFI API {major + 1}.0, which cannot run it" in proc.stdout
