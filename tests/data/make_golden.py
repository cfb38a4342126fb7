"""Write the golden artifacts in tests/data/ (run from tests/: python data/make_golden.py).

Each case of export/export_cases.py (and each case of export/symbolic_cases.GOLDEN, exported
with symbolic shapes and recorded at two or more sizes under "runs") becomes
<case>-format<N>-jax<V>.bin (the serialized jax.export artifact) and a .json
beside it (JAX version, jaxbind call format, arguments and expected results).
export/test_export.py checks that every golden artifact that the running JAX promises
to read loads and gives the recorded results. Never delete old ones; add new
ones when the call format changes, and write a set with each JAX that CI tests.
A JAX used here must be listed in jax_releases.json (its release date decides
which JAX reads it).

The artifacts carry no debug locations: every source file is excluded from
JAX's user frames, so each operation's location is only its name (for
example "jit(<lambda>)/reference_ops._axpy"), and no path of this machine ends
up in the file. The script checks that before writing.

With --strip FILE.bin ..., existing artifacts written by this same JAX are
rewritten without their debug locations: the program is otherwise unchanged
(this is how the goldens written before locations were dropped lost the paths
they carried).

With --check, nothing is written: each artifact that exists for this JAX is
compared with a fresh one, ignoring locations, and the script says whether
the programs are otherwise identical (so an old golden can be rewritten
without paths and still test the same thing).

Only running the script writes: importing it does nothing but define functions
(pytest-markdown-docs imports every .py file under testpaths for its docstrings; when
the script's work ran at import, a test run rewrote the running JAX's goldens here).
"""

import dataclasses
import json
import pathlib
import re
import sys

import jax
import numpy as np
from jax._src import source_info_util  # register_exclusion: jax 0.7 - 0.12
from jax._src.export import _export  # _module_to_bytecode: jax 0.7 - 0.12
from jax._src.interpreters import mlir  # make_ir_context: jax 0.7 - 0.12
from jax._src.lib.mlir import ir, passmanager  # jax 0.7 - 0.12

HERE = pathlib.Path(__file__).parent


def leaked_paths(blob) -> list:
    return re.findall(rb"[\w./\\-]*\.py\b", bytes(blob))


def strip_locations(path: pathlib.Path) -> None:
    meta = json.loads(path.with_suffix(".json").read_text())
    if meta["jax"] != jax.__version__:
        sys.exit(f"{path.name} was written by jax {meta['jax']}; strip it with that JAX")
    exp = jax.export.deserialize(bytearray(path.read_bytes()))
    with mlir.make_ir_context():
        module = ir.Module.parse(exp.mlir_module())
        passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(module.operation)
        blob = _export._module_to_bytecode(module)
    stripped = dataclasses.replace(exp, mlir_module_serialized=blob).serialize()
    if leaked_paths(stripped):
        sys.exit(f"{path.name}: still names source files: {leaked_paths(stripped)}")
    path.write_bytes(stripped)
    print("stripped", path.name)


def without_locations(exp) -> str:
    text = exp.mlir_module()
    text = re.sub(r"^#loc\d*\s*=.*$\n?", "", text, flags=re.M)
    return re.sub(r"\s*loc\([^()]*(\([^()]*\)[^()]*)*\)", "", text)


def main(argv: list) -> None:
    sys.path[:0] = [str(HERE.parent), str(HERE.parent / "export")]  # tests/, the case scripts
    from export_cases import CASES
    from symbolic_cases import CASES as SYMBOLIC_CASES
    from symbolic_cases import GOLDEN as SYMBOLIC_GOLDEN

    import jaxbind
    from jaxbind import _ext

    source_info_util.register_exclusion("/")  # no frame is a user frame: no file locations
    jax.config.update("jax_include_full_tracebacks_in_locations", False)

    releases = json.loads((HERE / "jax_releases.json").read_text())["dates"]
    if jax.__version__ not in releases:
        sys.exit(f"add jax {jax.__version__} and its release date to jax_releases.json first")
    check = "--check" in argv

    if "--strip" in argv:
        for name in argv[argv.index("--strip") + 1 :]:
            strip_locations(pathlib.Path(name))
        return

    for name, (fn, args) in CASES.items():
        stem = f"{name}-format{_ext.call_format}-jax{jax.__version__}"
        exp = jaxbind.export(fn)(*args)
        blob = exp.serialize()
        leaked = leaked_paths(blob)
        if leaked:
            sys.exit(f"{stem}: the artifact still names source files: {leaked}")
        if check:
            path = HERE / f"{stem}.bin"
            if not path.exists():
                print("no golden", path.name)
                continue
            old = jax.export.deserialize(bytearray(path.read_bytes()))
            same = without_locations(old) == without_locations(exp)
            print(path.name, "identical but for locations" if same else "DIFFERENT")
            continue
        (HERE / f"{stem}.bin").write_bytes(blob)
        expected = [np.asarray(r).tolist() for r in jax.tree.leaves(jax.jit(fn)(*args))]
        (HERE / f"{stem}.json").write_text(
            json.dumps(
                {
                    "jax": jax.__version__,
                    "jaxbind": jaxbind.__version__,
                    "call_format": _ext.call_format,
                    "args": [np.asarray(a).tolist() for a in args],
                    "expected": expected,
                }
            )
        )
        print("wrote", f"{stem}.bin")

    # Symbolic shapes: one artifact, recorded with its expected results at several sizes.
    for name in SYMBOLIC_GOLDEN:
        case = SYMBOLIC_CASES[name]
        stem = f"{name}-format{_ext.call_format}-jax{jax.__version__}"
        exp = jaxbind.export(case.fn)(*case.arg_specs())
        blob = exp.serialize()
        if leaked_paths(blob):
            sys.exit(f"{stem}: the artifact still names source files: {leaked_paths(blob)}")
        if check:
            continue
        runs = []
        for k, size in enumerate(case.sizes):
            args = case.args(size, seed=k)
            runs.append(
                {
                    "args": [a.tolist() for a in args],
                    "expected": [np.asarray(r).tolist() for r in jax.tree.leaves(case.ref(*args))],
                }
            )
        (HERE / f"{stem}.bin").write_bytes(blob)
        (HERE / f"{stem}.json").write_text(
            json.dumps(
                {
                    "jax": jax.__version__,
                    "jaxbind": jaxbind.__version__,
                    "call_format": _ext.call_format,
                    "symbolic": [s for s, _ in case.specs],
                    "runs": runs,
                }
            )
        )
        print("wrote", f"{stem}.bin")


if __name__ == "__main__":
    main(sys.argv[1:])
