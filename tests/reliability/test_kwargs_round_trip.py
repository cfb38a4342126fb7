"""Keyword arguments reach the callable exactly as passed, or the call is refused at trace
time (hypothesis draws them from the whole space: Python and NumPy scalars of every dtype,
arrays in every layout, masked arrays, enums, user objects, nested containers).

"Exactly": the same type, dtype, shape, layout (Fortran order), bits (-0.0, nan payloads,
padding), mask, fill value and hard mask; dicts in their order; objects that are not data
are the very objects passed. Under jit, eagerly, and after a jax.export round trip for
data; a value that is not data (an enum, an object) is refused by jax.export, and one
that is not even picklable by the call itself, each naming the op and the argument.
"""

import copy
import enum
import struct
from collections import OrderedDict, namedtuple

import jax
import jax.export
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, reject, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.ops import simple_op

import jaxbind
from jaxbind._kwargs import encode_kwargs

NAME = "tests.kwargs_round_trip"
RECEIVED: list = []


def _record(out, args, kwargs_dump):
    RECEIVED.append(jaxbind.load_kwargs(kwargs_dump))
    out[0][...] = args[0]


OP = simple_op(_record, NAME)


# --- values that are not data: held in this process, refused by jax.export -----------


class Color(enum.Enum):
    RED = 1
    GREEN = "g"


class Level(enum.IntEnum):
    LOW = 0
    HIGH = 2


class Perm(enum.Flag):
    R = 1
    W = 2


class Bits(enum.IntFlag):
    A = 1
    B = 4


class Plan:
    """A user object (picklable): the callable gets this very object."""

    def __init__(self, n):
        self.n = n


class Half(float):
    """A float subclass: a float to ==, but not a float."""


class Label(str):
    """A str subclass."""


class Tagged(np.ndarray):
    """An ndarray subclass."""


Point = namedtuple("Point", "x y")


def _unpicklable_function():
    return lambda: 0


def _unpicklable_object():
    class Local:  # a class pickle cannot find by name
        pass

    return Local()


# --- strategies -----------------------------------------------------------------------


def _aligned(dtype: np.dtype) -> np.dtype:
    """The structured `dtype` with C's alignment (padding between fields)."""
    formats = [dtype.fields[name][0] for name in dtype.names]
    return np.dtype({"names": list(dtype.names), "formats": formats}, align=True)


ML_DTYPES = [
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float4_e2m1fn,
    ml_dtypes.int4,
    ml_dtypes.uint4,
]
plain_dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64)),
    hnp.complex_number_dtypes(endianness="?", sizes=(64, 128)),
    hnp.datetime64_dtypes(endianness="?"),
    hnp.timedelta64_dtypes(endianness="?"),
    hnp.byte_string_dtypes(max_len=4),
    hnp.unicode_string_dtypes(endianness="?", max_len=3),
    st.sampled_from([np.dtype("V3"), *map(np.dtype, ML_DTYPES)]),
)
structured_dtypes = st.one_of(
    hnp.array_dtypes(plain_dtypes, min_size=1, max_size=3, allow_subarrays=True),
    hnp.array_dtypes(plain_dtypes, min_size=1, max_size=3).map(_aligned),
    st.just(  # offsets with gaps, a title
        np.dtype(
            {
                "names": ["a", "b"],
                "formats": ["<i2", ">f8"],
                "offsets": [8, 0],
                "titles": ["the a", None],
                "itemsize": 24,
            }
        )
    ),
)
data_dtypes = st.one_of(plain_dtypes, structured_dtypes)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)


def _filled(dtype: np.dtype, shape: tuple, seed: int, fill: str) -> np.ndarray:
    """An array of `dtype` and `shape` with arbitrary bits (nan payloads, NaT, padding)."""
    n = int(np.prod(shape)) * dtype.itemsize
    if fill == "zeros":
        raw = bytes(n)
    elif fill == "ones":
        raw = b"\xff" * n
    else:
        raw = np.random.default_rng(seed).bytes(n)
    if dtype.kind == "U":  # valid code points only
        codes = np.frombuffer(raw, np.uint32) % 0x110000
        return codes.astype(dtype.byteorder + "u4").view(dtype).reshape(shape)
    return np.frombuffer(raw, dtype).reshape(shape).copy()


