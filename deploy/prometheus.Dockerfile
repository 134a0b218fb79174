# A stand-in for prom/prometheus when Docker Hub is out of reach: Debian's prometheus package on
# a Debian base (deploy/build_base.sh). Same entrypoint, port and data directory as the registry
# image, so docker-compose.yml's prometheus service runs either (PROMETHEUS_IMAGE).
#   docker build -f deploy/prometheus.Dockerfile --build-arg BASE=rec-base:bookworm -t rec-prometheus deploy
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
