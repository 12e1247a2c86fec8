# The mc0 broker as a container image.
#
#   docker build -t mc0 .
#   docker run -d --name mc0 -p 61616:61616 -v mc0-keys:/keys -v mc0-data:/data mc0
#
# On first start the broker writes its CURVE key pair and a default client key pair into /keys (see
# keys/README.md); keep that volume, or every client that pinned the broker's public key is locked out.
# docker-compose.yml beside this file runs the same image with named volumes and a healthcheck.

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The broker never needs root: a fixed uid/gid so that files in the volumes keep one owner across rebuilds.
RUN groupadd --system --gid 10001 mc0 \
 && useradd --system --uid 10001 --gid mc0 --home-dir /var/lib/mc0 --no-create-home \
        --shell /usr/sbin/nologin mc0

# Install the project (the build context is trimmed by .dockerignore: no keys, no data, no caches).
WORKDIR /usr/src/mc0
COPY . .
RUN pip install --no-cache-dir .

# The folders exist and belong to mc0 before they are declared volumes, so a fresh named volume starts out
# owned by mc0 (Docker copies the image folder's owner and mode into an empty named volume).
RUN mkdir -p /var/lib/mc0 /keys /data \
 && chown mc0:mc0 /var/lib/mc0 /keys /data \
 && chmod 0700 /keys
WORKDIR /var/lib/mc0
VOLUME ["/keys", "/data"]

# `docker exec <container> mc0 stats` (or pub, sub) finds the broker and the client key without options.
ENV MC0_KEYS=/keys \
    MC0_BROKER=tcp://127.0.0.1:61616

USER mc0
EXPOSE 61616

# The broker's monitoring endpoint listens on the container's loopback (127.0.0.1:8222): `mc0 health` asks its
# /healthz, which needs no keys and fails when the loop stalls or the store fails. To scrape /metrics from
# outside, add `--http 0.0.0.0:8222` to the command and publish the port (docs/monitoring.md).
HEALTHCHECK --interval=30s --timeout=10s --start-period=10s --retries=3 \
    CMD ["mc0", "health", "--http", "127.0.0.1:8222"]

# Exec form: the broker is PID 1 and gets SIGTERM (graceful stop) and SIGHUP (re-read the allow-list) itself.
# Other subcommands run the same way: `docker run --rm -v mc0-keys:/keys mc0 keys generate --client alice`.
ENTRYPOINT ["mc0"]
CMD ["broker", "--bind", "tcp://0.0.0.0:61616", "--keys", "/keys", "--data-dir", "/data"]
