"""The benchmark runner keeps working: run it on the smallest sizes (no timing asserted)."""

import json
import pathlib
import shutil

from support.processes import run_python

ROOT = pathlib.Path(__file__).parent.parent


def _run(script: str, *args, out=None):
    """benchmarks/<script>.py run with `args` (and ``--out out``): it must succeed."""
    extra = () if out is None else ("--out", out)
    proc = run_python(ROOT / "benchmarks" / f"{script}.py", *args, *extra, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_runner_quick(tmp_path):
    _run("run", "--quick", "--no-jaxbind13", out=tmp_path)
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
        _run("overhead", "--blocks", "4", "--reps", "20", out=tmp_path)
        rows = json.loads((tmp_path / "overhead.json").read_text())["results"]
        assert {(r["case"], r["size"]) for r in rows} >= {
            ("empty", 1),
            ("double", 1),
            ("grad", 1000),
        }
    _run("inplace", "--quick", out=tmp_path)  # includes: donated input not copied
    assert json.loads((tmp_path / "inplace.json").read_text())["same_memory"] is True
    _run("eager_kwargs", "--quick", out=tmp_path)
    (row,) = json.loads((tmp_path / "eager_kwargs.json").read_text())["results"]
    assert row["mbytes"] == 8 and row["eager_s"] > 0


def test_native_call_benchmark_quick(tmp_path):
    _run("pytree_call", "--quick", out=tmp_path)
    rows = json.loads((tmp_path / "pytree_call.json").read_text())["results"]
    assert {(r["case"], r["mode"]) for r in rows} == {
        (case, mode) for case in ("double", "pair") for mode in ("loop", "eager")
    }
    for r in rows:
        assert r["1.3 API"]["median_s"] > 0 and "cpu_diff_s" in r["native, out="]
    assert "| double | loop |" in (tmp_path / "pytree_call.md").read_text()


def test_nufft_benchmarks_quick(tmp_path):
    import pytest

    pytest.importorskip("ducc0")
    proc = _run("nufft_plan", "--quick", "--rounds", "1")
    assert "| NufftPlan" in proc.stdout and "| nufft2 |" in proc.stdout
    proc = _run("nufft", "--quick", "--rounds", "1")  # without jax-finufft: says so, exits 0
    assert "type 3 grad points" in proc.stdout or "jax-finufft is not installed" in proc.stdout


def test_reference_benchmarks_quick(tmp_path):
    proc = _run("reference_ducc", "--quick", out=tmp_path)  # (quick: no files)
    assert not (tmp_path / "reference_ducc.json").exists()
    for op in ("| fft | c2c |", "| nufft | nufft3 |", "| wgridder | wgridder |", "| sht | SHT |"):
        assert op in proc.stdout, op
    # reference.py summarises what it wrote: the recorded results
    shutil.copy(ROOT / "benchmarks" / "results" / "reference_ducc.json", tmp_path)
    proc = _run("reference", "--quick", out=tmp_path)
    summary = (tmp_path / "reference.md").read_text()
    assert "| 1 |" in summary and "no (folded by XLA)" in summary
    assert "| c2c | forward |" in summary and "| SHT | grad |" in summary


def test_reference_sizes_benchmark_quick(tmp_path):
    import pytest

    pytest.importorskip("ducc0")
    proc = run_python(
        ROOT / "benchmarks" / "reference_sizes.py", "--quick", "--out", tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 2 | 1 | 1000 | 16 | forward |" in proc.stdout
    assert "| 2 | 3 | 100 | 50 | grad points |" in proc.stdout
    assert not list(tmp_path.iterdir())  # --quick writes nothing


def test_reference_wgridder_sizes_benchmark_quick(tmp_path):
    import pytest

    pytest.importorskip("ducc0")
    proc = run_python(
        ROOT / "benchmarks" / "reference_wgridder_sizes.py",
        "--quick",
        "--out",
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 64² | 2000 | yes | forward |" in proc.stdout
    assert "| 64² | 2000 | yes | transpose |" in proc.stdout
    assert not list(tmp_path.iterdir())  # --quick writes nothing


def test_state_nufft_benchmark_quick():
    import pytest

    pytest.importorskip("ducc0")
    proc = _run("state_nufft", "--quick")
    assert "| NufftPlan |" in proc.stdout and "| DUCC plan.u2nu |" in proc.stdout
    assert "| nufft2 (points traced) |" in proc.stdout and ", 1 setup(s)." in proc.stdout


def test_finufft_ctypes_benchmark_quick():
    import pytest

    for package in ("numba", "finufft", "ducc0"):
        pytest.importorskip(package)
    proc = _run("finufft_ctypes", "--quick", "--rounds", "1")
    assert "| 1 | type 2 grad values |" in proc.stdout and "| numba floor |" in proc.stdout


def test_state_kernels_benchmark_quick(tmp_path):
    import pytest

    pytest.importorskip("numba")
    _run("state_kernels", "--quick", "--blocks", "1", "--iterations", "20", out=tmp_path)
    data = json.loads((tmp_path / "state_kernels.json").read_text())
    assert set(data["median"]) == {"no state", "lock", "shared", "pool", "key (lock)"}
    assert "| pool |" in (tmp_path / "state_kernels.md").read_text()


def test_kernels_report_is_the_recorded_one_and_reads_as_results(tmp_path):
    """benchmarks/results/kernels.md is what kernels.py --report makes of kernels.json (the
    generator and the record agree), and it states results, not targets."""
    results = ROOT / "benchmarks" / "results"
    shutil.copy(results / "kernels.json", tmp_path / "kernels.json")
    _run("kernels", "--report", out=tmp_path)
    text = (tmp_path / "kernels.md").read_text()
    assert text == (results / "kernels.md").read_text()
    assert "Target" not in text and "missed" not in text and "\n- " not in text


def test_drop_in_benchmark_quick():
    import pytest

    pytest.importorskip("ducc0")
    proc = _run("drop_in", "--quick", "--no-jaxbind13")
    assert "| wgridder adjoint 20k vis |" in proc.stdout


def test_state_benchmark_quick(tmp_path):
    _run("state", "--quick", out=tmp_path)
    r = json.loads((tmp_path / "state-quick.json").read_text())["results"]
    assert r["jit"] == {"setups": 1, "teardowns": 1, "runs": 3}
    assert r["export"]["setups"] == 1 and r["cache"]["hit"]["setups"] == 1
    cycles = r["cycles"]
    assert cycles["setups"] == cycles["teardowns"] and cycles["after"]["states"] == 0
    assert r["shard_map"]["lock"]["most_at_once"] == 1 and r["shard_map"]["lock"]["equal"]


def test_sharding_benchmark_quick(tmp_path):
    import pytest

    pytest.importorskip("ducc0")
    _run("sharding", "--quick", out=tmp_path)
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


def test_pjrt_host_benchmark_quick(tmp_path):
    """benchmarks/pjrt_host.py: the C host on a bundle and its portable form, and JAX (needs
    a CPU PJRT plugin and its header: skipped without, saying what to install)."""
    import pytest
    from support.pjrt_host import INSTALL, compiler, include_dir, plugin_path

    if plugin_path() is None or include_dir() is None or compiler() is None:
        pytest.skip(INSTALL)
    proc = run_python(
        ROOT / "benchmarks" / "pjrt_host.py", "--quick", "--out", tmp_path, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "pjrt_host.json").read_text())["results"]
    assert len(rows) == 4 and all(r["median_s"] > 0 for r in rows)
    assert "| C host, jaxbind runtime (C kernel) |" in (tmp_path / "pjrt_host.md").read_text()


def test_scatter_floor_benchmark_quick(tmp_path):
    import pytest

    pytest.importorskip("ducc0")
    proc = _run("scatter_floor", "--quick", out=tmp_path)
    assert "| scatter alone |" in proc.stdout and "| reference |" in proc.stdout
    assert not list(tmp_path.iterdir())  # --quick writes nothing
