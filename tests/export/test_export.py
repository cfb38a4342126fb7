"""jax.export of programs with jaxbind ops: across processes, safely, and versioned."""

import datetime
import json
import pathlib
import re

import jax
import jax.export
import jax.numpy as jnp
import numpy as np
import pytest
from export_cases import CASES
from reference_ops import axpy
from support.ops import same_as_first
from support.processes import run_isolated

import jaxbind
from jaxbind import _buildcheck

HERE = pathlib.Path(__file__).parent
DATA = HERE.parent / "data"


LOADER = """
    import json, sys
    import numpy as np
    import jax, jax.export
    import reference_ops  # creates the bindings this program names
    out = {}
    for name in sys.argv[1:] or %r:
        exp = jax.export.deserialize(open(name + ".bin", "rb").read())
        args = [np.load(name + f".arg{i}.npy") for i in range(len(exp.in_avals))]
        res = exp.call(*args)
        out[name] = [np.asarray(r).tolist() for r in jax.tree.leaves(res)]
    print(json.dumps(out))
"""


def _export_all(tmp_path):
    expected = {}
    for name, (fn, args) in CASES.items():
        exp = jaxbind.export(fn)(*args)
        (tmp_path / f"{name}.bin").write_bytes(exp.serialize())
        for i, a in enumerate(args):
            np.save(tmp_path / f"{name}.arg{i}.npy", a)
        expected[name] = [np.asarray(r) for r in jax.tree.leaves(jax.jit(fn)(*args))]
    return expected


