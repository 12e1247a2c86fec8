"""The one exception a codec raises: the peer (or the caller) broke the protocol's rules.

Shells catch it and answer with the dialect's error reply or close the connection; it never reaches the loop.
"""


class ProtocolError(Exception):
    """Input that breaks the protocol; ``str(error)`` is fit to send back to the peer.

    ``command_id`` carries the request's ID when the decoder got far enough to read it, so the error reply can
    name the command it refuses (mc0 requires that).
    """

    def __init__(self, message: str, *, command_id: bytes | None = None) -> None:
        super().__init__(message)
        self.command_id = command_id
