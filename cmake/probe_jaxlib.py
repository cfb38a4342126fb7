"""Print the XLA FFI include directory and version of the jaxlib to build against.

Prefers the jaxlib installed in the environment that pip is installing into,
so the extension matches the XLA it will run with. pip's isolated build
environment hides that jaxlib; running this interpreter again with -I (which
ignores PYTHONPATH) sees it. If it has none, the build environment's jaxlib
(declared in pyproject.toml's build requirements) is used.
Output: two lines, the include directory and the jaxlib version.
"""
import subprocess
import sys

QUERY = (
    "import jax.ffi, jaxlib.version; "
    "print(jax.ffi.include_dir()); print(jaxlib.version.__version__)"
)

for cmd in ([sys.executable, "-I", "-c", QUERY], [sys.executable, "-c", QUERY]):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        sys.stdout.write(proc.stdout)
        sys.exit(0)
sys.stderr.write("jaxbind: no importable jax/jaxlib found to take the XLA FFI headers from:\n"
                 + proc.stderr)
sys.exit(1)
