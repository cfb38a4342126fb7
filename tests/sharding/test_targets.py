"""The table of FFI targets (jaxbind._rules.targets): what registration registers, the
row each call takes, and a CUDA kernel under a sharding rule keeping its
command-buffer-compatible target (lowered for CUDA on this machine's CPU, in
cuda_rule_cases.py on 4 CPU devices)."""

import json
import pathlib

import pytest
from support.processes import run_python

import jaxbind
from jaxbind._roles import NATIVE_PLATFORMS, XLA_PLATFORMS, Body
from jaxbind._rules import spmd, targets
from jaxbind._rules.targets import TARGETS, pick

HERE = pathlib.Path(__file__).parent


def test_registration_registers_the_table(monkeypatch):
    registered, batch, partitioners = [], [], []
    monkeypatch.setattr(
        targets.ffi,
        "register_ffi_target",
        lambda name, handlers, platform: registered.append((name, platform, sorted(handlers))),
    )
    monkeypatch.setattr(targets, "register_batch_partitionable", batch.append)
    monkeypatch.setattr(
        spmd, "register_call_partitioner", lambda name, *_: partitioners.append(name)
    )
    targets.register_targets()
    spmd.register()
    custom_calls = [t for t in TARGETS if t.custom_call]  # (not the reference row: none)
    assert registered == [(t.name, t.xla_platform, sorted(t.stages)) for t in custom_calls]
    assert batch == [t.name for t in TARGETS if t.batch_partitionable]
    assert partitioners == list(dict.fromkeys(t.name for t in TARGETS if t.partitioner))
    allowed = {str(c) for c in jaxbind.export_safety_checks()}
    assert all(any(t.name in a for a in allowed) for t in custom_calls)


def test_each_partitioned_row_calls_a_row_like_itself_on_each_device():
    for row in TARGETS:
        if not row.partitioner:
            assert row.per_device == ""
            continue
        device = targets.row(row.per_device, row.platform)
        assert not device.partitioner and device.calls == row.calls
        assert device.command_buffers == row.command_buffers
        assert device.handlers == row.handlers


@pytest.mark.parametrize("kind", [k for k in Body if not k.traced], ids=lambda k: k.value)
def test_every_kind_of_body_has_a_row_on_each_platform_it_runs_on(kind):
    for platform in kind.platforms:
        for effect, partitioned in [(1, 0), (0, 0), (0, 1)]:
            row = pick(platform, kind, effect=bool(effect), partitioned=bool(partitioned))
            assert row.platform == platform and row.partitioner == bool(partitioned)
            assert row.command_buffers == (kind.calls == "kernel" and not effect)
    # and a platform with custom calls' rows is one where a kind of body runs itself
    assert {t.platform for t in TARGETS if t.custom_call} == set(NATIVE_PLATFORMS)
    assert set(XLA_PLATFORMS) == set(NATIVE_PLATFORMS)


def test_a_program_made_before_the_per_device_target_reads_as_the_plain_one():
    assert spmd._per_device({"platform": "cpu"}) == "jaxbind_cpu"
    assert spmd._per_device({"platform": "cuda", "target": "jaxbind_cuda_kernel"}) == (
        "jaxbind_cuda_kernel"
    )
    assert spmd._per_device({"platform": "cuda", "target": "jaxbind_cpu"}) is None
    assert spmd._per_device({"platform": "tpu"}) is None


def test_a_cuda_kernel_with_a_rule_keeps_its_command_buffer_target():
    proc = run_python(HERE / "cuda_rule_cases.py", timeout=300, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    (row,) = [t for t in TARGETS if t.name == found["targets"][0]]
    assert found["targets"] == ["jaxbind_cuda_kernel_partitioned"], found
    assert row.command_buffers and row.partitioner
    assert found["per_device"] == "jaxbind_cuda_kernel", found  # what .spmd emits per device
    assert targets.row(found["per_device"], "cuda").command_buffers
