"""Ops that partition by a declared rule (``sharding=``, ``reduction=``).

The rule as a value (parsing, each role's rule, vmap's batch factors, the program's copy)
and every refused declaration are checked here, in this process. What XLA makes of the
rule on 4 CPU devices (collectives, results against one device, export and a fresh
process, vmap, a 2x2 mesh, two outputs, a nonlinear op's JVP and VJP, ops without a
rule) runs in partitioning_cases.py, in one subprocess per partitioner, which sets
--xla_force_host_platform_device_count=4 before importing JAX.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.processes import run_cases

import jaxbind
from jaxbind._sharding import ShardingRule, to_f, to_role
from jaxbind._spec import BatchAxes

HERE = pathlib.Path(__file__).parent


# --- the rule as a value -------------------------------------------------------------------


def test_deposit_rule_classes_its_factors():
    rule = ShardingRule.parse("m d, m -> g", ("m",))
    assert rule.operands == (("m", "d"), ("m",)) and rule.results == (("g",),)
    assert rule.reduction == ("m",) and rule.pass_through == ()
    assert rule.need_replication == ("d", "g")
    assert hash(rule) == hash(ShardingRule.parse("m  d,m->g", ["m"]))


def test_transpose_of_a_reduction_is_split_as_its_points():
    rule = ShardingRule.parse("m d, m -> g", ("m",)).for_role("T", fixed=1)
    assert rule.text == "m d, g -> m"
    assert rule.pass_through == ("m",) and rule.reduction == ()
    assert rule.need_replication == ("d", "g")


def test_transpose_of_a_matrix_product_sums_over_the_rows():
    rule = ShardingRule.parse("n k, k -> n", ("k",))
    assert rule.pass_through == ("n",) and rule.reduction == ("k",)
    t = rule.for_role("T", fixed=1)
    assert t.text == "n k, n -> k" and t.reduction == ("n",) and t.pass_through == ("k",)


def test_a_factor_some_results_lack_stays_whole_in_f_and_is_summed_in_its_vjp():
    rule = ShardingRule.parse("n k, k -> n, n")
    assert rule.pass_through == ("n",)
    assert ShardingRule.parse("m, m -> m, g").splittable == ()  # g's sum over m: undeclared
    vjp = ShardingRule.parse("n k, k -> n", ("k",)).for_role("vjp", fixed=0)
    assert vjp.text == "n k, k, n -> n k, k"
    assert vjp.summed(0, ("n", "k")) == () and vjp.summed(1, ("n", "k")) == ("n",)


def test_multilinear_and_nonlinear_roles_follow_from_f():
    rule = ShardingRule.parse("a, a -> a")
    assert rule.for_role("T1", fixed=0).text == "a, a -> a"
    energy = ShardingRule.parse("m -> ", ("m",))
    assert energy.for_role("jvp", fixed=0).text == "m, m -> "
    assert energy.for_role("jvp", fixed=0).reduction == ("m",)
    vjp = energy.for_role("vjp", fixed=0)
    assert vjp.text == "m,  -> m" and vjp.pass_through == ("m",)


def test_with_batch_adds_a_pass_through_factor_at_the_batch_axes():
    rule = ShardingRule.parse("m d, m -> g", ("m",))
    front = rule.with_batch(BatchAxes(((), (0,))), BatchAxes(((0,),)))
    assert front.text == "m d, b0 m -> b0 g"
    assert front.pass_through == ("b0",) and front.reduction == ("m",)
    native = ShardingRule.parse("b -> b").with_batch(BatchAxes(((1,),)), BatchAxes(((1,),)))
    assert native.text == "b b0 -> b b0"  # a vectorized op's axis, where it is


def test_the_programs_copy_of_a_rule_reads_back_and_is_checked():
    rule = ShardingRule.parse("m d, m -> g", ("m",)).for_role("T", 1)
    assert ShardingRule.from_config(json.loads(json.dumps(rule.to_config()))) == rule
    with pytest.raises(ValueError, match="not of version 1"):
        ShardingRule.from_config({"version": 99})
    with pytest.raises(ValueError, match="malformed"):
        ShardingRule.from_config({**rule.to_config(), "operands": [["1x"]]})


# --- refused declarations --------------------------------------------------------------------


def _deposit(out, args, kw):
    out[0][...] = 0


def _linear(**options):
    options.setdefault("name", "tests.partitioning_refused")
    options.setdefault("replace", True)  # the same name with each rule
    return jaxbind.get_linear_call(
        _deposit,
        _deposit,
        lambda x, w: (((8,), w.dtype),),
        lambda x, g: (((x.shape[0],), g.dtype),),
        **options,
    )


@pytest.mark.parametrize(
    "options, error, match",
    [
        (dict(sharding=3), TypeError, "sharding must be a string in einsum-like notation"),
        (dict(sharding="m d m g"), TypeError, "sharding must be a string"),
        (dict(sharding="m -> g -> h"), ValueError, 'exactly one "->"'),
        (dict(reduction=("m",)), TypeError, "the op declares none; add sharding="),
        (dict(sharding="m, m -> g", reduction=3), TypeError, "reduction must be a sequence"),
        (dict(sharding="m d, m -> g", reduction=("g",)), ValueError, "appears in a result"),
        (dict(sharding="m d, m -> g", reduction=("q",)), ValueError, "does not have"),
        (dict(sharding="_m d, _m -> g"), ValueError, "start with a letter"),
        (dict(sharding="m ..., m -> g"), ValueError, "ellipses"),
        (dict(sharding="m m, m -> g"), ValueError, "names the factor 'm' twice"),
        (dict(sharding="m d -> g", first_n_args_fixed=1), ValueError, "first_n_args_fixed=1"),
        (dict(sharding="m, m -> g", has_side_effect=True), TypeError, "has_side_effect=True"),
        (dict(sharding="m, m -> g", ordered=True), TypeError, "ordered=True"),
        (dict(sharding="m, m -> m", input_output_aliases={1: 0}), TypeError, "aliases"),
    ],
)
def test_refused_declaration_names_the_op_and_the_fix(options, error, match):
    with pytest.raises(error, match=match) as info:
        _linear(**options)
    text = str(info.value)
    assert "tests.partitioning_refused" in text, text
    assert "sharding" in text or "reduction" in text, text


def test_native_api_refuses_as_the_other_does():
    with pytest.raises(ValueError, match="'tests.partitioning_native_refused'.*appears in a"):

        @jaxbind.linear_op(
            shape=lambda x: x,
            name="tests.partitioning_native_refused",
            sharding="m -> g",
            reduction=("g",),
        )
        def op(x):
            return x


@pytest.mark.parametrize(
    "sharding, match",
    [
        ("m d, m, m -> g", "with 3 argument"),
        ("m d, m -> g, g", "with 2 result"),
        ("m, m -> g", "argument 0 has shape \\(16, 1\\) \\(2 axes\\), but the rule gives it 1"),
        ("m d, n -> g", None),  # m and n are different factors: fine
        ("m d, d -> g", "factor 'd' has size 1 in argument 0 but 16 in argument 1"),
    ],
)
def test_call_that_does_not_fit_the_rule_is_refused_at_trace_time(sharding, match):
    op = _linear(sharding=sharding, first_n_args_fixed=1)
    x, w = jnp.zeros((16, 1)), jnp.zeros(16)
    if match is None:
        jax.jit(lambda x, w: op(x, w)[0]).lower(x, w)
        return
    with pytest.raises(TypeError, match=match) as info:
        jax.jit(lambda x, w: op(x, w)[0]).lower(x, w)
    assert "'tests.partitioning_refused'" in str(info.value)


def _rule_of_kind(x, w, *, kind, **_):
    assert x == (16, 1) and w == (16,), (x, w)  # f's argument shapes, at f and at T
    if kind == "raise":
        raise KeyError("grid")
    return {"ok": ("m d, m -> g", ("m",)), "bad": 3, "rank": "m, m -> g", "none": None}[kind]


@pytest.mark.parametrize(
    "kind, error, match",
    [
        ("ok", None, None),
        ("none", None, None),
        ("raise", TypeError, "_rule_of_kind raised KeyError: 'grid'; the function gets"),
        ("bad", TypeError, "_rule_of_kind returned 3; return the rule"),
        ("rank", TypeError, "giving 'm, m -> g' for this call.*argument 0 has shape"),
    ],
)
def test_a_rule_per_call_from_a_function_of_the_keyword_arguments(kind, error, match):
    op = jaxbind.get_linear_call(
        _deposit,
        _deposit,
        lambda x, w, **_: (((8,), w.dtype),),
        lambda x, g, **_: (((x.shape[0],), g.dtype),),
        first_n_args_fixed=1,
        name="tests.partitioning_fn",
        replace=True,
        sharding=_rule_of_kind,
    )
    x, w = jnp.zeros((16, 1)), jnp.zeros(16)
    lower = lambda: jax.jit(jax.grad(lambda x, w: op(x, w, kind=kind)[0].sum(), 1)).lower(x, w)
    if error is None:
        lower()
        return
    with pytest.raises(error, match=match) as info:
        lower()
    assert "'tests.partitioning_fn'" in str(info.value)


def test_a_rule_function_takes_no_reduction_option():
    with pytest.raises(TypeError, match="return the reduction factors from the function"):
        _linear(sharding=_rule_of_kind, reduction=("m",))


def test_transposes_rule_is_checked_against_its_call():
    # f's rule fits f's call, and T's derived rule fits T's: both trace
    op = _linear(sharding="m d, m -> g", reduction=("m",), first_n_args_fixed=1)
    x, w = jnp.zeros((16, 1)), jnp.zeros(16)
    jax.jit(jax.grad(lambda w: op(x, w)[0].sum())).lower(w)


def test_an_op_with_a_rule_runs_on_one_device_as_without():
    def deposit(out, args, kw):
        x, w = args
        out[0][...] = 0
        np.add.at(out[0], x[:, 0].astype(int) % 8, w)

    def interp(out, args, kw):
        x, g = args
        out[0][...] = g[x[:, 0].astype(int) % 8]

    op = jaxbind.get_linear_call(
        deposit,
        interp,
        lambda x, w: (((8,), w.dtype),),
        lambda x, g: (((x.shape[0],), g.dtype),),
        first_n_args_fixed=1,
        name="tests.partitioning_one_device",
        sharding="m d, m -> g",
        reduction=("m",),
    )
    x, w = np.arange(16.0).reshape(16, 1), np.ones(16, np.float32)
    text = jax.jit(lambda x, w: op(x, w)[0]).lower(x, w).as_text()
    assert "jaxbind_partitioned" not in text
    np.testing.assert_array_equal(op(x, w)[0], np.full(8, 2.0))


def test_collectives_reads_every_form_of_replica_groups():
    from jaxbind.testing import collectives

    text = """
  %a = f64[64]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%add
  %b = (f64[64]{0}, f64[8]{0}) all-reduce(%y, %z), replica_groups=[2,2]<=[4]T(1,0), to_apply=%add
  %c = f64[4096]{0} all-gather(%p), replica_groups=mesh['axis_0'=4] {'axis_0'}, dimensions={0}
  %d = f64[8]{0} all-gather-start(%q), replica_groups={}, dimensions={0}
  ROOT %e = f64[64]{0} custom-call(%a), custom_call_target="jaxbind_cpu"
