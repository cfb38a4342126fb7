"""The benchmark runner keeps working: run it on the smallest sizes (no timing asserted)."""

import json
import pathlib
import shutil

from support.processes import run_python

ROOT = pathlib.Path(__file__).parent.parent


def test_runner_quick(tmp_path):
    proc = run_python(
        ROOT / "benchmarks" / "run.py", "--quick", "--no-jaxbind13", "--out", tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "quick.json").read_text())
    impls = {(r["case"], r["impl"]) for r in data["results"]}
    assert {
        ("double", "jaxbind"),
        ("double", "jnp"),
        ("grad", "jaxbind"),
        ("vmap", "jaxbind"),
        ("eager", "jaxbind"),
    } <= impls
    assert all(r["median_s"] > 0 for r in data["results"])
    if shutil.which("c++"):  # the floor custom call is compiled on first use
        assert {("double", "floor"), ("grad", "floor"), ("empty", "floor")} <= impls, data["meta"][
            "errors"
        ]
    assert "| double | 1 |" in (tmp_path / "quick.md").read_text()


def test_overhead_and_inplace_quick(tmp_path):
    if shutil.which("c++"):  # the floor custom call is compiled on first use
        proc = run_python(
            ROOT / "benchmarks" / "overhead.py",
            "--blocks",
            "4",
            "--reps",
            "20",
            "--out",
            tmp_path,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = json.loads((tmp_path / "overhead.json").read_text())["results"]
        assert {(r["case"], r["size"]) for r in rows} >= {
            ("empty", 1),
            ("double", 1),
            ("grad", 1000),
        }
    proc = run_python(ROOT / "benchmarks" / "inplace.py", "--quick", "--out", tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]  # includes: donated input not copied
    assert json.loads((tmp_path / "inplace.json").read_text())["same_memory"] is True
    proc = run_python(
        ROOT / "benchmarks" / "eager_kwargs.py", "--quick", "--out", tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads((tmp_path / "eager_kwargs.json").read_text())["results"]
    assert row["mbytes"] == 8 and row["eager_s"] > 0


def test_native_call_benchmark_quick(tmp_path):
    proc = run_python(
        ROOT / "benchmarks" / "native_call.py", "--quick", "--out", tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "native_call.json").read_text())["results"]
    assert {(r["case"], r["mode"]) for r in rows} == {
        (case, mode) for case in ("double", "pair") for mode in ("loop", "eager")
    }
    for r in rows:
        assert r["1.3 API"]["median_s"] > 0 and "cpu_diff_s" in r["native, out="]
    assert "| double | loop |" in (tmp_path / "native_call.md").read_text()


def test_nufft_benchmarks_quick(tmp_path):
    import pytest

    pytest.importorskip("ducc0")
    proc = run_python(
        ROOT / "benchmarks" / "nufft_plan.py", "--quick", "--rounds", "1", timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| NufftPlan" in proc.stdout and "| nufft2 |" in proc.stdout
    proc = run_python(ROOT / "benchmarks" / "nufft.py", "--quick", "--rounds", "1", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]  # without jax-finufft: says so, exits 0
    assert "type 3 grad points" in proc.stdout or "jax-finufft is not installed" in proc.stdout


def test_reference_benchmarks_quick(tmp_path):
    for script in ("reference_fft_nufft", "reference_wgridder_sht"):  # (quick: no files)
        proc = run_python(ROOT / "benchmarks" / f"{script}.py", "--quick", "--out", tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # reference.py summarises what they wrote: the recorded results
        shutil.copy(ROOT / "benchmarks" / "results" / f"{script}.json", tmp_path)
    proc = run_python(ROOT / "benchmarks" / "reference.py", "--quick", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = (tmp_path / "reference.md").read_text()
    assert "| 1 |" in summary and "no (folded by XLA)" in summary
    assert "| c2c | forward |" in summary and "| SHT | grad |" in summary


def test_state_nufft_benchmark_quick():
    import pytest

    pytest.importorskip("ducc0")
    proc = run_python(ROOT / "benchmarks" / "state_nufft.py", "--quick", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| NufftPlan |" in proc.stdout and "| DUCC plan.u2nu |" in proc.stdout
    assert "| nufft2 (points traced) |" in proc.stdout and ", 1 setup(s)." in proc.stdout


def test_finufft_ctypes_benchmark_quick():
    import pytest

    for package in ("numba", "finufft", "ducc0"):
        pytest.importorskip(package)
    proc = run_python(
        ROOT / "benchmarks" / "finufft_ctypes.py", "--quick", "--rounds", "1", timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 1 | type 2 grad values |" in proc.stdout and "| numba floor |" in proc.stdout


def test_state_kernels_benchmark_quick(tmp_path):
    import pytest

    pytest.importorskip("numba")
    proc = run_python(
        ROOT / "benchmarks" / "state_kernels.py",
        "--quick",
        "--blocks",
        "1",
        "--iterations",
        "20",
        "--out",
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "state_kernels.json").read_text())
    assert set(data["median"]) == {"no state", "lock", "shared", "pool", "key (lock)"}
    assert "| pool |" in (tmp_path / "state_kernels.md").read_text()


def test_kernels_report_is_the_recorded_one_and_reads_as_results(tmp_path):
    """benchmarks/results/kernels.md is what kernels.py --report makes of kernels.json (the
    generator and the record agree), and it states results, not targets."""
    results = ROOT / "benchmarks" / "results"
    shutil.copy(results / "kernels.json", tmp_path / "kernels.json")
    proc = run_python(ROOT / "benchmarks" / "kernels.py", "--report", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "kernels.md").read_text()
    assert text == (results / "kernels.md").read_text()
    assert "Target" not in text and "missed" not in text and "\n- " not in text


def test_drop_in_benchmark_quick():
    import pytest

    pytest.importorskip("ducc0")
    proc = run_python(
        ROOT / "benchmarks" / "drop_in.py",
        "--quick",
        "--no-jaxbind13",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| wgridder adjoint 20k vis |" in proc.stdout


def test_state_benchmark_quick(tmp_path):
    proc = run_python(ROOT / "benchmarks" / "state.py", "--quick", "--out", tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "state-quick.json").read_text())["results"]
    assert r["jit"] == {"setups": 1, "teardowns": 1, "runs": 3}
    assert r["export"]["setups"] == 1 and r["cache"]["hit"]["setups"] == 1
    cycles = r["cycles"]
    assert cycles["setups"] == cycles["teardowns"] and cycles["after"]["states"] == 0
    assert r["shard_map"]["lock"]["most_at_once"] == 1 and r["shard_map"]["lock"]["equal"]


def test_sharding_benchmark_quick(tmp_path):
    import pytest

    pytest.importorskip("ducc0")
    proc = run_python(
        ROOT / "benchmarks" / "sharding.py", "--quick", "--out", tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "sharding-quick.json").read_text())["results"]
    ruled = r["mesh"]["declared rule"]
    assert ruled["collectives"] == {"all-reduce": 1}, r["mesh"]  # no all-gather of points
    assert "all-gather" in r["mesh"]["no rule (today)"]["collectives"]
    assert ruled["error vs one device"] < 1e-10 and ruled["gradient error vs one device"] < 1e-10
    assert r["export"]["collectives"] == {"all-reduce": 1}, r["export"]
    assert r["export"]["error vs one device"] < 1e-10
    for process in r["two processes"]:
        assert process["collectives"] == {"all-reduce": 1}, process
        assert process["error vs one device"] < 1e-10


def test_reference_sht_benchmark_quick():
    import pytest

    pytest.importorskip("ducc0")
    proc = run_python(ROOT / "benchmarks" / "reference_sht.py", "--quick", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 2 | transpose | reference |" in proc.stdout and " MB |" in proc.stdout


def _benchmark_modules() -> dict:
    """{stem: the stems of benchmarks/ it imports (anywhere in it, nested imports too)}."""
    import ast

    here = ROOT / "benchmarks"
    stems = {p.stem for p in here.glob("*.py")}
    graph = {}
    for path in here.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
        graph[path.stem] = found & stems - {path.stem}
    return graph


def test_every_benchmark_script_uses_the_harness_timer_and_arguments():
    """One timer, one command line: no script times with its own clock or parses its own
    flags; every script's command line is the harness's `arguments`."""
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.stem == "_harness":
            continue
        text = path.read_text()
        for own in ("perf_counter", "process_time", "time.time(", "argparse"):
            assert own not in text, f"{path.name} has its own timer or parser ({own})"
        if not path.stem.startswith("_"):  # a script, not a worker module
            assert "arguments(" in text and "_harness import" in text, path.name


def test_benchmarks_import_no_cycle():
    graph = _benchmark_modules()
    assert graph["gpu"] == {"_cuda_native", "_harness"} and graph["_harness"] == set()
    done, path = set(), []

    def visit(stem):
        assert stem not in path, f"import cycle: {' -> '.join([*path, stem])}"
        if stem in done:
            return
        path.append(stem)
        for child in graph[stem]:
            visit(child)
        path.pop()
        done.add(stem)

    for stem in graph:
        visit(stem)


def test_results_hold_what_save_writes():
    """benchmarks/results/ holds each run's <stem>.json and <stem>.md (and run.py's plots);
    hand-written analyses live apart, in benchmarks/analyses/."""
    results = ROOT / "benchmarks" / "results"
    for md in results.glob("*.md"):
        assert md.with_suffix(".json").exists(), f"{md.name}: an analysis, not a result"
