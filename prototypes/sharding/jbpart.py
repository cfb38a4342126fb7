"""Route A prototype: jaxbind calls that XLA partitions by a declared rule.

A call of `partitioned(op_call_spec, rule)` lowers (when the program is partitioned over
several devices) to a custom call of jaxbind's own target ``jaxbind_partitioned``. Its
backend_config is JSON that names everything the local call needs (the binding by name,
role, keyword arguments as data, n_fixed, loop, the platform) and the rule. The
partitioner of that target is registered with XLA by name when this module is imported,
so any process that imports it (and defines the same bindings) can compile an exported
program that contains such calls: XLA asks the callbacks for the local computation, which
is the ordinary jaxbind custom call on the local shapes, plus one all-reduce over the
devices that split a reduction factor.

The rule is einsum-like, over the flat operands and results of the call:
``"m d, m -> g"`` with ``reduction=("m",)``: m may be split (each device computes a
partial g, summed), d and g are never split. A factor on both sides is split where its
operands are (pass-through, e.g. ``"m d, g -> m"``), unless listed in ``replicated``.

JAX internals used (FINDINGS.md lists them with the versions they were checked on):
  jax._src.lib.xla_client.register_custom_call_partitioner and HloSharding (from_string,
  is_replicated, is_tiled, tile_assignment_dimensions, tile_assignment_devices, tile,
  tuple_sharding, replicate); jax._src.xla_bridge.register_plugin_callbacks;
  jax._src.interpreters.mlir (aval_to_ir_type, lower_fun, register_lowering,
  build_mlir_module_helper, module_to_bytecode, i32_attr, dtype_to_ir_type,
  DEVICE_TO_DEVICE_TYPE); jax._src.sharding_impls.SPMDAxisContext; jax._src.mesh.Mesh;
  jax._src.custom_partitioning_sharding_rule (str_to_sdy_sharding_rule,
  sdy_sharding_rule_to_mlir); jaxbind's own _compat.auto_partitioned_devices.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial

import jax
import numpy as np
from jax._src import core as jcore
from jax._src import mesh as mesh_lib
from jax._src import sharding_impls
from jax._src import xla_bridge as xb
from jax._src.interpreters import mlir
from jax._src.lib import xla_client as xc
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo

from jaxbind._binding import lookup
from jaxbind._compat import auto_partitioned_devices, config_use_shardy
from jaxbind._kwargs import data_blob, decode_kwargs
from jaxbind._primitive import PRIMITIVE, bind
from jaxbind._spec import BatchAxes, CallSpec

TARGET = "jaxbind_partitioned"
# Which Shardy rule the lowering writes (experiments.py compares them): "declared"
# (reduction and need-replication factors), "plain" (factors only), "none" (no rule).
SDY_MODE = "declared"
LOG: list = []  # what the callbacks were asked, for the scripts to show


# --- the rule ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    text: str  # "m d, m -> g"
    reduction: tuple[str, ...] = ()
    replicated: tuple[str, ...] = ()

    @property
    def sides(self):
        ins, outs = self.text.split("->")
        split = lambda s: [tuple(p.split()) for p in s.split(",")]  # noqa: E731
        return split(ins), split(outs)

    @property
    def splittable(self) -> set[str]:
        ins, outs = self.sides
        left = {f for t in ins for f in t}
        right = {f for t in outs for f in t}
        passing = (left & right) - set(self.replicated)
        return passing | (set(self.reduction) & left)

    @property
    def need_replication(self) -> tuple[str, ...]:
        ins, outs = self.sides
        every = dict.fromkeys(f for t in ins + outs for f in t)
        return tuple(f for f in every if f not in self.splittable)

    def with_batch(self, batched: tuple[bool, ...], levels: int = 1) -> Rule:
        """The rule of the call vmapped `levels` times: batch factors lead every batched
        operand and every result (jaxbind's batched calls put batch axes first)."""
        ins, outs = self.sides
        batch = tuple(f"vmap{k}" for k in range(levels))  # factor names start with a letter
        ins = [(batch if b else ()) + t for t, b in zip(ins, batched)]
        outs = [batch + t for t in outs]
        show = lambda ts: ", ".join(" ".join(t) for t in ts)  # noqa: E731
        return Rule(f"{show(ins)} -> {show(outs)}", self.reduction, self.replicated)

    def to_sdy(self, operand_types, result_types):
        """The Shardy rule attribute (reduction and need-replication factors declared)."""
        from jax._src import custom_partitioning_sharding_rule as r

        import inspect

        params = inspect.signature(r.str_to_sdy_sharding_rule).parameters
        extra = {}
        if SDY_MODE == "plain":
            params = {}
        if "reduction_factors" in params:
            extra["reduction_factors"] = self.reduction
        if "need_replication_factors" in params:
            extra["need_replication_factors"] = self.need_replication
        parsed = r.str_to_sdy_sharding_rule(self.text, **extra)
        return r.sdy_sharding_rule_to_mlir(parsed, list(operand_types), list(result_types))


# --- the wrapper primitive ----------------------------------------------------------------

partitioned_p = jcore.Primitive("jaxbind_partitioned")
partitioned_p.multiple_results = True


def partitioned(spec: CallSpec, rule: Rule, *args):
    return partitioned_p.bind(*args, spec=spec, rule=rule)


partitioned_p.def_impl(lambda *args, spec, rule: bind(spec, *args))
partitioned_p.def_effectful_abstract_eval(
    lambda *avals, spec, rule: PRIMITIVE.abstract_eval(*avals, spec=spec)
)


def _ir_type(ctx, aval):
    try:  # (module_context, aval): jax 0.10 - 0.12
        return mlir.aval_to_ir_type(ctx.module_context, aval)
    except TypeError:  # (aval): jax 0.7
        return mlir.aval_to_ir_type(aval)


def _lower(ctx, *args, spec: CallSpec, rule: Rule):
    platform = ctx.module_context.platforms[0]
    if auto_partitioned_devices(ctx) == 1:  # one device, or inside shard_map: the plain call
        return mlir.lower_fun(partial(bind, spec), multiple_results=True)(ctx, *args)
    config = {
        "format": 1,
        "binding": spec.binding.name,
        "role": spec.role,
        "n_fixed": spec.n_fixed,
        "kwargs": data_blob(spec.kwargs).hex(),  # the user's; call_kwargs adds batch_axes
        "platform": platform,
        "rule": rule.text,
        "reduction": list(rule.reduction),
        "replicated": list(rule.replicated),
    }
    result_types = [_ir_type(ctx, a) for a in ctx.avals_out]
    call = hlo.CustomCallOp(
        result_types,
        list(args),
        call_target_name=ir.StringAttr.get(TARGET),
        has_side_effect=ir.BoolAttr.get(False),
        api_version=mlir.i32_attr(2),
        called_computations=ir.ArrayAttr.get([]),
        backend_config=ir.StringAttr.get(json.dumps(config, sort_keys=True)),
        operand_layouts=None,
        result_layouts=None,
    )
    if spec.batch_axes is not None:
        config["batch_axes"] = [list(a) for a in spec.batch_axes.axes]
        config["out_batch_axes"] = [list(a) for a in spec.out_batch_axes.axes]
        call.attributes["backend_config"] = ir.StringAttr.get(json.dumps(config, sort_keys=True))
    if config_use_shardy() and SDY_MODE != "none":
        call.attributes["sdy.sharding_rule"] = rule.to_sdy(
            [a.type for a in args], result_types
        )
    return call.results


mlir.register_lowering(partitioned_p, _lower)


def _batch(args, dims, *, spec: CallSpec, rule: Rule):
    """vmap: the batched jaxbind call (as jaxbind's own batching rule makes it: batch axes
    first), under the rule with a batch factor in front of each batched operand and of
    every result."""
    if spec.batch_axes is not None:
        raise NotImplementedError("prototype: one vmap level")
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args = [a if d is None else jax.numpy.moveaxis(a, d, 0)
            for a, d in zip(args, dims)]
    batched = tuple(d is not None for d in dims)  # not_mapped is None: jax 0.7 - 0.12
    in_axes = tuple(0 if b else None for b in batched)
    jaxpr = jax.make_jaxpr(jax.vmap(partial(bind, spec), in_axes=in_axes))(*args)
    (eqn,) = [e for e in jaxpr.eqns if "spec" in e.params]
    inner = eqn.params["spec"]
    assert len(jaxpr.eqns) == 1, jaxpr  # no moves around the call: batch axes already first
    del size
    outs = partitioned_p.bind(*args, spec=inner, rule=rule.with_batch(batched))
    return outs, [0] * len(outs)


from jax.interpreters import batching as _batching  # noqa: E402

_batching.primitive_batchers[partitioned_p] = _batch


# --- the partitioner callbacks (run by XLA's SPMD partitioner, in the compiling process) ----


def _config(backend_config) -> dict:
    return json.loads(bytes(backend_config).decode())


def _spec_of(config) -> CallSpec:
    binding = lookup(config["binding"])
    if binding is None:
        raise LookupError(f"jaxbind_partitioned: no binding named {config['binding']!r}")
    kwargs = decode_kwargs(bytes.fromhex(config["kwargs"]))
    if "batch_axes" in config:
        axes = BatchAxes(tuple(tuple(a) for a in config["batch_axes"]))
        out_axes = BatchAxes(tuple(tuple(a) for a in config["out_batch_axes"]))
        return CallSpec(binding, config["role"], config["n_fixed"], kwargs, axes, out_axes)
    return CallSpec(binding, config["role"], config["n_fixed"], kwargs)


def _shapes(shape):
    return list(shape.tuple_shapes()) if shape.is_tuple() else [shape]


def _grid(rule: Rule, arg_shapes, arg_shardings):
    """The device grid the call is split over: one axis per split factor and a last axis
    of the rest (replicas, and tiles of factors that must not be split: operands tiled
    on those are gathered).

    Each splittable factor is split as the operand that tiles it most tiles it; the
    factors are combined by each device's tile index along each of them (so a factor
    tiled in one operand and another factor tiled in another share one grid, as when
    vmap's batch factor is split in the weights only and the points' factor in both).
    A factor whose split does not combine with the others is dropped (not split).

    Returns (factors, grid): grid has shape (*sizes of factors, rest)."""
    ins, _ = rule.sides
    coords: dict[str, dict[int, int]] = {}
    sizes: dict[str, int] = {}
    devices_all: set[int] = set()
    for factors, sharding in zip(ins, arg_shardings):
        if sharding is None or sharding.is_replicated() or not sharding.is_tiled():
            continue
        dims = list(sharding.tile_assignment_dimensions())
        devices = np.asarray(sharding.tile_assignment_devices()).reshape(dims)
        devices_all.update(devices.ravel().tolist())
        index = np.indices(dims)
        for k, f in enumerate(factors):
            if f in rule.splittable and dims[k] > sizes.get(f, 1):
                coords[f] = dict(zip(devices.ravel().tolist(), index[k].ravel().tolist()))
                sizes[f] = dims[k]
    names = list(coords)
    while names:
        total = math.prod(sizes[f] for f in names)
        rest, ragged = divmod(len(devices_all), total)
        groups: dict[tuple, list[int]] = {}
        for d in sorted(devices_all):
            groups.setdefault(tuple(coords[f][d] for f in names), []).append(d)
        if not ragged and len(groups) == total and all(len(g) == rest for g in groups.values()):
            grid = np.empty([sizes[f] for f in names] + [rest], dtype=np.int64)
            for key, members in groups.items():
                grid[key] = members
            return names, grid
        names.pop()
    return [], np.zeros((1, 1), dtype=np.int64)


def _sharding_for(factors_of_value, names, grid) -> xc.HloSharding:
    """The HloSharding of one value whose axes carry `factors_of_value`."""
    present = [f for f in factors_of_value if f in names]
    if not present:
        return xc.HloSharding.replicate()
    order = [names.index(f) for f in present]
    rest = [k for k in range(grid.ndim) if k not in order]
    arranged = np.transpose(grid, order + rest)
    repl = math.prod(grid.shape[k] for k in rest)
    dims = [grid.shape[names.index(f)] if f in present else 1 for f in factors_of_value]
    devices = arranged.reshape(-1).tolist()
    text = "{devices=[" + ",".join(map(str, dims + ([repl] if repl > 1 else []))) + "]"
    text += ",".join(map(str, devices))
    if repl > 1:
        text += " last_tile_dim_replicate"
    text += "}"
    return xc.HloSharding.from_string(text)


def _groups(rule: Rule, names, grid) -> list[list[int]]:
    """Devices whose partial results are summed: those that differ only in reduction axes."""
    red = [k for k, f in enumerate(names) if f in rule.reduction]
    if not red:
        return []
    moved = np.moveaxis(grid, red, list(range(grid.ndim - len(red), grid.ndim)))
    return moved.reshape(-1, math.prod(grid.shape[k] for k in red)).tolist()


def _plan(rule, arg_shapes, arg_shardings, result_shapes):
    ins, outs = rule.sides
    names, grid = _grid(rule, arg_shapes, arg_shardings)
    args = [_sharding_for(f, names, grid) for f in ins]
    results = [_sharding_for(f, names, grid) for f in outs]
    return names, grid, args, results


def _pack(result_shape, shardings):
    if result_shape.is_tuple():
        return xc.HloSharding.tuple_sharding(result_shape, shardings)
    return shardings[0]


# all-reduce with explicit replica groups (global device ids), the one collective


allreduce_p = jcore.Primitive("jaxbind_partial_sum")
allreduce_p.def_abstract_eval(lambda x, *, groups: x)


def _allreduce_lowering(ctx, x, *, groups):
    (aval,) = ctx.avals_in
    op = hlo.AllReduceOp(
        [x.type],
        [x],
        replica_groups=ir.DenseIntElementsAttr.get(np.asarray(groups, dtype=np.int64)),
        channel_handle=hlo.ChannelHandle.get(1, mlir.DEVICE_TO_DEVICE_TYPE),
        use_global_device_ids=ir.BoolAttr.get(True),
    )
    scalar = ir.RankedTensorType.get([], mlir.dtype_to_ir_type(aval.dtype))
    block = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        hlo.return_([hlo.add(*block.arguments)])
    return op.results


mlir.register_lowering(allreduce_p, _allreduce_lowering)


def _partition(arg_shapes, arg_shardings, result_shape, result_sharding, backend_config):
    config = _config(backend_config)
    rule = Rule(config["rule"], tuple(config["reduction"]), tuple(config["replicated"]))
    result_shapes = _shapes(result_shape)
    names, grid, args, results = _plan(rule, arg_shapes, arg_shardings, result_shapes)
    groups = _groups(rule, names, grid)
    LOG.append(("partition", [str(s) for s in arg_shardings], str(result_sharding),
                [str(s) for s in args], [str(s) for s in results], groups))
    spec = _spec_of(config)
    local_in = [
        jcore.ShapedArray(tuple(sh.tile(s).dimensions()), s.numpy_dtype())
        for sh, s in zip(args, arg_shapes)
    ]

    def local(*xs):
        outs = bind(spec, *xs)
        if groups:
            outs = [allreduce_p.bind(o, groups=tuple(map(tuple, groups))) for o in outs]
        return outs

    closed = jax.make_jaxpr(local)(*local_in)
    # The local program is fully manual; its one collective names devices itself, so
    # the mesh only marks the context (custom_partitioning uses the caller's mesh).
    mesh = mesh_lib.Mesh(np.array(jax.devices()[:1]), ("_jaxbind",))
    axis_context = sharding_impls.SPMDAxisContext(mesh, frozenset(mesh.axis_names))
    module = mlir.build_mlir_module_helper(
        closed,
        name="jaxbind_local",
        platforms=[config["platform"]],
        backend=None,
        axis_context=axis_context,
    )
    return mlir.module_to_bytecode(module), args, _pack(result_shape, results)


def _infer(arg_shapes, arg_shardings, result_shape, backend_config):
    config = _config(backend_config)
    rule = Rule(config["rule"], tuple(config["reduction"]), tuple(config["replicated"]))
    _, _, _, results = _plan(rule, arg_shapes, arg_shardings, _shapes(result_shape))
    LOG.append(("infer", [str(s) for s in arg_shardings], [str(s) for s in results]))
    return _pack(result_shape, results)


def _propagate_user(user_sharding, shape, backend_config):
    return user_sharding  # what users want of the results: let XLA decide (GSPMD only)


def register() -> None:
    kwargs = dict(
        name=TARGET,
        prop_user_sharding=_propagate_user,
        partition=_partition,
        infer_sharding_from_operands=_infer,
        can_side_effecting_have_replicated_sharding=True,
    )
    xc.register_custom_call_partitioner(**kwargs)
    xb.register_plugin_callbacks(partial(xc.register_custom_call_partitioner, **kwargs))


register()