def test_export_then_call_in_a_fresh_process(tmp_path):
    expected = _export_all(tmp_path)
    code = LOADER % (list(CASES),)
    code = code.replace('open(name + ".bin"', f'open({str(tmp_path)!r} + "/" + name + ".bin"')
    code = code.replace("np.load(name + f", f'np.load({str(tmp_path)!r} + "/" + name + f')
    proc = run_isolated(tmp_path, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, want in expected.items():
        for g, w in zip(got[name], want):
            np.testing.assert_allclose(
                np.asarray(g, dtype=w.dtype), w, rtol=1e-6, atol=1e-6, err_msg=name
            )


def test_artifact_names_bindings_and_carries_kwargs_as_data():
    fn, args = CASES["kwargs"]
    text = jaxbind.export(fn)(*args).mlir_module()
    assert 'binding = "reference_ops._axpy"' in text
    assert "jaxbind_format = 4 : i32" in text and "loop_levels = 0 : i32" in text
    assert re.search(r"trees = (array<i8>|dense<> )", text)  # no pytree structure: 1.3 API
    # the kwargs attribute is data-only JSON, tag "J" (ASCII 74)
    assert "kwargs = array<i8: 74," in text or "dense<[74," in text


def test_missing_binding_in_the_loading_process(tmp_path):
    fn, args = CASES["nonlinear"]
    (tmp_path / "p.bin").write_bytes(jaxbind.export(fn)(*args).serialize())
    proc = run_isolated(
        tmp_path,
        f"""
        import jax, jax.export, numpy as np
        import jaxbind
        exp = jax.export.deserialize(open({str(tmp_path / "p.bin")!r}, "rb").read())
        try:
            exp.call(np.ones(5, np.float32), np.ones(5, np.float32))
        except Exception as e:
            print("ERROR:", e)
        print("alive")
    """,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no binding named 'reference_ops._nl' is registered in this process" in proc.stdout
    assert "get_linear_call / get_nonlinear_call" in proc.stdout
    assert proc.stdout.strip().endswith("alive")


def test_unexportable_kwargs_fail_at_export_time():
    x = jnp.ones(3)
    with pytest.raises(
        TypeError,
        match=r"cannot export 'reference_ops._axpy'.*scale: "
        r"builtin_function_or_method is not plain data",
    ):
        jaxbind.export(lambda x: axpy(x, x, scale=print)[0])(x)
    # picklable non-data kwargs still work under plain jit, within this process
    np.testing.assert_allclose(jax.jit(lambda x: axpy(x, x, scale=Half())[0])(x), 1.5 * x)


class Half(float):
    """A float subclass: picklable, but not plain data."""

    def __new__(cls):
        return super().__new__(cls, 0.5)


def test_tampered_kwargs_cannot_run_code(tmp_path):
    """A program whose kwargs attribute holds a pickle that would run code is refused."""
    import pickle

    from jaxbind import _callformat
    from jaxbind._rules.lowering import CPU_TARGET

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for tag in (b"P", b"J", b"H"):
        blob = tag + pickle.dumps([("scale", Evil())])
        attrs = dict(
            jaxbind_format=np.int32(1),
            binding="reference_ops._axpy",
            role="f",
            site=np.int64(
                _callformat.CallAttributes("reference_ops._axpy", "f", blob, format=1).digest
            ),
            kwargs=np.frombuffer(blob, np.uint8),
        )
        call = jax.ffi.ffi_call(CPU_TARGET, jax.ShapeDtypeStruct((3,), jnp.float32))
        with pytest.raises(Exception, match="jaxbind"):
            jax.block_until_ready(call(jnp.ones(3), jnp.ones(3), **attrs))
    assert not marker.exists()


def test_explicit_name_replacement():
    def f1(out, args, kd):
        out[0][...] = 1

    def f2(out, args, kd):
        out[0][...] = 2

    op1 = jaxbind.get_linear_call(f1, None, same_as_first, None, name="tests.replaceable")
    fn = jax.jit(lambda x: op1(x)[0])
    assert float(fn(jnp.zeros(1))[0]) == 1
    with pytest.raises(ValueError, match="pass replace=True"):
        jaxbind.get_linear_call(f2, None, same_as_first, None, name="tests.replaceable")
    op2 = jaxbind.get_linear_call(
        f2, None, same_as_first, None, name="tests.replaceable", replace=True
    )
    assert float(fn(jnp.zeros(1))[0]) == 2  # the program names the binding, now f2
    assert op2.name == op1.name == "tests.replaceable"


RELEASES = {
    v: datetime.date.fromisoformat(d)
    for v, d in json.loads((DATA / "jax_releases.json").read_text())["dates"].items()
}


def _six_months_after(day: datetime.date) -> datetime.date:
    month = day.month + 6
    year, month = day.year + (month - 1) // 12, (month - 1) % 12 + 1
    return datetime.date(year, month, min(day.day, 28 if month == 2 else 30))


def jax_promises_to_read(
    writer: str, reader: str, releases=RELEASES, today: datetime.date | None = None
) -> tuple[bool, str]:
    """Does JAX `reader` promise to read an artifact that JAX `writer` serialized?

    JAX's promise (its export docs): an artifact loads in the JAX that wrote it
    and in newer ones released within 6 months of it; one written by a newer
    JAX than the reader is not promised. Decided from the two versions and
    their release dates, before anything is loaded. A reader newer than every
    version in the table was released between the newest known release and
    today: promised only if that whole span is within the window.
    """
    if V(writer) > V(reader):
        return False, f"written by jax {writer}, newer than this jax {reader}"
    if V(writer) == V(reader):
        return True, "same version"
    written = releases[writer]
    if reader in releases:
        earliest = latest = releases[reader]
    else:
        earliest, latest = max(releases.values()), today or datetime.date.today()
    deadline = _six_months_after(written)
    if latest <= deadline:
        return True, f"jax {reader} is within 6 months of jax {writer} ({written})"
    if earliest > deadline:
        return False, (
            f"jax {writer} ({written}) is more than 6 months older than this jax {reader}"
        )
    return False, (
        f"jax {reader} is not in tests/data/jax_releases.json, so whether it is "
        f"within 6 months of jax {writer} ({written}) is unknown; add its date"
    )


V = _buildcheck.version_tuple


@pytest.mark.parametrize("golden", sorted(DATA.glob("*.bin")), ids=lambda p: p.name)
def test_golden_artifacts_still_load_and_run(golden):
    """Every golden artifact that this JAX promises to read loads and gives the recorded results."""
    meta = json.loads(golden.with_suffix(".json").read_text())
    promised, why = jax_promises_to_read(meta["jax"], jax.__version__)
    if not promised:
        pytest.skip(f"JAX does not promise to read this artifact: {why}")
    exp = jax.export.deserialize(bytearray(golden.read_bytes()))
    runs = meta.get("runs", [meta])  # symbolic-shape goldens are recorded at several sizes
    if "symbolic" in meta:
        assert len(runs) >= 2 and any(not isinstance(d, int) for a in exp.in_avals for d in a.shape)
    for run in runs:
        args = [np.asarray(a, dtype=aval.dtype) for a, aval in zip(run["args"], exp.in_avals)]
        got = [np.asarray(r) for r in jax.tree.leaves(exp.call(*args))]
        assert len(got) == len(run["expected"])
        for g, w in zip(got, run["expected"]):
            np.testing.assert_allclose(g, np.asarray(w, dtype=g.dtype), rtol=1e-5, atol=1e-5)


def test_goldens_carry_no_paths_or_locations():
    """Artifacts are files people send each other: no path of the machine that wrote them."""
    for golden in DATA.glob("*.bin"):
        assert not re.findall(rb"[\w./\\-]*\.py\b", golden.read_bytes()), golden.name


def test_every_golden_writer_is_in_the_release_table():
    for meta in DATA.glob("*.json"):
        if meta.name != "jax_releases.json":
            assert json.loads(meta.read_text())["jax"] in RELEASES, meta.name


@pytest.mark.parametrize(
    "writer, reader, promised",
    [
        ("0.12.0.1", "0.12.0.1", True),  # same version
        ("0.12.0.1", "0.10.2", False),  # newer writer: never promised
        ("0.10.2", "0.12.0.1", True),  # June 2026 -> October 2026
        ("0.7.0", "0.8.1", True),  # July 2025 -> November 2025
        ("0.7.0", "0.8.3", False),  # July 2025 -> January 2026
        ("0.7.0", "0.12.0.1", False),
    ],
)
def test_compatibility_window_from_the_version_pair(writer, reader, promised):
    assert jax_promises_to_read(writer, reader)[0] is promised


def test_unknown_newer_reader_is_decided_by_the_span_it_could_be_released_in():
    newest = max(RELEASES, key=V)
    later = ".".join(str(p) for p in (V(newest)[0], V(newest)[1] + 5, 0))
    soon = RELEASES[newest] + datetime.timedelta(days=10)
    assert jax_promises_to_read(newest, later, today=soon)[0]
    assert not jax_promises_to_read("0.7.0", later, today=soon)[0]
    undecided, why = jax_promises_to_read(newest, later, today=soon + datetime.timedelta(days=400))
    assert not undecided and "not in tests/data/jax_releases.json" in why


@pytest.mark.parametrize("platforms", [("cuda",), ("cpu", "cuda")])
def test_export_for_cuda_and_for_several_platforms(platforms):
    """Lowering for CUDA needs no GPU: the artifact names jaxbind's CUDA target."""
    fn, args = CASES["kwargs"]
    exp = jaxbind.export(fn, platforms=platforms)(*args)
    assert exp.platforms == platforms
    text = exp.mlir_module()
    assert "jaxbind_cuda" in text
    assert ("jaxbind_cpu" in text) == ("cpu" in platforms)
    if "cpu" in platforms:  # runs here, on the CPU
        rexp = jax.export.deserialize(exp.serialize())
        np.testing.assert_allclose(rexp.call(*args), jax.jit(fn)(*args), rtol=1e-6)
