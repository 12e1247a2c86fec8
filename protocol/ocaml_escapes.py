"""The text of a quoted sexp atom with its OCaml escapes decoded in bulk: numpy over a whole piece of text, no
Python step per escape.

The escapes are sexplib's (:mod:`protocol.sexp`): ``\\DDD`` (decimal, at most 255), ``\\xHH``, the named
ones (``\\\\ \\" \\' \\n \\t \\b \\r`` and backslash-space), and backslash-newline with the next line's
indentation; a backslash followed by anything else stays as it is. A binary body written by a sexp printer is
mostly ``\\DDD``: a 2 MiB body is about 6 MB of text, an escape every four bytes.

Why numpy: the general reader (a regular expression splits the text into escapes and what lies between, a
table lookup is mapped over the escapes, a join) has no Python call per escape and still took 250-335 ms for
that body, more than one ``bytes.split`` of the line, and no decoder in the standard library reads decimal
escapes. numpy is already the store's dependency. Here a piece costs a fixed number of whole-array operations
(about 0.4 ms for 64 KiB, 35 ms for the 2 MiB body):

1. Where escapes start. Only the escape ``\\\\`` swallows a backslash, so in a run of backslashes they pair
   off from the first; an odd last one starts an escape with whatever follows the run.
2. What each is, by the bytes after its backslash: three digits, ``x`` and two hex digits, or a named byte.
3. The atom ends at the first quote no escape start stands before.
4. The decoded text: each escape's value at its backslash, its other bytes dropped (one mask).

:func:`decode` leaves to the general reader the pieces too short or with too few escapes for whole-array work
to pay (:data:`MIN_PIECE`, :data:`SPARSE`) and those holding a continuation (whose length is the next line's
indentation).

This module knows the escapes and numpy, nothing about sockets or the rest of the grammar.
"""

from __future__ import annotations

import numpy as np

from protocol.errors import ProtocolError

#: Below this many bytes a piece is decoded faster by the general reader than by numpy's fixed cost.
MIN_PIECE = 4096
#: A piece with fewer backslashes than one in this many bytes is too: the general reader's cost goes with the
#: escapes, this module's with the bytes (measured on a MiB of text: about 2.3 ms each with an escape every
#: 128 bytes; every 8 bytes, 23 ms against 4).
SPARSE = 128
#: Bytes an escape may need after its backslash (``\\DDD``, ``\\xHH``).
_TAIL = 3

_BACKSLASH, _QUOTE = 0x5C, 0x22
#: The named escapes: the byte after the backslash -> what the two stand for.
_NAMED = {0x5C: 0x5C, 0x22: 0x22, 0x27: 0x27, 0x20: 0x20, 0x6E: 0x0A, 0x74: 0x09, 0x62: 0x08, 0x72: 0x0D}
#: The byte after a backslash -> the value of the named escape the two make, -1 where they make none.
_NAMED_VALUES = np.full(256, -1, dtype=np.int16)
_NAMED_VALUES[list(_NAMED)] = list(_NAMED.values())


