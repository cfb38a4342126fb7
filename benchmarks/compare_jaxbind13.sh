#!/usr/bin/env bash
# Create benchmarks/.venv-jaxbind13: JAXbind 1.3.1 from PyPI with the same jax as
# the given Python (default python3), and print that venv's python path.
# Used by run.py, which drives a worker in it alternately with its own.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base_python=${1:-python3}
venv=$here/.venv-jaxbind13
jax_version=$("$base_python" -c "import jax; print(jax.__version__)")
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import jax, jaxbind; assert jax.__version__ == '$jax_version'" 2>/dev/null; then
  rm -rf "$venv"
  "$base_python" -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "jaxbind==1.3.1" "jax==$jax_version" "jaxlib==$jax_version" >&2
fi
echo "$venv/bin/python"
