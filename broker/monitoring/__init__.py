"""The monitoring room: how operators see a running broker over HTTP.

It owns the HTTP server (:mod:`.http`: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/...`` and the
dashboard), the metric definitions (:mod:`.metrics`, exposed through prometheus-client), the JSON API's views
(:mod:`.views`), the dashboard's static files (``static/``), and the snapshot that feeds them all
(:mod:`.snapshot`).

The broker's loop owns all state, so the room reads it in one way only: a snapshot taken *on the loop*, in
slices of at most a couple of milliseconds, copying counters into immutable records. Everything else, the
Prometheus text, the JSON, the files, happens in the HTTP server's threads, off the loop. Nothing here writes
to broker state; the endpoint is read-only.

It must not know the wire dialects or the engine's delivery rules: it reads the counters STATS reads (topic
attributes, each door's ``stats()``, the hub's histograms) and names a subscriber by its owner's ``who``.
``docs/monitoring.md`` lists every metric and endpoint, and the measured cost of a scrape.
"""

from broker.monitoring.http import Monitor

__all__ = ["Monitor"]
