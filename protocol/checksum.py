"""The one CRC-32 of the project: the checksum of every stored record, journal entry and records reply.

It is zlib's CRC-32 (the IEEE polynomial, as ``zlib.crc32`` and ``binascii.crc32`` compute it), taken from
Intel's ISA-L through the ``isal`` package where it is installed: the same values, computed with the
carry-less multiply instructions. Measured here: 12 GB/s against zlib's 1.5 on a 130 MB buffer, 0.08 us
against 0.17 for a 122-byte record (call included). The broker computes one per record it stores and the
Spark source checks one per record it reads, so this is part of what every message costs; a broker storing
``publish_batch`` entries of 100 bytes spent 11% less CPU a message with it.

Where ``isal`` has no wheel (and was not built), zlib's is used: same results, slower.
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the platforms without an isal wheel
    from zlib import crc32

__all__ = ["crc32"]
