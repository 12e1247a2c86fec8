"""The project's CRC-32 (``protocol.checksum``) is zlib's, value for value: stored records and journals
written with either read back with the other. Where the fast one is installed (it is a dependency on the
machines CI runs on), it is the one in use."""

from __future__ import annotations

import platform
import random
import zlib

import pytest

from protocol.checksum import crc32


@pytest.mark.parametrize("size", [0, 1, 7, 8, 15, 16, 63, 64, 122, 255, 4096, 100_000, 1 << 20])
def test_the_same_values_as_zlib(size: int) -> None:
    data = random.Random(size).randbytes(size)
    assert crc32(data) == zlib.crc32(data)
    for start in (0, 1, 0xFFFFFFFF, 0x12345678):
        assert crc32(data, start) == zlib.crc32(data, start)
    half = size // 2
    assert crc32(data[half:], crc32(data[:half])) == zlib.crc32(data)  # chained, as the store's heads are
    assert crc32(memoryview(data)[half:]) == zlib.crc32(data[half:])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"),
                    reason="isal is a dependency only where it has wheels")
def test_the_fast_one_is_in_use_where_it_is_a_dependency() -> None:
    assert crc32.__module__.startswith("isal")
