# kvgate container image.
#
#   docker build -t kvgate .
#   docker run -p 8080:8080 -v "$PWD/my.toml:/etc/kvgate/kvgate.toml:ro" kvgate
#
# The build step is exactly `cargo build --release --locked`, which CI (.ci/run) also runs.
# Without a config file mounted at /etc/kvgate/kvgate.toml the built-in defaults apply (an embedded
# simulated fleet when no pools are configured).

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
    && install -D -m 0755 target/release/kvgate /out/kvgate

FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 kvgate \
    && useradd --system --uid 10001 --gid kvgate --no-create-home --shell /usr/sbin/nologin kvgate \
    && mkdir -p /etc/kvgate
COPY --from=build /out/kvgate /usr/local/bin/kvgate
COPY config/kvgate.toml /etc/kvgate/kvgate.toml
ENV KVGATE_CONFIG=/etc/kvgate/kvgate.toml \
    KVGATE_LISTEN=0.0.0.0:8080 \
    KVGATE_LOG_FORMAT=json
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/kvgate", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/kvgate"]
