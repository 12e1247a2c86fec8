"""Sans-IO codecs for every dialect mc0 speaks.

Nothing in this package touches a socket, a clock, a thread or a logger: bytes or frames go in, events come
out, and events go back to bytes or frames. Time, where a protocol needs it, is an argument.
"""

from protocol.errors import ProtocolError

__all__ = ["ProtocolError"]
