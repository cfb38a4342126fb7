#!/bin/sh
# Every check on one venv: sh run_all.sh PYTHON  (writes results/jax-<version>.txt)
set -u
cd "$(dirname "$0")"
PY=$1
V=$($PY -c "import jax; print(jax.__version__)")
OUT=results/jax-$V.txt
mkdir -p results
{
  echo "== $PY: jax $V, jaxlib $($PY -c 'import jaxlib; print(jaxlib.__version__)')"
  for mode in "" --gspmd; do
    echo "== run_route_a.py $mode"; $PY run_route_a.py $mode 2>&1 | grep -v "sharding_propagation.cc"
    echo "== experiments.py $mode"; $PY experiments.py $mode 2>&1 | grep -v "sharding_propagation.cc"
  done
  echo "== load_exported.py: the GSPMD artifacts loaded under Shardy"; $PY load_exported.py exported/$V"_gspmd" 2>&1 | grep -v "W1126\|sharding_propagation.cc"
  echo "== load_failures.py (artifact exported under Shardy)"; $PY load_failures.py exported/$V"_shardy"
  echo "== explicit_mode_types.py"; $PY explicit_mode_types.py 2>&1 | grep -v W1126
  echo "== gspmd_export_baseline.py (no jaxbind)"; $PY gspmd_export_baseline.py 2>&1 | grep -v "sharding_propagation.cc"
} > "$OUT" 2>&1
echo "$OUT"
