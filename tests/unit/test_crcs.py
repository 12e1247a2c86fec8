"""The CRCs of many records checked at once (``protocol.crcs``): the combined CRC equals zlib's over the
records back to back, every single flipped bit is caught and the error names its record, and the same error
in two records does not cancel out."""

from __future__ import annotations

import random
import struct
import zlib

import numpy as np
import pytest

from protocol import crcs
from protocol.errors import ProtocolError


@pytest.mark.parametrize("length", [1, 9, 128, 333])
@pytest.mark.parametrize("count", [1, 2, 3, 7, 8, 9, 1000])
def test_the_stored_crcs_combine_into_the_crc_of_the_whole(length: int, count: int) -> None:
    generator = random.Random(length * 10_000 + count)
    pieces = [generator.randbytes(length) for _ in range(count)]
    stored = np.array([zlib.crc32(piece) for piece in pieces], dtype=np.uint32)
    assert crcs.combine(stored, length) == zlib.crc32(b"".join(pieces))


def records_of_one_size(count: int, body: int) -> tuple[bytearray, np.ndarray]:
    """``count`` records as the store lays them out (length, crc, id, payload), and their stored CRCs."""
    out = bytearray()
    stored = []
    for record_id in range(1, count + 1):
        payload = bytes([record_id % 251]) * body
        crc = zlib.crc32(record_id.to_bytes(8, "big") + payload)
        out += struct.pack(">IIQ", body, crc, record_id) + payload
        stored.append(crc)
    return out, np.array(stored, dtype=">u4")


def check(payload: bytearray, stride: int, count: int, stored: np.ndarray) -> None:
    crcs.check_uniform(np.frombuffer(bytes(payload), dtype=np.uint8), bytes(payload), stride, count, stored)


#: Below FOLD_FROM each record's CRC is computed; from it on they are folded: both ways are checked.
COUNTS = [50, crcs.FOLD_FROM + 16]


@pytest.mark.parametrize("count", COUNTS)
def test_good_records_pass_and_any_flipped_bit_is_named(count: int) -> None:
    body = 20
    stride = 16 + body
    payload, stored = records_of_one_size(count, body)
    check(payload, stride, count, stored)
    generator = random.Random(7)
    for _ in range(200):
        position = generator.randrange(len(payload))
        if position % stride < 8:
            continue  # the length and the CRC itself: the callers check those against the layout
        broken = bytearray(payload)
        broken[position] ^= 1 << generator.randrange(8)
        bad = position // stride * stride
        with pytest.raises(ProtocolError, match=f"CRC mismatch in the record at byte {bad}"):
            check(broken, stride, count, stored)


@pytest.mark.parametrize("count", COUNTS)
def test_the_same_error_in_two_records_is_caught(count: int) -> None:
    body = 10
    stride = 16 + body
    payload, stored = records_of_one_size(count, body)
    broken = bytearray(payload)
    for record in (3, 40):  # the same bit of the same byte of two records
        broken[record * stride + 20] ^= 0x10
    with pytest.raises(ProtocolError, match=f"CRC mismatch in the record at byte {3 * stride}"):
        check(broken, stride, count, stored)
    wrong = stored.copy()
    wrong[5] ^= 1  # a stored CRC that does not match its record
    with pytest.raises(ProtocolError, match=f"record at byte {5 * stride}"):
        check(payload, stride, count, wrong)
