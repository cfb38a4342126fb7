"""Compile time: XLA's SPMD partitioner asks jaxbind how to split a call of a
partitioned row of the target table (.targets: ``jaxbind_partitioned``,
``jaxbind_cuda_kernel_partitioned``; see .partitioning: a call with a declared rule, in
a program partitioned automatically over several devices).

The callbacks are registered with XLA by target name at import (`register`), so any
process that imports jaxbind can compile a program with such calls, an exported one
included. Everything they need is in the call: its attributes are the call format's
(_callformat, checked as the runtime checks them, digest included), plus
``partitioning``: the rule (`ShardingRule.to_config`), the platform and the target of
each device's part (the row's per-device target; programs made before it was written
name the platform's plain target). They read no
mesh: the device grid comes from the operands' shardings as XLA passes them
(`_grid`), and so do the devices whose partial results are summed.

- `_partition`: the local program of each device, the ordinary jaxbind custom call (of
  the row's per-device target: a CUDA kernel's keeps command buffers) on the local
  shapes (the same attributes: the same site, the same body), then an all-reduce (sum)
  of each result over the devices that split a factor the result lacks (a reduction
  factor), with replica groups of global device ids; and the shardings of
  the operands it needs (XLA reshards to them: a factor that must stay whole is
  gathered) and of the results.
- `_infer` (GSPMD): the results' sharding from the operands'.
- `_propagate_user` (GSPMD): leaves users' shardings to XLA.

Under Shardy the call's ``sdy.sharding_rule`` propagates shardings, and XLA still calls
`_partition` with the shardings Shardy chose.
"""

from __future__ import annotations

import json
import math

import jax
import numpy as np

from .._binding import lookup
from .._callformat import CallAttributes
from .._compat import (
    Primitive,
    all_reduce_sum,
    hlo_sharding,
    local_module_bytecode,
    mlir,
    parse_attribute_dict,
    register_call_partitioner,
    tuple_sharding,
)
from .._errors import about
from .._roles import Body
from .._sharding import ShardingRule
from .targets import TARGETS, pick

__all__ = ["register"]

_PARTITIONED = tuple(dict.fromkeys(t.name for t in TARGETS if t.partitioner))


def _read(backend_config, *, binding: bool = True) -> tuple[CallAttributes, ShardingRule, str]:
    """The call's attributes, its rule and the target of each device's part, from the
    text XLA passes (the call's FFI attributes as an MLIR dictionary), checked;
    `binding`: and the binding defined in this process."""
    text = backend_config if isinstance(backend_config, str) else bytes(backend_config).decode()
    found = parse_attribute_dict(text)
    setting = json.loads(found.pop("partitioning", "null") or "null")
    per_device = _per_device(setting)
    if per_device is None:
        raise ValueError(
            f"jaxbind: a {'/'.join(_PARTITIONED)} call without a valid 'partitioning' "
            f"attribute ({text[:200]}); the program was not made by this jaxbind, or was "
            "modified"
        )
    call = CallAttributes.read(found)
    if call.format < 3:
        raise ValueError(f"jaxbind: a partitioned call in call format {call.format}")
    rule = ShardingRule.from_config(setting.get("rule"))
    if binding and lookup(call.binding) is None:
        raise LookupError(
            f"{about(call.binding)}: this program calls it partitioned across devices, but no "
            f"binding named '{call.binding}' exists in this process. Import (or run) the module "
            "that creates the op before compiling the program: compiled and exported programs "
            "find jaxbind ops by name"
        )
    return call, rule, per_device


def _per_device(setting: object) -> str | None:
    """The target of each device's part of the call: a per-device target of the table on
    the call's platform (the plain one where the program names none), or None."""
    if not isinstance(setting, dict):
        return None
    platform = setting.get("platform")
    named = setting.get("target")
    rows = [t for t in TARGETS if t.platform == platform and not t.partitioner]
    if not rows:
        return None
    if named is None:
        return pick(str(platform), Body.CALLABLE, effect=False, partitioned=False).name
    per_device = {t.per_device for t in TARGETS if t.partitioner and t.platform == platform}
    return named if named in per_device else None


def _shapes(shape) -> list:
    return list(shape.tuple_shapes()) if shape.is_tuple() else [shape]


def _sizes(rule: ShardingRule, arg_shapes) -> dict[str, int]:
    return {f: int(d) for m, s in zip(rule.operands, arg_shapes) for f, d in zip(m, s.dimensions())}