def decode(piece: bytes, complete: bool) -> tuple[bytes, int, bool] | None:
    """Decode the text of a quoted atom that ``piece`` begins (after its opening quote or an earlier piece):
    ``(decoded bytes, bytes of the piece used, whether its closing quote was found)``; the quote is counted in
    what was used. ``complete`` says the text ends with the piece; otherwise an escape that may go on past it
    is left for the next piece. None when the general reader must read this piece: it is shorter than
    :data:`MIN_PIECE`, has few escapes (:data:`SPARSE`), or holds a continuation.

    ProtocolError for a decimal escape above 255 (before the closing quote), as the general reader."""
    size = len(piece)
    if size < MIN_PIECE:
        return None
    # Padded with zeros (no digit, no backslash): what lies past the end reads as "not part of an escape".
    text = np.frombuffer(piece + bytes(_TAIL + 1), dtype=np.uint8)
    body, after = text[:size], text[1 : size + 1]

    # 1. Escape starts: every backslash, less the second of each pair in a run of them. Runs are rare (a
    # backslash in the data, \\), so they are worked out among the backslashes that have one beside them:
    # ``doubled`` holds each position whose next byte is a backslash too; in a chain of them beginning at p,
    # the bytes p+1, p+3, ... are seconds of pairs.
    starts = body == _BACKSLASH
    if np.count_nonzero(starts) < size // SPARSE:
        return None
    doubled = np.flatnonzero(starts[:-1] & starts[1:])
    if len(doubled):
        order = np.arange(len(doubled))
        begins = np.empty(len(doubled), dtype=bool)
        begins[0] = True
        np.not_equal(np.diff(doubled), 1, out=begins[1:])
        chain_start = doubled[np.maximum.accumulate(np.where(begins, order, 0))]
        starts[doubled[((doubled - chain_start) & 1) == 0] + 1] = False
    # A continuation is \ and a line end (and the indentation after it): the general reader's. (Raw line
    # ends are rare in a quoted atom: looked for first, with memchr.)
    if (b"\n" in piece or b"\r" in piece) and (starts & ((after == 0x0A) | (after == 0x0D))).any():
        return None

    # 2. What each is: digits at +1, +2, +3 make \DDD, x and two hex digits \xHH, a named byte a two-byte
    # escape (these two are few, so they are found among the rest by index), anything else is no escape.
    digits = (text - 48) < 10  # uint8 arithmetic: the bytes below "0" wrap around
    four = starts & digits[1 : size + 1]
    four &= digits[2 : size + 2]
    four &= digits[3 : size + 3]
    decimal = four.copy()
    others = np.flatnonzero(starts & ~four)
    following = after[others]
    hexadecimal = others[following == ord("x")]
    if len(hexadecimal):
        worth = np.where(digits, text - 48, ((text | 0x20) - 87).astype(np.uint8))  # as a hex digit
        is_hex = digits | (((text | 0x20) - 97) < 6)  # a-f, A-F
        hexadecimal = hexadecimal[is_hex[hexadecimal + 2] & is_hex[hexadecimal + 3]]
        four[hexadecimal] = True
    values = _NAMED_VALUES[following]
    two = others[values >= 0]
    two_values = values[values >= 0]

    # 3. The end: the first quote that no escape start stands before (\" is an escape start and its quote).
    quotes = body == _QUOTE
    quotes[1:] &= ~starts[:-1]
    closed = bool(quotes.any())
    if closed:
        end = int(np.argmax(quotes))
        used = end + 1
    else:
        end = size
        if not complete:
            # An escape begun in the last bytes may go on in the next piece: leave it, and what follows.
            complete_two = set(two[two >= size - _TAIL].tolist())
            for at in range(size - _TAIL, size):
                if starts[at] and not four[at] and at not in complete_two:
                    end = at
                    break
        if end == 0:
            return None  # all one escape that may go on (only a piece shorter than MIN_PIECE can be)
        used = end

    # 4. The decoded bytes: each escape's value at its backslash, its other bytes dropped.
    out = body[:end].copy()
    chosen = decimal[:end]
    if chosen.any():
        hundreds = after[:end].astype(np.uint16)
        # 5328 = 48 * 111: the three digits' "0"s.
        number = hundreds * 100 + text[2 : end + 2].astype(np.uint16) * 10 + text[3 : end + 3] - 5328
        above = chosen & (number > 255)
        if above.any():
            at = int(np.argmax(above))
            raise ProtocolError(f"bad s-expression: escape {piece[at : at + 4].decode()} is above 255")
        # out = number where chosen, else out: in bytes, with wrap-around (number fits, checked above).
        out += (number.astype(np.uint8) - out) * chosen
    if len(hexadecimal):
        hexadecimal = hexadecimal[hexadecimal < end]
        out[hexadecimal] = worth[hexadecimal + 2] * 16 + worth[hexadecimal + 3]
    inside = two < end
    out[two[inside]] = two_values[inside]
    dropped = np.zeros(size + _TAIL, dtype=bool)
    dropped[two + 1] = True
    dropped[1 : size + 1] |= four
    dropped[2 : size + 2] |= four
    dropped[3 : size + 3] |= four
    return out[~dropped[:end]].tobytes(), used, closed
