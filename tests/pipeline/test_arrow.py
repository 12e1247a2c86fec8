"""Stored records into Arrow columns (``pipeline.arrow``), without Spark running: records of one size and of
many, with and without headers and keys, cut at a stop id, timestamps encoded every way msgpack may, and a
corrupt record refused."""

from __future__ import annotations

import struct
import zlib

import msgpack
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.arrow import to_batch
from pipeline.source import SCHEMA, SCHEMA_WITH_HEADERS
from protocol.errors import ProtocolError


def record(record_id: int, timestamp: int, headers: dict[bytes, bytes], body: bytes) -> bytes:
    payload = msgpack.packb([timestamp, headers, body], use_bin_type=True)
    crc = zlib.crc32(payload, zlib.crc32(record_id.to_bytes(8, "big")))
    return struct.pack(">IIQ", len(payload), crc, record_id) + payload


def rows(payload: bytes, first: int, count: int, headers: bool = False, **extra: object) -> list[dict]:
    schema = to_arrow_schema(SCHEMA_WITH_HEADERS if headers else SCHEMA, timezone="UTC")
    batch = to_batch(payload, first, count, "t", schema, **extra)  # type: ignore[arg-type]
    assert batch.schema.equals(schema)
    return batch.to_pylist()


def test_records_of_one_size_become_columns() -> None:
    payload = b"".join(record(10 + n, 1_700_000_000_000 + n, {}, b"%03d" % n) for n in range(300))
    got = rows(payload, 10, 300)
    assert [r["value"] for r in got] == [b"%03d" % n for n in range(300)]
    assert [r["id"] for r in got] == list(range(10, 310))
    assert {r["topic"] for r in got} == {"t"}
    assert all(r["key"] is None for r in got)
    assert [int(r["timestamp"].timestamp() * 1000) for r in got[:2]] == [1_700_000_000_000, 1_700_000_000_001]


def expected(made: list[tuple[int, int, dict[bytes, bytes], bytes]]) -> list[dict]:
    """What each record becomes, decoded on its own."""
    return [{"id": record_id, "value": body, "key": headers.get(b"KEY"), "stamp": stamp,
             "headers": [{"key": k.decode(), "value": v} for k, v in headers.items() if k != b"KEY"]}
            for record_id, stamp, headers, body in made]


def seen(got: list[dict]) -> list[dict]:
    return [{"id": row["id"], "value": row["value"], "key": row["key"], "headers": row["headers"],
             "stamp": round(row["timestamp"].timestamp() * 1000)} for row in got]


@pytest.mark.parametrize("stamps", [range(0, 128, 3), range(128, 256), range(256, 300), range(70_000, 70_040),
                                    range(5_000_000_000, 5_000_000_040)],
                         ids=["fixint", "uint8", "uint16", "uint32", "uint64"])
def test_records_of_one_layout_are_read_as_columns_of_rows(stamps: range) -> None:
    """Records of one size and layout (the strided path) give what decoding each one gives, cut or not, for
    every timestamp width; a run of one size whose records differ in layout is read record by record."""
    made = [(7 + n, stamp, {}, bytes([n]) * 50) for n, stamp in enumerate(stamps)]
    payload = b"".join(record(*entry) for entry in made)
    assert seen(rows(payload, 7, len(made), headers=True)) == expected(made)
    assert seen(rows(payload, 7, len(made), headers=True, stop_id=9)) == expected(made[:2])
    assert rows(payload, 7, len(made), headers=True, stop_id=7) == []
    # The same size, another layout: a header in place of five bytes of body.
    odd = (7 + len(made), stamps[0], {b"K": b""}, bytes(50 - 5))
    payload += record(*odd)
    assert len(record(*odd)) == len(record(*made[0]))
    assert seen(rows(payload, 7, len(made) + 1, headers=True)) == expected([*made, odd])


def test_records_of_many_shapes_become_the_same_columns() -> None:
    stamps = [0, 5, 200, 70_000, 5_000_000_000, 1_700_000_000_000]  # fixint, uint8/16/32/64
    made = []
    for n in range(60):
        headers = {b"KEY": b"k%d" % n, b"X-A": b"v"} if n % 4 == 0 else ({b"X-B": b"w"} if n % 5 == 0 else {})
        made.append((n + 1, stamps[n % len(stamps)], headers, b"b" * (n * 7 % 300)))
    payload = b"".join(record(*entry) for entry in made)
    got = rows(payload, 1, 60, headers=True)
    for row, (record_id, stamp, headers, body) in zip(got, made, strict=True):
        assert row["id"] == record_id
        assert row["value"] == body
        assert row["key"] == headers.get(b"KEY")
        assert row["headers"] == [{"key": k.decode(), "value": v} for k, v in headers.items() if k != b"KEY"]
        assert int(row["timestamp"].timestamp() * 1000) == stamp


def test_a_stop_id_cuts_the_batch_and_a_bad_record_is_refused() -> None:
    payload = b"".join(record(n, 1, {}, b"x" * (n % 3)) for n in range(1, 21))
    assert [r["id"] for r in rows(payload, 1, 20, stop_id=8)] == list(range(1, 8))
    broken = bytearray(payload)
    broken[-1] ^= 0xFF
    with pytest.raises(ProtocolError, match="CRC"):
        rows(bytes(broken), 1, 20)
    assert len(rows(bytes(broken), 1, 20, check_crc=False)) == 20, "checkCrcs=false trusts the bytes"
    uniform = b"".join(record(n, 1, {}, b"xy") for n in range(1, 21))
    broken = bytearray(uniform)
    broken[-1] ^= 0xFF
    with pytest.raises(ProtocolError, match="CRC"):
        rows(bytes(broken), 1, 20)


@pytest.mark.parametrize("names",
                         [["value"], ["id", "value"], ["timestamp", "key", "topic"], ["headers", "id"]])
def test_only_the_columns_a_schema_names_are_built_in_its_order(names: list[str]) -> None:
    from pyspark.sql.types import StructType

    payload = (b"".join(record(n, 1_700_000_000_000 + n, {}, b"v%d" % n) for n in range(1, 4))
               + record(4, 1_700_000_000_004, {b"KEY": b"k", b"X": b"y"}, b"v4"))
    full = rows(payload, 1, 4, headers=True)
    chosen = StructType([SCHEMA_WITH_HEADERS[name] for name in names])
    schema = to_arrow_schema(chosen, timezone="UTC")
    batch = to_batch(payload, 1, 4, "t", schema)
    assert batch.schema.equals(schema)
    assert batch.to_pylist() == [{name: row[name] for name in names} for row in full]
