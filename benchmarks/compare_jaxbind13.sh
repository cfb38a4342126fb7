#!/usr/bin/env bash
# Create benchmarks/.venv-jaxbind13: JAXbind 1.3.1 from PyPI with the same jax (and, where
# the given Python has it, the same ducc0) as the given Python (default python3), and print
# that venv's python path.
# Used by run.py and drop_in.py, which drive a worker in it alternately with their own,
# and by .ci/run for the differential tests (tests/differential, JAXBIND13_PYTHON).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base_python=${1:-python3}
venv=$here/.venv-jaxbind13
jax_version=$("$base_python" -c "import jax; print(jax.__version__)")
ducc_version=$("$base_python" -c "
try:
    import ducc0
    print(ducc0.__version__)
except ImportError:
    pass")
pins=("jaxbind==1.3.1" "jax==$jax_version" "jaxlib==$jax_version")
check="import jax, jaxbind; assert jax.__version__ == '$jax_version'"
if [ -n "$ducc_version" ]; then
  pins+=("ducc0==$ducc_version")
  check="$check; import ducc0; assert ducc0.__version__ == '$ducc_version'"
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "$check" 2>/dev/null; then
  rm -rf "$venv"
  "$base_python" -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "${pins[@]}" >&2
fi
echo "$venv/bin/python"