def _grid(rule: ShardingRule, arg_shapes, arg_shardings) -> tuple[list[str], np.ndarray]:
    """The device grid a call is split over: one axis per split factor and a last axis
    of the rest (replicas, and tiles of factors that must stay whole: operands tiled on
    those are gathered).

    Each splittable factor is split as the operand that tiles it most tiles it, if that
    divides its size (XLA pads uneven tiles, and padding must not be summed). The
    factors are combined by each device's tile index along each of them, so a factor
    tiled in one operand and another factor tiled in another share one grid (vmap's
    batch factor split in the weights only, the points' factor in both). A factor whose
    split does not combine with the others is dropped (not split)."""
    sizes = _sizes(rule, arg_shapes)
    splittable = set(rule.pass_through) | set(rule.reduction)
    coords: dict[str, dict[int, int]] = {}
    counts: dict[str, int] = {}
    devices_all: set[int] = set()
    for factors, sharding in zip(rule.operands, arg_shardings):
        if sharding is None or sharding.is_replicated() or not sharding.is_tiled():
            continue
        dims = list(sharding.tile_assignment_dimensions())
        devices = np.asarray(sharding.tile_assignment_devices()).reshape(dims)
        devices_all.update(devices.ravel().tolist())
        index = np.indices(dims)
        for k, f in enumerate(factors):
            if f in splittable and dims[k] > counts.get(f, 1) and sizes.get(f, 0) % dims[k] == 0:
                coords[f] = dict(zip(devices.ravel().tolist(), index[k].ravel().tolist()))
                counts[f] = dims[k]
    names = list(coords)
    while names:
        total = math.prod(counts[f] for f in names)
        rest, ragged = divmod(len(devices_all), total)
        groups: dict[tuple, list[int]] = {}
        for d in sorted(devices_all):
            groups.setdefault(tuple(coords[f][d] for f in names), []).append(d)
        if not ragged and len(groups) == total and all(len(g) == rest for g in groups.values()):
            grid = np.empty([counts[f] for f in names] + [rest], dtype=np.int64)
            for key, members in groups.items():
                grid[key] = members
            return names, grid
        names.pop()
    return [], np.zeros((1, 1), dtype=np.int64)


def _sharding_for(factors, names: list[str], grid: np.ndarray):
    """The HloSharding of one array whose axes carry `factors`, on the grid."""
    present = [f for f in factors if f in names]
    if not present:
        return hlo_sharding()
    order = [names.index(f) for f in present]
    rest = [k for k in range(grid.ndim) if k not in order]
    devices = np.transpose(grid, order + rest).reshape(-1).tolist()
    repl = math.prod(grid.shape[k] for k in rest)
    dims = [grid.shape[names.index(f)] if f in present else 1 for f in factors]
    text = "{devices=[" + ",".join(map(str, dims + ([repl] if repl > 1 else []))) + "]"
    text += ",".join(map(str, devices)) + (" last_tile_dim_replicate" if repl > 1 else "") + "}"
    return hlo_sharding(text)


def _groups(rule: ShardingRule, names: list[str], grid: np.ndarray) -> list[list[list[int]]]:
    """For each result, the devices whose partial results are summed (none: []): those
    that differ only along the split factors the result lacks (ShardingRule.summed)."""
    found: list[list[list[int]]] = []
    for r in range(len(rule.results)):
        red = [names.index(f) for f in rule.summed(r, names)]
        if not red:
            found.append([])
            continue
        moved = np.moveaxis(grid, red, list(range(grid.ndim - len(red), grid.ndim)))
        found.append(moved.reshape(-1, math.prod(grid.shape[k] for k in red)).tolist())
    return found


def _plan(rule: ShardingRule, arg_shapes, arg_shardings):
    names, grid = _grid(rule, arg_shapes, arg_shardings)
    args = [_sharding_for(m, names, grid) for m in rule.operands]
    results = [_sharding_for(m, names, grid) for m in rule.results]
    return args, results, _groups(rule, names, grid)


def _pack(result_shape, shardings):
    if result_shape.is_tuple():
        return tuple_sharding(result_shape, shardings)
    return shardings[0]


# The one collective of a local program: a sum over explicit groups of global device
# ids (a loading process has no mesh, and XLA's device order need not be a mesh's).
partial_sum_p = Primitive("jaxbind_partial_sum")
partial_sum_p.def_abstract_eval(lambda x, *, groups: x)
mlir.register_lowering(partial_sum_p, lambda ctx, x, *, groups: all_reduce_sum(ctx, x, groups))


def _partition(arg_shapes, arg_shardings, result_shape, result_sharding, backend_config):
    call, rule, target = _read(backend_config)
    args, results, groups = _plan(rule, arg_shapes, arg_shardings)
    local_in = [
        jax.ShapeDtypeStruct(tuple(sh.tile(s).dimensions()), s.numpy_dtype())
        for sh, s in zip(args, arg_shapes)
    ]
    local_out = [
        jax.ShapeDtypeStruct(tuple(sh.tile(s).dimensions()), s.numpy_dtype())
        for sh, s in zip(results, _shapes(result_shape))
    ]
    attributes = call.ffi_attributes()
    frozen = [tuple(map(tuple, g)) for g in groups]

    def local(*xs):
        outs = jax.ffi.ffi_call(target, local_out)(*xs, **attributes)
        return [o if not g else partial_sum_p.bind(o, groups=g) for o, g in zip(outs, frozen)]

    closed = jax.make_jaxpr(local)(*local_in)
    platform = next(t.platform for t in TARGETS if t.name == target)
    return local_module_bytecode(closed, platform), args, _pack(result_shape, results)


def _infer(arg_shapes, arg_shardings, result_shape, backend_config):
    """GSPMD's question. XLA aborts the process when this callback raises (jaxlib 0.7 -
    0.12: a CHECK in custom_partition_callback.cc), so it never does: a call it cannot
    read gets replicated results, and `_partition`, whose errors XLA reports as errors,
    says what is wrong."""
    try:
        _, rule, _ = _read(backend_config, binding=False)
        _, results, _ = _plan(rule, arg_shapes, arg_shardings)
        return _pack(result_shape, results)
    except Exception:
        return _pack(result_shape, [hlo_sharding()] * len(_shapes(result_shape)))


def _propagate_user(user_sharding, shape, backend_config):
    return user_sharding


def register() -> None:
    """Register the partitioner of each partitioned target of the table with XLA (once,
    at import)."""
    for name in _PARTITIONED:
        register_call_partitioner(name, _partition, _infer, _propagate_user)
