"""jaxbind ops on 4 CPU devices: shard_map, batch-sharded jit, concurrency.

The checks live in sharding_cases.py and run in one subprocess, which sets
--xla_force_host_platform_device_count=4 before importing JAX, so the flag never
leaks into the other tests.
"""

import pytest
from support.processes import run_cases

pytestmark = pytest.mark.slow  # the subprocess that runs every case takes about 10 s


@pytest.fixture(scope="module")
def results():
    return run_cases("sharding/sharding_cases.py")


def _check(results, name):
    entry = results.get(name)
    assert entry is not None, f"{name} did not run"
    assert entry["ok"], entry["detail"]


def test_shard_map_forward_jvp_grad_vmap_match_unsharded(results):
    _check(results, "case_shard_map_forward_jvp_grad_vmap")


def test_batch_sharded_native_batching_runs_per_shard_without_gather(results):
    _check(results, "case_batch_sharded_vmap_native_runs_per_shard")


def test_batch_sharded_fallback_batching_runs_per_shard_without_gather(results):
    _check(results, "case_batch_sharded_vmap_fallback_runs_per_shard")


def test_grad_of_batch_sharded_op_has_no_collective(results):
    _check(results, "case_batch_sharded_grad_has_no_gather")


def test_unbatched_fixed_argument_runs_replicated_and_correct(results):
    _check(results, "case_unbatched_fixed_argument_is_replicated_and_correct")


def test_callable_may_call_jax_from_device_threads(results):
    _check(results, "case_callable_calling_jax_from_four_device_threads")


def test_jaxbind_op_inside_sharded_pipeline_with_collective(results):
    _check(results, "case_sharded_pipeline_with_collective")


def test_effectful_vmap_on_an_uneven_batch_runs_once_per_real_row(results):
    _check(results, "case_effectful_vmap_on_an_uneven_batch_runs_once_per_real_row")


def test_effectful_op_on_a_sharded_input_runs_once(results):
    _check(results, "case_effectful_op_on_a_sharded_input_runs_once")


def test_grad_of_an_effectful_op_on_a_sharded_input_runs_each_role_once(results):
    _check(results, "case_grad_of_an_effectful_op_on_a_sharded_input_runs_each_role_once")


def test_ordered_ops_keep_program_order_with_io_callbacks_on_sharded_inputs(results):
    _check(results, "case_ordered_ops_keep_program_order_with_io_callbacks_on_sharded_inputs")


def test_effect_dispatched_just_before_exit_runs(results):
    _check(results, "case_effect_dispatched_just_before_exit_runs")


def test_effectful_kernel_under_shardy(results):
    _check(results, "case_effectful_kernel_under_shardy")


def test_kernel_under_shard_map_and_batch_sharded_jit(results):
    _check(results, "case_kernel_under_shard_map_and_batch_sharded_jit")


def test_parallel_kernels_under_shard_map(results):
    _check(results, "case_parallel_kernels_under_shard_map")