@st.composite
def arrays(draw, dtypes=data_dtypes):
    dtype = draw(dtypes)
    shape = draw(st.one_of(shapes, st.just((5000 // max(dtype.itemsize, 1) + 1,))))
    layout = draw(st.sampled_from(["C", "F", "strided"]))
    if layout == "strided" and shape:
        shape = (2 * shape[0],) + shape[1:]
    fill = draw(st.sampled_from(["random", "zeros", "ones"]))
    array = _filled(dtype, shape, draw(st.integers(0, 2**32)), fill)
    if layout == "F":
        array = np.asfortranarray(array)
    elif layout == "strided" and shape:
        array = array[::2]
    return array


@st.composite
def numpy_scalars(draw, dtypes=data_dtypes):
    dtype = draw(dtypes)
    return _filled(dtype, (1,), draw(st.integers(0, 2**32)), "random")[0]


@st.composite
def masked_arrays(draw, dtypes=data_dtypes):
    data = draw(arrays(dtypes))
    mask_kind = draw(st.sampled_from(["nomask", "random", "none masked"]))
    if mask_kind == "nomask":
        mask = np.ma.nomask
    else:
        mask_dtype = np.ma.make_mask_descr(data.dtype)
        mask = np.zeros(data.shape, mask_dtype)
        if mask_kind == "random":
            rng = np.random.default_rng(draw(st.integers(0, 2**32)))
            raw = bytes(b & 1 for b in rng.bytes(mask.nbytes))
            mask = np.frombuffer(raw, mask_dtype).reshape(data.shape).copy()
    fill = None
    if draw(st.booleans()):
        fill = _filled(data.dtype, (), draw(st.integers(0, 2**32)), "random")
    hard_mask = draw(st.booleans())
    try:
        return np.ma.MaskedArray(
            data, mask=mask, fill_value=fill, hard_mask=hard_mask, shrink=False
        )
    except (TypeError, ValueError):  # NumPy cannot make it (structures with ml_dtypes fields)
        reject()


floats = st.one_of(
    st.floats(),
    st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("<d", b.to_bytes(8, "little"))[0]),
)
hashable_data = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    floats,
    st.text(max_size=4),
    st.binary(max_size=4),
    numpy_scalars(plain_dtypes.filter(lambda d: d.kind != "V")),
)
data_leaves = st.one_of(
    hashable_data,
    st.integers(min_value=2**63, max_value=2**300).flatmap(lambda n: st.sampled_from([n, -n])),
    st.builds(complex, floats, floats),
    numpy_scalars(),
    arrays(),
    masked_arrays(),
)
local_leaves = st.one_of(
    st.sampled_from([*Color, *Level, *Perm, Perm.R | Perm.W, *Bits, Bits.A | Bits.B]),
    st.builds(Plan, st.integers()),
    floats.map(Half),
    st.text(max_size=3).map(Label),
    st.builds(np.longdouble, floats),
    st.builds(np.clongdouble, st.builds(complex, floats, floats)),
    st.lists(st.integers(), max_size=3).map(lambda v: np.array(v + [None], dtype=object)),
    st.lists(st.integers(), min_size=1, max_size=3).map(
        lambda v: np.ma.MaskedArray(np.array(v, dtype=object), mask=[True] + [False] * (len(v) - 1))
    ),
    st.builds(lambda: np.arange(3.0).view(Tagged)),
    st.just(OrderedDict(a=1)),
)
unpicklable_leaves = st.one_of(st.builds(_unpicklable_function), st.builds(_unpicklable_object))


def nested(leaves):
    """`leaves` alone and in tuples, lists, dicts (keys of any hashable data), sets."""
    keys = st.one_of(hashable_data, st.tuples(st.integers(), st.text(max_size=2)))
    containers = lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(keys, children, max_size=3),
        st.sets(hashable_data, max_size=3),
        st.frozensets(hashable_data, max_size=3),
    )
    return st.recursive(leaves, containers, max_leaves=6)


def with_local(children):
    return st.one_of(nested(children), st.builds(Point, children, children))


# --- what the callable received, compared with what was passed -----------------------


def canon(value):
    """A form of `value` that is equal for two values exactly when they are exactly equal
    (type, dtype, shape, layout, bits, mask...); objects that are not data by identity."""
    kind = type(value)
    if kind in (type(None), bool, int, str, bytes):
        return (kind.__name__, value)
    if kind is float:
        return ("float", struct.pack("<d", value))
    if kind is complex:
        return ("complex", struct.pack("<dd", value.real, value.imag))
    if kind in (tuple, list):
        return (kind.__name__, tuple(canon(v) for v in value))
    if kind is Point:
        return ("Point", tuple(canon(v) for v in value))
    if kind is dict:
        return ("dict", tuple((canon(k), canon(v)) for k, v in value.items()))
    if kind in (set, frozenset):
        return (kind.__name__, tuple(sorted(repr(canon(v)) for v in value)))
    if kind is np.ndarray and value.dtype != object:
        bits = _fields_only(value).tobytes(order="A")
        return ("ndarray", _dtype(value.dtype), value.shape, np.isfortran(value), bits)
    if kind is np.ndarray:  # object arrays: their elements, which are the objects passed
        return ("object array", value.shape, tuple(id(v) for v in value.ravel()))
    if kind is np.ma.MaskedArray:
        mask = np.ma.getmask(value)
        fill = value._fill_value  # as set: .fill_value would make NumPy's default now
        return (
            "masked",
            canon(value.data),
            "nomask" if mask is np.ma.nomask else canon(mask),
            None if fill is None else canon(fill),
            value.hardmask,
        )
    if isinstance(value, np.generic) and type(value) not in (np.longdouble, np.clongdouble):
        bits = _fields_only(np.asarray(value)).tobytes()
        return ("scalar", kind.__name__, _dtype(value.dtype), bits)
    return ("object", id(value))


def _fields_only(array: np.ndarray) -> np.ndarray:
    """`array` with the padding of a structured dtype zeros (NumPy's own copies leave it
    undefined: it is no part of the value)."""
    if array.dtype.names is None:
        return array
    clean = np.zeros(array.shape, array.dtype, order="F" if np.isfortran(array) else "C")
    _copy_fields(clean, array)
    return clean


def _copy_fields(dst: np.ndarray, src: np.ndarray) -> None:
    """Field by field: NumPy copies equal structured dtypes bytewise, padding included."""
    for name in src.dtype.names:
        if src.dtype.fields[name][0].names is not None:
            _copy_fields(dst[name], src[name])
        else:
            dst[name] = src[name]


def _dtype(dtype: np.dtype):
    fields = None
    if dtype.names is not None:
        fields = tuple((n, _dtype(dtype.fields[n][0]), dtype.fields[n][1:]) for n in dtype.names)
    sub = dtype.subdtype and (_dtype(dtype.subdtype[0]), dtype.subdtype[1])
    return (str(dtype), dtype.type, dtype.itemsize, dtype.isalignedstruct, fields, sub)


def _walk(value):
    """Every value in `value`, containers and leaves."""
    yield value
    if type(value) in (tuple, list, set, frozenset, Point):
        for item in value:
            yield from _walk(item)
    elif type(value) is dict:
        for key, item in value.items():
            yield from _walk(key)
            yield from _walk(item)


def _is_data(value) -> bool:
    """Whether every part of `value` is data (what the strategies draw as data)."""
    for part in _walk(value):
        if type(part) in (Point, Plan, Half, Label, Tagged, OrderedDict, np.longdouble):
            return False
        if isinstance(part, (enum.Enum, np.clongdouble)) or callable(part):
            return False
        if isinstance(part, np.ndarray) and part.dtype == object:
            return False
        if type(part).__name__ == "Local":
            return False
    return True


def _call(how: str, value):
    x = jnp.arange(3, dtype=jnp.float32)
    RECEIVED.clear()
    if how == "eager":
        out = OP(x, v=value)
    elif how == "jit":
        out = jax.jit(lambda x: OP(x, v=value))(x)
    else:
        exported = jaxbind.export(lambda x: OP(x, v=value))(x)
        out = jax.export.deserialize(exported.serialize()).call(x)
    np.testing.assert_array_equal(jax.block_until_ready(out)[0], x)
    return RECEIVED[-1]["v"]


def _assert_received_exactly(value, how):
    if _has_a_subnormal_key(value):
        with pytest.raises(TypeError, match=rf"^jaxbind: '{NAME}': keyword argument 'v.*subnormal"):
            _call(how, value)
        return
    want = canon(value)
    got = _call(how, value)
    assert canon(got) == want, f"{how}: passed {value!r}, the callable received {got!r}"


def _has_a_subnormal_key(value) -> bool:
    """Whether a dict key or set element in `value` is or holds a subnormal float (which
    XLA's threads, where callables run, read as zero: refused)."""
    keys = []
    for part in _walk(value):
        if type(part) is dict:
            keys.extend(part)
        elif type(part) in (set, frozenset):
            keys.extend(part)
    return any(_is_subnormal(p) for key in keys for p in _walk(key))


def _is_subnormal(number) -> bool:
    if type(number) in (float, complex):
        number = np.asarray(number)[()]
    if not isinstance(number, np.generic) or number.dtype.kind not in "fcV":
        return False
    parts = [number.real, number.imag] if number.dtype.kind == "c" else [number]
    try:
        tiny = ml_dtypes.finfo(parts[0].dtype).smallest_normal
    except ValueError:  # not a float
        return False
    return any(0 < abs(p) < tiny for p in parts)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REGRESSIONS = [  # issue 46, and subclasses that came back as their base class
    np.float64(3.0),
    np.ma.MaskedArray([1.0, 2.0], mask=[False, True]),
    np.str_("x"),
    np.float64(-0.0),
    {"b": 1, "a": (np.bool_(True), b"\x00")},
    np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    2**100,
]


def _with_examples(values):
    def decorate(test):
        for value in reversed(values):
            test = example(value=value)(test)
        return test

    return decorate


@pytest.mark.parametrize("how", ["eager", "jit", "export"])
@SETTINGS
@_with_examples(REGRESSIONS)
@given(value=nested(data_leaves))
def test_data_keyword_arguments_reach_the_callable_exactly(how, value):
    _assert_received_exactly(value, how)


@pytest.mark.parametrize("how", ["eager", "jit"])
@SETTINGS
@_with_examples([Level.HIGH, Half(0.5), Label("s"), Point(1, [2.0]), np.longdouble(1) / 3])
@given(value=with_local(st.one_of(data_leaves, local_leaves)))
def test_any_picklable_keyword_argument_reaches_the_callable_exactly(how, value):
    _assert_received_exactly(value, how)


@SETTINGS
@given(value=with_local(st.one_of(data_leaves, local_leaves)))
def test_export_carries_data_exactly_and_refuses_the_rest_naming_it(value):
    if _is_data(value) or _has_a_subnormal_key(value):
        _assert_received_exactly(value, "export")
        return
    with pytest.raises(TypeError, match=rf"cannot export '{NAME}'.* but v\b.*is not plain data"):
        _call("export", value)


def _embedded(value, leaf, where: int):
    """`value` and the unpicklable `leaf` together, `leaf` at one of several depths."""
    return (leaf, [value, leaf], {"k": (value, leaf)}, Point(value, [leaf]))[where]


@pytest.mark.parametrize("how", ["eager", "jit", "export"])
@settings(max_examples=15, deadline=None)
@given(
    value=st.builds(
        _embedded,
        with_local(st.one_of(data_leaves, local_leaves)),
        unpicklable_leaves,
        st.integers(0, 3),
    )
)
def test_a_value_that_is_neither_data_nor_picklable_is_refused_at_trace_time(how, value):
    RECEIVED.clear()
    with pytest.raises(TypeError) as info:
        _call(how, value)
    message = str(info.value)
    if _has_a_subnormal_key(value):  # (whichever comes first)
        assert message.startswith(f"jaxbind: '{NAME}': keyword argument") and " 'v" in message
    else:
        assert message.startswith(f"jaxbind: '{NAME}': keyword arguments must be plain data or")
        assert " 'v" in message and "functools.partial" in message
    assert RECEIVED == []  # refused before anything ran


@settings(max_examples=200, deadline=None)
@given(value=nested(data_leaves))
def test_equal_data_gives_one_encoding(value):
    """Equal keyword arguments (a copy, not the same object) hit the same jit cache entry."""
    assume(not _has_a_subnormal_key(value))  # refused
    assert encode_kwargs({"v": value}) == encode_kwargs({"v": copy.deepcopy(value)})


@pytest.mark.parametrize(
    "a, b",
    [
        (3.0, np.float64(3.0)),
        (1, True),
        (1, np.int64(1)),
        (Level.HIGH, 2),
        (0.0, -0.0),
        ("x", np.str_("x")),
        ((1, 2), [1, 2]),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # a dict's order is what the callable sees
        (np.arange(3.0), np.ma.MaskedArray(np.arange(3.0))),
        (np.ones((2, 2)), np.asfortranarray(np.ones((2, 2)))),
    ],
)
def test_equal_values_of_different_types_are_different_keyword_arguments(a, b):
    """Each reaches the callable as it was passed, each with its own cache entry."""
    assert encode_kwargs({"v": a}) != encode_kwargs({"v": b})
    x = jnp.ones(3)
    for value in (a, b, a, b):
        RECEIVED.clear()
        jax.block_until_ready(OP(x, v=value))
        assert canon(RECEIVED[-1]["v"]) == canon(value)


def _weighted_sum(out, args, kwargs_dump):
    w = jaxbind.load_kwargs(kwargs_dump)["w"]
    RECEIVED.append(w)
    out[0][...] = args[0] * w.sum()


@pytest.mark.parametrize("how", ["eager", "jit", "export"])
def test_a_subnormal_float_is_exact_as_a_value_and_refused_as_a_key(how):
    """XLA's threads read subnormal floats as zero (denormals-are-zero), and the callable's
    copy of a dict is made there: a subnormal key would be taken for False."""
    tiny = float.fromhex("0x0.0000000000001p-1022")
    for value in (tiny, [tiny, -tiny], {"k": complex(tiny, 0)}, np.float32(1e-45)):
        _assert_received_exactly(value, how)
    for value in ({False: None, tiny: None}, {(1, tiny): 0}, {0.0, tiny}, frozenset({tiny})):
        with pytest.raises(TypeError, match=rf"'{NAME}': keyword argument 'v.*subnormal float"):
            _call(how, value)


def test_a_masked_array_keyword_argument_keeps_its_mask():
    op = simple_op(_weighted_sum, "tests.kwargs_masked_sum")
    w = np.ma.MaskedArray([1.0, 100.0, 2.0], mask=[False, True, False])
    RECEIVED.clear()
    np.testing.assert_allclose(jax.jit(lambda x: op(x, w=w)[0])(jnp.ones(2)), [3.0, 3.0])
    assert type(RECEIVED[-1]) is np.ma.MaskedArray and RECEIVED[-1].mask.tolist() == [0, 1, 0]


def test_a_numpy_scalar_keyword_argument_runs():
    op = simple_op(_weighted_sum, "tests.kwargs_numpy_scalar")
    RECEIVED.clear()
    np.testing.assert_allclose(op(jnp.ones(2), w=np.float64(3.0))[0], [3.0, 3.0])
    assert type(RECEIVED[-1]) is np.float64
