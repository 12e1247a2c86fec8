"""Raft's rule for an appendEntries that overlaps entries a follower holds, where PySyncObj's differs.

Raft (Figure 2 of the paper, "AppendEntries RPC", step 3) deletes a follower's entries only from the first one
that conflicts with the leader's (same index, another term). PySyncObj (0.3.x) deletes everything after the
message's ``prevLogIdx`` whenever the follower holds more, conflicting or not, then appends the message's
entries. A leader sends overlapping messages in the normal run of things: it moves a follower's next index
forward as it sends, and back to what the follower has acknowledged when an older acknowledgement arrives
(``next_node_idx``), so it sends some entries twice; and a message carries at most 64 KB of entries. A
follower that receives the shorter of two overlapping messages second (a hundred topic commands and more at
once) cuts entries it holds, has applied and has acknowledged, until the next message brings them back.
PySyncObj says so at CRITICAL ("truncating already-applied log entries ... state machine may have diverged"),
and between the two messages the follower's log is shorter than what the leader counted towards a majority:
were the leader to die right then, that follower could vote for a candidate missing a committed entry.

:func:`without_held_entries` rewrites such a message, before PySyncObj reads it, into one PySyncObj handles by
Raft's rule: the entries the follower already holds (same index and term) are left out, so nothing is cut
before the first conflict. Where every entry is held and the follower holds more:

- its last entry has the message's term: only that term's leader wrote it, and a leader never removes its own
  entries, so the follower's whole log is the leader's up to there (Raft's log matching property). The message
  becomes a heartbeat at the follower's end, which PySyncObj acknowledges as far as the follower holds:
  nothing is cut and nothing is claimed that the leader lacks;
- otherwise (entries of an older term beyond the message, while a new leader sets the follower's log right)
  the message is left as it is: claiming those entries could claim some the leader does not have, and
  PySyncObj cuts them (Raft would keep those that match and cut the rest at the next message).

Pure: the log is given as its last index and a lookup of terms; :class:`broker.cluster.raft.RaftNode` applies
it in PySyncObj's thread, to PySyncObj's own log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def without_held_entries(message: dict[str, Any], last: int,
                         term_at: Callable[[int], int | None]) -> dict[str, Any]:
    """``message`` as PySyncObj should read it on a follower whose log ends at index ``last``, where
    ``term_at(index)`` is the term of the entry it holds there (None if none): the same message when it adds
    to the log without cutting anything, or one without the entries the log already holds (see the module's
    docstring). Anything but a regular appendEntries comes back unchanged."""
    if message.get("type") != "append_entries" or "transmission" in message:
        return message
    previous = message.get("prevLogIdx")
    if previous is None or previous >= last or term_at(previous) != message.get("prevLogTerm"):
        return message  # nothing held past it to cut, or refused by PySyncObj as it should be
    entries = message.get("entries") or []
    held = previous
    for entry in entries:
        index, term = entry[1], entry[2]
        if index > last or term_at(index) != term:
            break
        held = index
    kept = [entry for entry in entries if entry[1] > held]
    if kept:
        if held == previous:
            return message  # its first entry is new or conflicts: PySyncObj cuts from there, as Raft does
        return {**message, "prevLogIdx": held, "prevLogTerm": term_at(held), "entries": kept}
    if held < last and term_at(last) != message.get("term"):
        return message
    return {**message, "prevLogIdx": last, "prevLogTerm": term_at(last), "entries": []}
