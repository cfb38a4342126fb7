"""The codec's table of kinds: every kind reads back what it writes, in its own row, and a
row that writes what nothing reads is refused when the table is made.

(tests/reliability/test_kwargs_round_trip.py draws whole keyword arguments through calls;
these tests hold each row of the table to itself.)
"""

import collections
import pickle

import ml_dtypes
import numpy as np
import pytest

from jaxbind._kwargs import codec
from jaxbind._kwargs.codec import CODEC, KINDS, Codec, Encoder, Kind

Point = collections.namedtuple("Point", "x y")


class Plan:  # not data: held in this process by identity
    pass


def _cyclic():
    items: list = [1]
    items.append(items)
    return items


# one value of each kind that leaves this process, by the kind's name
DATA = {
    "None, bool, str": "text",
    "int": -(2**63),
    "big int": 2**64,
    "float": -0.0,
    "complex": complex(float("nan"), -0.0),
    "bytes": b"\x00\xff",
    "list": [1, [2.5, "x"]],
    "tuple": (1, (2, None)),
    "dict": {"a": 1, (1, 2): [3.0]},
    "set": {1},
    "frozenset": frozenset({"x"}),
    "array": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "masked array": np.ma.MaskedArray([1, 2, 3], mask=[0, 1, 0], fill_value=7),
    "NumPy scalar": ml_dtypes.bfloat16(1.5),
    "keyword arguments": [("a", 1), ("b", (2.0,))],
}
# one value of each kind written only in this process's digests
LOCAL = {
    "large array": np.zeros(codec.INLINE_BYTES + 1, np.uint8),
    "namedtuple": Point(1, 2),
    "cycle": _cyclic(),
    "not data": Plan(),
}
# what earlier versions wrote, for the kinds now read only, and the values they hold
READ_ONLY = {
    "float (earlier versions)": ("1.5", 1.5),
    "complex (earlier versions)": (["1.0", "-2.0"], complex(1.0, -2.0)),
}


def _exact(got, want) -> bool:
    """The same value: type, bits, dtype, shape, order, mask and fill value."""
    if type(got) is not type(want):
        return False
    if isinstance(want, (set, frozenset)):
        return {pickle.dumps(v) for v in got} == {pickle.dumps(v) for v in want}
    return pickle.dumps(got, protocol=4) == pickle.dumps(want, protocol=4)


def _form(kind: Kind, value, encoder: Encoder):
    """`value` written by its row, and the payload under the row's tag."""
    if kind is codec.KWARGS:
        written = encoder.write(kind, value, "")
    else:  # (a row without types or test is written by another row's encoder: big int)
        if kind.types or kind.when:
            assert encoder.kind_of(value) is kind, f"{value!r} is written by another row"
        written = encoder.encode(value, "value")
    if kind.tag is None:
        return written
    assert isinstance(written, dict) and list(written) == [kind.tag]
    return written[kind.tag]


def test_every_kind_has_an_example_here():
    names = [kind.name for kind in KINDS]
    assert len(set(names)) == len(names)
    assert set(names) == set(DATA) | set(LOCAL) | set(READ_ONLY), (
        "a kind was added to codec.KINDS (or removed): give it an example here"
    )


@pytest.mark.parametrize("name", sorted(DATA))
def test_each_kind_reads_back_in_its_own_row_what_it_writes(name):
    (kind,) = (k for k in KINDS if k.name == name)
    value = DATA[name]
    payload = _form(kind, value, Encoder(None, None))
    read = kind.decode(codec.loads(codec.dumps(payload)) if kind.tag is None else payload)
    if kind is codec.KWARGS:
        value = dict(value)
    assert _exact(read, value), (read, value)
    # and through the whole encoding, as a program's bytes
    assert _exact(codec.loads(codec.dumps(Encoder(None, None).write(kind, DATA[name], ""))), value)


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_each_local_kind_is_written_under_its_tag_and_refused_as_data(name):
    (kind,) = (k for k in KINDS if k.name == name)
    assert kind.local and kind.decode is None and kind.tag not in CODEC.decoders
    value = LOCAL[name]
    if kind is codec.CYCLE:
        written = Encoder([], []).encode(value, "value")  # the list, its cycle inside
        assert written[1] == {kind.tag: "value"}
    else:
        assert _form(kind, value, Encoder([], [])) is not None
    with pytest.raises(ValueError, match="unknown tag"):
        codec.loads(codec.dumps({kind.tag: []}))


@pytest.mark.parametrize("name", sorted(READ_ONLY))
def test_kinds_of_earlier_versions_are_read(name):
    (kind,) = (k for k in KINDS if k.name == name)
    payload, value = READ_ONLY[name]
    assert kind.encode is None
    assert _exact(codec.loads(codec.dumps({kind.tag: payload})), value)


class Fraction:
    pass


def test_a_row_that_writes_what_nothing_reads_is_refused():
    row = Kind("fraction", "q", (Fraction,), encode=lambda e, v, p: [1, 2])
    with pytest.raises(ValueError, match="'fraction'.*nothing reads what it writes under 'q'"):
        Codec((*KINDS, row))
    # with its decoder in the row it is a kind like any other
    table = Codec((*KINDS, Kind("fraction", "q", (Fraction,), encode=row.encode, decode=tuple)))
    assert table.by_type[Fraction][0].tag == "q" and "q" in table.decoders


def test_a_tag_taken_twice_is_refused():
    with pytest.raises(ValueError, match="tag 'F' is taken twice"):
        Codec((*KINDS, Kind("another float", "F", decode=float)))


def test_a_local_row_with_a_decoder_is_refused():
    with pytest.raises(ValueError, match="a local kind is written under a tag, never decoded"):
        Codec((*KINDS, Kind("held", "q", encode=lambda e, v, p: 0, decode=int, local=True)))
