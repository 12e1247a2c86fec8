"""``broker.cluster.raft.check_state``: PySyncObj's files (its journal, the journal's term and vote, its full
dump) are checked before a cluster member starts, so that one cut short or damaged (a crash or a power loss
while it was written) is a one-line error naming the file and what to do, where PySyncObj stopped the broker
with a bare ``struct.error``, read zeros as records, forgot the vote or went on without its snapshot. Also
the whole path: ``mc0 broker`` with a damaged journal exits with one line."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from pysyncobj import journal
from pysyncobj import pickle as pysyncobj_pickle

from bench.throughput import free_ports
from broker.cluster.raft import RaftStateError, check_state


def written(path: Path, count: int = 5) -> Path:
    """A journal PySyncObj wrote, with ``count`` records."""
    made = journal.FileJournal(str(path))
    for index in range(1, count + 1):
        made.add(b"command %d" % index, index, 1)
    made.flush()
    made._destroy()  # closes its memory map (the file stays)
    return path


def test_state_pysyncobj_wrote_passes_and_none_is_a_new_member(tmp_path: Path) -> None:
    written(tmp_path / "raft.journal")
    check_state(tmp_path)
    written(tmp_path / "raft.journal", count=0)
    check_state(tmp_path)
    check_state(tmp_path / "new")


def test_a_journal_cut_short_or_damaged_is_named_with_what_is_wrong(tmp_path: Path) -> None:
    path = written(tmp_path / "raft.journal")
    data = path.read_bytes()
    (end,) = struct.unpack_from("<I", data, journal.LAST_RECORD_OFFSET_OFFSET)
    path.write_bytes(data[:end - 3])
    with pytest.raises(RaftStateError, match=r"journal: its records end at byte \d+, past its \d+ bytes"):
        check_state(path.parent)
    damaged = bytearray(data)
    damaged[journal.FIRST_RECORD_OFFSET] ^= 0x40  # the first record's leading length
    path.write_bytes(bytes(damaged))
    first = journal.FIRST_RECORD_OFFSET
    with pytest.raises(RaftStateError, match=f"the record at byte {first} is damaged"):
        check_state(path.parent)
    path.write_bytes(b"")
    with pytest.raises(RaftStateError, match="is not a PySyncObj journal"):
        check_state(path.parent)


def test_a_term_and_vote_file_that_does_not_decode_is_named(tmp_path: Path) -> None:
    path = written(tmp_path / "raft.journal")
    meta = tmp_path / "raft.journal.meta"
    journal.MetaStorer(str(meta)).storeMeta({"currentTerm": 3, "votedForNodeId": "127.0.0.1:1"})
    check_state(path.parent)
    meta.write_bytes(b"")  # renamed into place before its bytes reached the disk, then a power loss
    with pytest.raises(RaftStateError, match=r"raft.journal.meta does not decode"):
        check_state(path.parent)


def test_a_full_dump_that_does_not_decode_is_named(tmp_path: Path) -> None:
    dump = tmp_path / "raft.dump"
    with gzip.open(dump, "wb") as packed:
        pysyncobj_pickle.dump(({"state": 1}, (1, 2), (3, 4), []), packed)
    check_state(tmp_path)
    dump.write_bytes(dump.read_bytes()[:-8])  # cut short
    with pytest.raises(RaftStateError, match=r"raft\.dump does not decode"):
        check_state(tmp_path)


@pytest.mark.timeout(30)
def test_a_member_with_a_damaged_journal_is_refused_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / ".cluster").mkdir(parents=True)
    path = written(data / ".cluster" / "raft.journal")
    path.write_bytes(path.read_bytes()[:60])
    rafts = [f"127.0.0.1:{port}" for port in free_ports(2)]
    result = subprocess.run(
        [sys.executable, "-c", "from connector.cli import main; main()", "broker", "--bind", "tcp://127.0.0.1:0",
         "--sexp", "off", "--msgq", "off", "--rstreams", "off", "--lumberjack", "off", "--http", "off",
         "--no-curve", "--data-dir", str(data), "--cluster-node", rafts[0], "--cluster-peer", rafts[1]],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    assert "Raft's state: " in errors[0]
    assert "raft.journal: its records end at byte" in errors[0]
    assert f"Move {data / '.cluster'} away and start this broker again" in errors[0]
