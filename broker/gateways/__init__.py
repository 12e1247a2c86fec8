"""The raw TCP doors: one asyncio server per dialect, all feeding the one engine through the hub.

:mod:`broker.gateways.tcp` is the shell they share (listening, connections, flow control, liveness ticks);
each dialect module (``sexp.py``, ...) is a thin :class:`~broker.gateways.tcp.Connection` subclass that maps
its sans-IO codec's events (from :mod:`protocol`) onto engine calls and encodes deliveries.
"""