"""
    found = collectives(text)
    assert found["all-reduce"] == 2 and found["all-gather"] == 2 and found.total == 4
    assert found.groups["all-reduce"] == ("{{0,1},{2,3}}", "[2,2]<=[4]T(1,0)")
    assert found.groups["all-gather"] == ("mesh['axis_0'=4] {'axis_0'}", "{}")
    assert found.custom_calls == ("jaxbind_cpu",)


def test_check_says_what_it_did_not_check_on_a_mesh():
    x, w = np.arange(16.0).reshape(16, 1), np.ones(16)
    ruled = _linear(sharding="m d, m -> g", reduction=("m",), first_n_args_fixed=1)
    row = [r for r in jaxbind.testing.check(ruled, x, w, verbose=False) if not r.checked]
    assert any("pass mesh=" in r.detail for r in row), row
    plain = _linear(first_n_args_fixed=1, name="tests.partitioning_no_rule")
    mesh = jax.make_mesh((1,), ("p",))
    report = jaxbind.testing.check(plain, x, w, mesh=mesh, verbose=False)
    (row,) = [r for r in report if r.check == "sharding rule on a mesh"]
    assert row.status == "not checked" and "declares no sharding" in row.detail
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh.*got tuple"):
        jaxbind.testing.check(plain, x, w, mesh=(4,), verbose=False)


def test_check_fails_an_all_gather_where_the_rule_splits_the_factor():
    from jaxbind.testing import Collectives
    from jaxbind.testing.mesh import _collectives_row

    rule = ShardingRule.parse("m d, m -> g", ("m",))
    gathered = {"f": Collectives({"all-gather": 1, "all-reduce": 1})}

    split = _collectives_row(rule, "m", "m over 'p'", True, gathered)
    assert split.status == "FAIL" and "1 all-gather, 1 all-reduce" in split.detail, split
    assert "gather 1 time(s)" in split.detail
    whole = _collectives_row(rule, "d", "d over 'p'", False, gathered)
    assert whole.ok and "keeps 'd' whole" in whole.detail, whole


def test_export_allows_the_partitioned_target():
    targets = {str(c) for c in jaxbind.export_safety_checks()}
    assert any("jaxbind_partitioned" in t for t in targets), targets


# --- on 4 CPU devices, in a subprocess per partitioner -----------------------------------------


@pytest.fixture(scope="module", params=["shardy", "gspmd"])
def results(request):
    return run_cases("sharding/partitioning_cases.py", request.param)


CASES = [
    "case_deposit_has_one_all_reduce_and_no_all_gather",
    "case_native_deposit_has_one_all_reduce_and_no_all_gather",
    "case_transpose_runs_split_without_collectives",
    "case_grad_matches_one_device",
    "case_one_device_and_shard_map_lower_as_today",
    "case_shardy_rule_declares_reduction_where_jax_can",
    "case_ops_without_a_rule_are_unchanged",
    "case_mesh_2x2_reduces_over_the_split_axis_only",
    "case_vmap_composes_with_the_rule",
    "case_vmap_of_natively_batching_op_and_nested_vmap",
    "case_two_outputs_are_both_summed",
    "case_nonlinear_jvp_and_vjp_follow_the_rule",
    "case_vjp_sums_only_the_cotangents_that_lack_the_split_factor",
    "case_multilinear_transposes_follow_the_rule",
    "case_explicit_mode_types_results_by_the_rule",
    "case_uneven_split_is_not_summed_with_padding",
    "case_handler_runs_the_call_where_nothing_partitions_it",
    "case_export_loads_in_a_fresh_process",
    "case_check_on_a_mesh_compares_each_split_with_one_device",
    "case_check_on_a_mesh_fails_a_wrong_rule",
    "case_wgridder_splits_visibilities_and_sums_the_image",
    "case_nufft_types_1_and_2_split_the_points",
    "case_finufft_nufft1_and_nufft2_split_the_points",
]


NEEDS_DUCC = {
    "case_wgridder_splits_visibilities_and_sums_the_image",
    "case_nufft_types_1_and_2_split_the_points",
    "case_finufft_nufft1_and_nufft2_split_the_points",
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_on_four_devices(results, case):
    if case in NEEDS_DUCC:
        pytest.importorskip("ducc0")
    entry = results.get(case)
    assert entry is not None, f"{case} did not run"
    assert entry["ok"], entry["detail"]


def test_every_case_is_listed():
    text = (HERE / "partitioning_cases.py").read_text()
    defined = {line[4:].split("(")[0] for line in text.splitlines() if line.startswith("def case_")}
    assert defined == set(CASES)


# --- the rule as the option's value ------------------------------------------------------


@pytest.mark.parametrize("role", ["f", "T", "T1", "T2", "jvp", "vjp"])
@pytest.mark.parametrize("fixed", [0, 1])
def test_role_layouts_round_trip(role, fixed):
    args, results = ("a0", "a1", "a2"), ("r0", "r1")
    if role[1:].isdigit() and int(role[1:]) < fixed:
        return  # a fixed argument has no transpose
    mapped = to_role(role, fixed, args, results)
    assert to_f(role, fixed, *mapped, n_args=len(args)) == (args, results)
    rule = ShardingRule.parse("a b, b, c -> a, c")
    layout = to_role(role, fixed, rule.operands, rule.results)
    assert rule.for_role(role, fixed) == ShardingRule(*layout, rule.splittable)


def test_a_rule_function_runs_once_per_traced_call():
    calls = []

    def rule(x, w, **kw):
        calls.append((x, w))
        return "m d, m -> g", ("m",)

    op = _linear(sharding=rule, first_n_args_fixed=1, name="tests.partitioning_counted")
    x, w = jnp.zeros((16, 1)), jnp.zeros(16)
    jax.jit(lambda x, w: op(x, w)[0]).lower(x, w)
    assert calls == [((16, 1), (16,))]  # check_call, typed_results, rule_mark, the record
    jax.jit(lambda x, w: op(x, w)[0]).lower(x, w)
    assert len(calls) == 1  # the same shapes and keyword arguments: the same answer
    jax.jit(lambda x, w: op(x, w)[0]).lower(jnp.zeros((8, 1)), jnp.zeros(8))
    assert len(calls) == 2


def test_a_declared_rule_is_parsed_when_the_op_is_made():
    op = _linear(sharding="m  d,m->g", reduction=("m", "m"), first_n_args_fixed=1)
    declared = op.binding.options.sharding
    assert declared.rule == ShardingRule.parse("m d, m -> g", ("m",))
    assert declared.describe() == "sharding='m d,m->g', reduction=('m',)"


def test_the_batch_marking_is_the_replicated_rule_with_batch_factors():
    core = ShardingRule.replicated([2, 0], [1])
    assert core.splittable == () and core.need_replication == core.factors
    marked = core.with_batch(BatchAxes.leading(1, 2), BatchAxes.leading(1, 1))
    assert marked.text == "b0 i0_0 i0_1, b0 -> b0 o0_0"
    assert marked.pass_through == ("b0",) and marked.need_replication == core.factors
