#!/usr/bin/env bash
# The GPU checks in one run on a lent GPU machine (docs/gpu.md, "Running the GPU checks"),
# on Python 3.12 with the machine's own JAX, CuPy and numba, and jaxbind and ducc0 from
# wheels carried in .whl/. Writes its logs and results under $OUT (or ./device-out).
#
# Prepare here, once per commit (the folder .whl/ is ignored):
#   echo /.whl/ >> .git/info/exclude
#   rm -rf .whl && PYENV_VERSION=3.12.1 python3.12 -m pip wheel -q --no-deps -w .whl .
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl ducc0==0.42.0
# Then run it there with the device tool: command "bash tests/gpu/device_run.sh",
# carry [".whl"], a timeout that leaves room to run it again (its parts end by 480 s).
#
# Parts, each with its own time limit, each a log under $OUT:
#   gpu_tests.log     tests/gpu (every GPU test), then the host-memory plumbing tests
#   docs_gpu.log      the docs' GPU blocks
#   gpu_libraries.*   benchmarks/gpu_libraries.py (cuFFT; cufinufft where it loads)
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  for p in jax jaxlib jaxbind ducc0 cupy-cuda13x numba; do
    python3 -c "import importlib.metadata as m; print('$p', m.version('$p'))" 2>/dev/null ||
      echo "$p: not installed"
  done
  python3 -c 'import jax; print(jax.devices())'
} 2>&1 | tee "$out/versions.txt"
# (the tests import the installed jaxbind: src/ is not on the path)
timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu \
  tests/runtime/test_gpu_plumbing.py tests/kernels/test_stream_kernels.py \
  tests/contrib/test_cuda_libraries.py 2>&1 | tee "$out/gpu_tests.log" | tail -40
timeout 90 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
  tests/docs/test_docs_blocks.py -k gpu 2>&1 | tee "$out/docs_gpu.log" | tail -15
(cd benchmarks && timeout 150 python3 gpu_libraries.py --rounds 5 --out "$out") 2>&1 |
  tee "$out/gpu_libraries.log" | tail -30
echo "device_run: done $(date -u)"
