"""The mc0 broker: a pure topic engine, the shells that feed it (ZeroMQ router, TCP gateways) and the loop."""
