"""Write the golden artifacts in tests/data/ (run from tests/: python data/make_golden.py).

Each case of export_cases.py becomes <case>-format<N>-jax<V>.bin (the
serialized jax.export artifact) and a .json beside it (JAX version, jaxbind
call format, arguments and expected results). test_export.py checks that every
golden artifact still loads and runs: never delete old ones; add new ones when
the call format changes. JAX itself reads artifacts only within its own
6-month compatibility window, so goldens are written with each JAX that CI
tests (oldest and newest), and a test skips those its JAX cannot read.
"""

import json
import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent))
import jaxbind  # noqa: E402
from export_cases import CASES  # noqa: E402
from jaxbind import _ext  # noqa: E402

out = pathlib.Path(__file__).parent
for name, (fn, args) in CASES.items():
    stem = f"{name}-format{_ext.call_format}-jax{jax.__version__}"
    exp = jaxbind.export(fn)(*args)
    (out / f"{stem}.bin").write_bytes(exp.serialize())
    expected = [np.asarray(r).tolist() for r in jax.tree.leaves(jax.jit(fn)(*args))]
    (out / f"{stem}.json").write_text(json.dumps(
        {"jax": jax.__version__, "jaxbind": jaxbind.__version__, "call_format": _ext.call_format,
         "args": [np.asarray(a).tolist() for a in args], "expected": expected}))
    print("wrote", f"{stem}.bin")
