"""Every JAX-internal name jaxbind uses, in one place.

jaxbind supports jax 0.7.0 up to the newest release it was tested with
(_versions.NEWEST_TESTED_JAX). Each import below notes the versions it was checked on;
when JAX moves one, the shim goes here and nowhere else.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import jax
import jax.ffi as ffi  # public since jax 0.4.38
from jax._src import config as _config  # enum_state: jax 0.7 - 0.12
from jax._src import core as _core  # jax 0.7 - 0.12
from jax._src.interpreters import mlir as mlir_internal  # custom_call, ir_attribute: jax 0.7
from jax._src.lib.mlir import ir  # jax 0.7 - 0.12
from jax._src.lib.mlir.dialects import hlo  # jax 0.7 - 0.12
from jax.core import ShapedArray  # jax 0.7 - 0.12
from jax.extend.core import Primitive  # jax 0.4.36 - 0.12
from jax.interpreters import ad, batching, mlir  # jax 0.7 - 0.12

__all__ = [
    "FFI_SIDE_EFFECT",
    "InconclusiveDimensionOperation",
    "STATES_KEY_TRACES",
    "ORDERED_IO_EFFECT",
    "Primitive",
    "ShapedArray",
    "XLA_CPU_ROOT_CALL_ABORTS",
    "abstract_token",
    "ad",
    "all_reduce_sum",
    "auto_partitioned_devices",
    "aval_of",
    "batching",
    "collect_jax_garbage",
    "config_use_shardy",
    "define_primitive",
    "define_jit_keyed_state",
    "enable_x64",
    "explain_checkpoint_effects",
    "explicit_mesh",
    "explicit_spec",
    "explicitly_sharded",
    "ffi",
    "for_export",
    "host_callbacks",
    "lowering_platforms",
    "hlo",
    "hlo_sharding",
    "instantiate_zeros",
    "ir",
    "is_undefined_primal",
    "local_module_bytecode",
    "mlir",
    "mlir_internal",
    "no_effects",
    "not_mapped",
    "output_aval",
    "parse_attribute_dict",
    "register_batch_partitionable",
    "register_call_partitioner",
    "register_cache",
    "run_once_sharding",
    "sdy_sharding_rule",
    "set_sharding",
    "tuple_sharding",
    "tracing",
    "zero_tangent",
]


# jax.errors since jax 0.8; the same class in jax._src.core from 0.7 to 0.12
InconclusiveDimensionOperation = _core.InconclusiveDimensionOperation
no_effects = _core.no_effects  # jax 0.7 - 0.12
abstract_token = _core.abstract_token  # jax 0.7 - 0.12

# JAX's own effects (jax 0.7 - 0.12), which jaxbind's calls share (see _rules.effects):
# ffi_call's side effect and io_callback's ordered one.
from jax._src.callback import _OrderedIOEffect as ORDERED_IO_EFFECT  # noqa: E402
from jax._src.ffi import _FfiEffect as FFI_SIDE_EFFECT  # noqa: E402

not_mapped = None  # batching.not_mapped is None in jax 0.7 - 0.12 (not exported in 0.12)
instantiate_zeros = ad.instantiate_zeros
is_undefined_primal = ad.is_undefined_primal


def output_aval(shape, dtype, inputs) -> ShapedArray:
    """An output aval that varies over every manual mesh axis its inputs vary over.

    Inside shard_map, JAX tracks the mesh axes each value varies over; a jaxbind
    output depends on all inputs, so it varies over the axes of the input that
    varies most. jax 0.7: `aval.vma` (a frozenset) and ShapedArray(..., vma=);
    jax 0.12: `aval.mat` (its `.varying`) and ShapedArray(..., manual_axis_type=).
    """
    if not inputs:
        return ShapedArray(shape, dtype)
    if hasattr(inputs[0], "mat"):  # jax 0.12
        most = max(inputs, key=lambda a: len(a.mat.varying))
        if not most.mat.varying:
            return ShapedArray(shape, dtype)
        return ShapedArray(
            shape, dtype, sharding=_core.get_cur_mesh_sharding(), manual_axis_type=most.mat
        )
    vma = frozenset().union(*(getattr(a, "vma", None) or () for a in inputs))
    if not vma:
        return ShapedArray(shape, dtype)
    return ShapedArray(shape, dtype, sharding=_core.get_cur_mesh_sharding(), vma=vma)


def explain_checkpoint_effects(explain) -> None:
    """Make the error of jax.checkpoint's partial evaluation over effectful calls say which
    jaxbind bindings have the effects: `explain(jaxpr)` gives the text, or None.

    JAX refuses effects that are not remat-allowed there and names only the effect
    objects, which jaxbind shares with io_callback and ffi_call. The wrapper changes
    nothing else: the rule runs as before, and other errors pass through
    (remat_p's partial-eval rule in jax._src.ad_checkpoint: jax 0.7 - 0.12).
    """
    from jax._src import ad_checkpoint
    from jax._src.interpreters import partial_eval as pe

    rule = pe.custom_partial_eval_rules.get(ad_checkpoint.remat_p)
    if rule is None or getattr(rule, "_jaxbind_explained", False):
        return

    @functools.wraps(rule)
    def explained(trace, *tracers, jaxpr, **params):
        try:
            return rule(trace, *tracers, jaxpr=jaxpr, **params)
        except NotImplementedError as exc:
            text = explain(jaxpr) if "Effects not supported" in str(exc) else None
            if text is None:
                raise
            raise NotImplementedError(text) from exc

    explained._jaxbind_explained = True  # type: ignore[attr-defined]  # a function attribute
    pe.custom_partial_eval_rules[ad_checkpoint.remat_p] = explained


def define_primitive(prim, *, impl, abstract_eval, lowerings, jvp, transpose, batch) -> None:
    """Give JAX the rules of `prim` (once per process, for jaxbind's one primitive).

    The rule tables are the ones JAX documents for primitives defined outside it
    (jax.interpreters.ad / batching / mlir): jax 0.7 - 0.12.
    """
    prim.def_impl(impl)
    prim.def_effectful_abstract_eval(abstract_eval)  # -> (output avals, effects)
    for platform, rule in lowerings.items():  # platform None: every other platform
        mlir.register_lowering(prim, rule, platform=platform)
    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose
    batching.primitive_batchers[prim] = batch


# Whether a configuration state can be part of JAX's trace context (jax 0.8 - 0.12): in jax
# 0.7 the trace context is a fixed list, and a state keys the C++ jit cache only, while
# the traced and lowered programs behind it are cached by that list alone.
STATES_KEY_TRACES = "include_in_trace_context" in inspect.signature(_config.enum_state).parameters
# Whether a configuration state takes a parser that returns the value (jax 0.8 - 0.12), or a
# validator that only raises (jax 0.7)
STATE_TAKES_PARSER = "parser" in inspect.signature(_config.State.__init__).parameters


def define_jit_keyed_state(name: str, values: tuple[str, ...], default: str, help: str):
    """A JAX configuration state that is part of every jit's cache key (as jax_enable_x64
    is), so that programs traced under one value are not reused under another, eager
    calls and lowering caches included; the state is its own context manager
    (``with state("x"): ...``). jax._src.config.State: include_in_trace_context=True
    with include_in_jit_key=True (jit's C++ dispatch) in jax 0.8 - 0.12, include_in_jit_key
    alone in jax 0.7 (which has no trace context).

    Made as JAX's enum_state makes a state, but not registered as a JAX option: enum_state
    would read the environment variable ``name.upper()`` (and refuse at import any value
    outside `values`), and jax.config.update would set it behind the caller's back. The
    caller reads its own environment variable into `default`; no other is read."""

    def parser(value):
        if not isinstance(value, str) or value not in values:
            raise ValueError(f"{name}: {value!r} is not one of {values}")
        return value

    keys = {"include_in_jit_key": True}
    if STATES_KEY_TRACES:
        keys["include_in_trace_context"] = True
    if STATE_TAKES_PARSER:  # a parser that returns the value (jax 0.8 - 0.12)
        return _config.State(name, default, help, parser=parser, **keys)
    return _config.State(name, default, help, validator=parser, **keys)  # jax 0.7: a validator


def host_callbacks(ctx) -> int:
    """How many host callbacks and keep-alives (what jax.pure_callback and io_callback, custom
    calls back into Python, leave; jaxbind's native lowering adds keep-alives too) the module
    a lowering rule lowers into has so far (ModuleContext.host_callbacks and .keepalives:
    jax 0.7 - 0.12)."""
    module = ctx.module_context
    return len(module.host_callbacks) + len(module.keepalives)


def tracing() -> bool:
    """Whether JAX is tracing a function now (jit, grad, vmap, eval_shape, ...): a value set
    here would be read only when the traced program is lowered, after the trace (jax._src.core
    trace_state_clean: jax 0.7 - 0.12)."""
    return not _core.trace_state_clean()


def lowering_platforms(ctx) -> tuple[str, ...]:
    """The platforms a lowering rule lowers for: a rule shared by several platforms of a
    multi-platform export sees those (ctx.platforms), else the module's (jax 0.7 - 0.12)."""
    return tuple(getattr(ctx, "platforms", None) or ctx.module_context.platforms)


def for_export(ctx) -> bool:
    """Whether this lowering is for jax.export (LoweringParameters.for_export: jax 0.7 - 0.12)."""
    params = getattr(ctx.module_context, "lowering_parameters", None)
    return bool(getattr(params, "for_export", False))


# The abstract value of an array or tracer: core.typeof in jax 0.7 - 0.12 (also public as
# jax.typeof); core.get_aval, its older name, in jax 0.7 - 0.9 only (gone by 0.10).
aval_of = getattr(_core, "typeof", None) or _core.get_aval


def zero_tangent(primal) -> ad.Zero:
    """A symbolic zero tangent for `primal`: float0 for integer and boolean arrays, as JAX
    gives its own integer outputs (Zero.from_primal_value: jax 0.7 - 0.9, gone in 0.10)."""
    return ad.Zero(aval_of(primal).to_tangent_aval())


def enable_x64():
    """A context in which jax_enable_x64 is on, for this thread only: jax.enable_x64(True)
    in jax 0.8 - 0.12; jax.experimental.enable_x64() in jax 0.7."""
    scope = getattr(jax, "enable_x64", None)
    if callable(scope):
        return scope(True)
    from jax import experimental

    return experimental.enable_x64()  # jax 0.7 only


def config_use_shardy() -> bool:
    """Whether JAX partitions with Shardy (jax_use_shardy_partitioner: jax 0.7 - 0.12)."""
    return bool(jax.config.jax_use_shardy_partitioner)


def sdy_sharding_rule(
    rule: str,
    need_replication: tuple[str, ...],
    operand_types,
    result_types,
    reduction: tuple[str, ...] = (),
):
    """A Shardy sharding rule attribute from einsum-like notation ("b i, b -> b j").

    jax._src.custom_partitioning_sharding_rule: jax 0.7 - 0.12. Factors that must be
    replicated (need_replication_factors) and factors summed over (reduction_factors)
    can be declared in jax 0.10 - 0.12, not in 0.7; there every factor is
    pass-through in the rule, and the partitioner (the batch partitioner, or
    jaxbind's own for declared rules) decides which are split.
    """
    from jax._src import custom_partitioning_sharding_rule as _rule

    takes = _rule_parameters()
    extra = {}
    if "need_replication_factors" in takes:
        extra["need_replication_factors"] = tuple(need_replication)
    if "reduction_factors" in takes and reduction:
        extra["reduction_factors"] = tuple(reduction)
    parsed = _rule.str_to_sdy_sharding_rule(rule, **extra)
    return _rule.sdy_sharding_rule_to_mlir(parsed, list(operand_types), list(result_types))


@functools.cache
def _rule_parameters() -> frozenset[str]:
    import inspect

    from jax._src import custom_partitioning_sharding_rule as _rule

    return frozenset(inspect.signature(_rule.str_to_sdy_sharding_rule).parameters)


def register_batch_partitionable(target: str) -> None:
    """Let XLA's SPMD partitioner split calls of `target` along their leading batch axes.

    jax.ffi.register_ffi_target_as_batch_partitionable: jax 0.7 - 0.12.
    """
    ffi.register_ffi_target_as_batch_partitionable(target)


import jaxlib  # noqa: E402

from ._buildcheck import version_tuple as _version_tuple  # noqa: E402


def _find_collect_garbage():
    """jaxlib's function that drops the references JAX still holds to host arrays it was
    given (released lazily, at the next JAX call): ``_jax.collect_garbage`` in jaxlib
    0.7 - 0.12; ``xla_extension.collect_garbage`` before. None if neither exists."""
    from jax._src import lib

    for module in ("_jax", "xla_extension"):
        found = getattr(getattr(lib, module, None), "collect_garbage", None)
        if found is not None:
            return found
    return None


_collect_garbage = _find_collect_garbage()


def collect_jax_garbage() -> None:
    if _collect_garbage is not None:
        _collect_garbage()


def run_once_sharding(ctx, avals_out):
    """The sharding that makes a side-effecting call run once, on one device, as JAX's
    io_callback does (jax._src.callback._callback_op_sharding, jax 0.7 - 0.12): maximal
    on device 0 under automatic partitioning, manual inside a fully manual shard_map,
    None without partitioning (or where io_callback itself refuses)."""
    from jax._src import callback

    context = ctx.module_context.axis_context
    try:
        try:
            return callback._callback_op_sharding(context, None, avals_out)
        except TypeError:  # older: (axis_context, sharding)
            return callback._callback_op_sharding(context, None)
    except NotImplementedError:  # partly manual shard_map: left to XLA, as before
        return None


def emit_host_callback(ctx, callback, token, operands, sharding):
    """JAX's host-callback custom call (the one io_callback lowers to), running the
    Python function `callback` on NumPy arrays, with side effects, once where `sharding`
    puts it: (results, token out). jax._src.callback.emit_python_callback: jax 0.7 - 0.12
    (returns_token since 0.8; 0.7 always returns the token it is given)."""
    from jax._src import callback as _callback

    results, token_out, _ = _callback.emit_python_callback(
        ctx,
        callback,
        token,
        list(operands),
        ctx.avals_in,
        ctx.avals_out,
        has_side_effect=True,
        sharding=sharding,
    )
    shardings = getattr(sharding, "shardings", None)  # Shardy's per-result list
    if token is not None and shardings and ctx.avals_out:
        # jax 0.7 puts the token result on every device (replicated), which XLA refuses
        # for a call with side effects (fixed in 0.8): place it with the other results
        token_sharding = type(shardings[0])(
            mesh_shape=(), dim_shardings=(), logical_device_ids=shardings[0].logical_device_ids
        )
        set_sharding(ctx, token_out.owner, type(sharding)((token_sharding, *shardings)))
    return results, token_out


def auto_partitioned_devices(ctx) -> int:
    """How many devices XLA partitions this program over automatically (1: none).
    jax._src.sharding_impls.ShardingContext (num_devices): jax 0.7 - 0.12."""
    from jax._src import sharding_impls

    context = ctx.module_context.axis_context
    if not isinstance(context, sharding_impls.ShardingContext):
        return 1
    count = getattr(context, "num_devices", None)
    if count is None:
        count = len(context.device_assignment or ())
    return int(count or 1)


# --- XLA's SPMD partitioner: custom calls partitioned by jaxbind (_rules.spmd) -------------


def register_call_partitioner(name: str, partition, infer, propagate_user) -> None:
    """Have XLA's SPMD partitioner ask these Python callbacks how to split custom calls of
    target `name`, on the CPU now and on every PJRT plugin (CUDA) when it loads, as
    custom_partitioning registers its own: jax._src.lib.xla_client
    .register_custom_call_partitioner and jax._src.xla_bridge.register_plugin_callbacks,
    jax 0.7 - 0.12 (callbacks: (arg_shapes, arg_shardings, result_shape, result_sharding,
    backend_config) -> (module bytecode, arg shardings, result sharding);
    (arg_shapes, arg_shardings, result_shape, backend_config) -> result sharding;
    (user_sharding, shape, backend_config) -> sharding)."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    callbacks = dict(
        name=name,
        prop_user_sharding=propagate_user,
        partition=partition,
        infer_sharding_from_operands=infer,
        can_side_effecting_have_replicated_sharding=True,
    )
    xla_client.register_custom_call_partitioner(**callbacks)
    xla_bridge.register_plugin_callbacks(
        functools.partial(xla_client.register_custom_call_partitioner, **callbacks)
    )


def hlo_sharding(text: str | None = None):
    """An XLA HloSharding from its text ("{devices=[4,1]<=[4]}"), or replicated (None).
    jax._src.lib.xla_client.HloSharding (from_string, replicate, tuple_sharding, tile,
    tile_assignment_dimensions / _devices, is_replicated, is_tiled): jax 0.7 - 0.12."""
    from jax._src.lib import xla_client

    if text is None:
        return xla_client.HloSharding.replicate()
    return xla_client.HloSharding.from_string(text)


def tuple_sharding(shape, shardings):
    """HloSharding.tuple_sharding(shape, shardings): jax 0.7 - 0.12."""
    from jax._src.lib import xla_client

    return xla_client.HloSharding.tuple_sharding(shape, list(shardings))


def local_module_bytecode(closed_jaxpr, platform: str) -> bytes:
    """The program of one device's part of a partitioned call, as XLA's partitioner
    wants it back: the closed jaxpr lowered as a fully manual program (a one-device mesh
    marks the context; its collectives name their devices themselves), as bytecode.
    jax._src.interpreters.mlir.build_mlir_module_helper(closed_jaxpr, *, name,
    platforms, backend, axis_context) and module_to_bytecode,
    jax._src.sharding_impls.SPMDAxisContext, jax._src.mesh.Mesh: jax 0.7 - 0.12, as
    custom_partitioning builds its own."""
    import numpy as np
    from jax._src import mesh as mesh_lib
    from jax._src import sharding_impls

    mesh = mesh_lib.Mesh(np.array(jax.devices()[:1]), ("jaxbind_local",))
    context = sharding_impls.SPMDAxisContext(mesh, frozenset(mesh.axis_names))
    module = mlir_internal.build_mlir_module_helper(
        closed_jaxpr,
        name="jaxbind_local",
        platforms=[platform],
        backend=None,
        axis_context=context,
    )
    return mlir_internal.module_to_bytecode(module)


def all_reduce_sum(ctx, x, groups) -> list:
    """stablehlo.all_reduce (sum) of `x` over `groups` of global device ids, with a
    device-to-device channel (hlo.AllReduceOp, hlo.ChannelHandle,
    mlir.DEVICE_TO_DEVICE_TYPE, mlir.dtype_to_ir_type: jax 0.7 - 0.12)."""
    import numpy as np

    (aval,) = ctx.avals_in
    op = hlo.AllReduceOp(
        [x.type],
        [x],
        replica_groups=ir.DenseIntElementsAttr.get(np.asarray(groups, dtype=np.int64)),
        channel_handle=hlo.ChannelHandle.get(1, mlir_internal.DEVICE_TO_DEVICE_TYPE),
        use_global_device_ids=ir.BoolAttr.get(True),
    )
    scalar = ir.RankedTensorType.get([], mlir_internal.dtype_to_ir_type(aval.dtype))
    block = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        hlo.return_([hlo.add(*block.arguments)])
    return list(op.results)


def parse_attribute_dict(text: str) -> dict:
    """An MLIR dictionary attribute's text ("{binding = \"x\", site = 5 : i64}", as
    XLA hands a typed-FFI custom call's attributes to a partitioner callback) as Python
    values: str, int, or bytes for integer arrays (ir.Attribute.parse, DictAttr,
    StringAttr, IntegerAttr, DenseIntElementsAttr: jax 0.7 - 0.12)."""
    import numpy as np

    values: dict = {}
    with mlir_internal.make_ir_context():
        found = ir.DictAttr(ir.Attribute.parse(text))
        for k in range(len(found)):
            named = found[k]
            attr = named.attr  # downcast to its own type (jax 0.7 - 0.12)
            if isinstance(attr, ir.StringAttr):
                values[named.name] = attr.value
            elif isinstance(attr, ir.IntegerAttr):
                values[named.name] = attr.value
            elif isinstance(attr, ir.DenseIntElementsAttr):
                values[named.name] = np.array(attr).tobytes()
    return values


def explicit_mesh(avals) -> Any:
    """The abstract mesh of JAX's explicit sharding mode, if an aval is sharded on it
    (its axes typed AxisType.Explicit), else None (auto mode, no mesh, or inside
    shard_map, whose values vary over manual axes). aval.sharding (NamedSharding over an
    AbstractMesh with axis_types), jax.sharding.AxisType: jax 0.7 - 0.12."""
    from jax.sharding import AxisType

    found = None
    for aval in avals:
        if getattr(aval, "vma", None) or getattr(getattr(aval, "mat", None), "varying", None):
            return None
        mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
        if found is None and any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ())):
            found = mesh
    return found


def explicit_spec(aval, mesh) -> tuple:
    """Per axis of `aval`, the explicit mesh axes it is sharded over (a name, a tuple of
    names, or None): aval.sharding.spec, jax 0.7 - 0.12."""
    from jax.sharding import AxisType

    explicit = {n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Explicit}
    spec = tuple(getattr(aval.sharding, "spec", ()) or ())
    entries = []
    for entry in spec + (None,) * (aval.ndim - len(spec)):
        names = (entry,) if isinstance(entry, str) else tuple(entry or ())
        entries.append(entry if names and set(names) <= explicit else None)
    return tuple(entries[: aval.ndim])


def explicitly_sharded(aval, mesh, entries) -> ShapedArray:
    """`aval` typed as sharded over `mesh` by `entries` (one per axis), as explicit mode
    types values (ShapedArray(..., sharding=NamedSharding(abstract mesh, spec)): jax 0.7 -
    0.12)."""
    from jax.sharding import NamedSharding, PartitionSpec

    return ShapedArray(
        aval.shape, aval.dtype, sharding=NamedSharding(mesh, PartitionSpec(*entries))
    )


def set_sharding(ctx, op, sharding) -> None:
    """jax._src.interpreters.mlir.set_sharding: (module_context, op, sharding) in jax 0.8 -
    0.12, (op, sharding) in jax 0.7."""
    try:
        mlir_internal.set_sharding(ctx.module_context, op, sharding)
    except TypeError:
        mlir_internal.set_sharding(op, sharding)


def register_cache(cache, for_what: str) -> None:
    """Have ``jax.clear_caches()`` clear `cache` too (an object with ``cache_clear``,
    ``cache_info`` and ``cache_keys``; held weakly). jax._src.util.register_cache in
    jax 0.7 - 0.12; without it, the cache is cleared only with its owner."""
    from jax._src import util

    register = getattr(util, "register_cache", None)
    if register is not None:
        register(cache, for_what)


# jaxlib 0.7's CPU compiler aborts on a root custom call fed by a concatenate
# (fixed in 0.8); _rules.jaxlib07 works around it.
XLA_CPU_ROOT_CALL_ABORTS = _version_tuple(jaxlib.__version__)[:2] < (0, 8)

# jax 0.7 cannot transpose the gridder reference's w-stacking (a scan of conditionals over
# the w planes, inside a conditional): its scan transpose asserts on the residuals. Checked
# working on jax 0.10 and 0.12; before 0.10 the reference sums directly
# (contrib/ducc/reference/wgridder.py).
TRANSPOSES_SCANS_OF_CONDITIONALS = _version_tuple(jax.__version__)[:2] >= (0, 10)


def compile_options_proto(num_replicas: int, num_partitions: int) -> bytes:
    """A serialized xla.CompileOptionsProto for a program of that many replicas and
    partitions, as a PJRT host compiles a bundle's program with (jaxbind.bundle). jax 0.7 -
    0.12: jaxlib's CompileOptions."""
    from jax._src.lib import xla_client

    options = xla_client.CompileOptions()
    options.executable_build_options.num_replicas = num_replicas
    options.executable_build_options.num_partitions = num_partitions
    return options.SerializeAsString()


def parsed_module(text: str):
    """A StableHLO module's text parsed, in a context with JAX's dialects (jax 0.7 - 0.12)."""
    context = mlir_internal.make_ir_context()
    with context:
        return ir.Module.parse(text), context


def oldest_portable_artifact(serialized: bytes) -> bytes:
    """A StableHLO portable artifact (jax.export's ``mlir_module_serialized``) serialized
    again at the oldest StableHLO version that expresses it, so that PJRT plugins of older
    XLAs read it (jax 0.12 writes custom calls as ``vhlo.custom_call_v2``, which XLAs of
    PJRT C API 0.106 do not know); the artifact as it was where none does. jax 0.7 - 0.12:
    jaxlib's serializer, jax.export's sdy flag."""
    from jax._src import xla_bridge
    from jax._src.lib import _jax

    requirement = hlo.StablehloCompatibilityRequirement
    with mlir_internal.make_ir_context():
        module = _jax.mlir.deserialize_portable_artifact(serialized)
        for oldest in (requirement.MAX, requirement.WEEK_12):
            target = hlo.get_version_from_compatibility_requirement(oldest)
            try:
                return _jax.mlir.serialize_portable_artifact(
                    module, target, xla_bridge.get_backend("cpu").serialize_with_sdy
                )
            except Exception:  # (not expressible at that version)
                continue
    return serialized
