# weir's container image: one static binary in an empty image, run as a
# non-root user, with a health check that needs no shell.
#
#   docker build -t weir .     # or: podman build --format docker -t weir .
#                              (OCI images, podman's default, have no HEALTHCHECK)
#   docker run -p 8080:8080 -p 8081:8081 -p 9090:9090 weir
#   docker run -v ./weir.toml:/etc/weir/weir.toml:ro … weir
#
# `--build-arg binary=context` takes a binary built on the host instead of
# compiling one (tools/static.sh builds it; the build context is then a
# directory holding `weir` and `weir.toml`): how crates/cli/tests/deploy.rs
# builds and runs this image where the builder's base image cannot be pulled.
ARG binary=source

# The static binary, compiled from source (glibc, linked statically: it runs
# on any x86-64 Linux, and in an image with nothing else in it).
FROM docker.io/library/rust:1.95-bookworm AS source
WORKDIR /src
COPY . .
RUN tools/static.sh && \
    cp target/x86_64-unknown-linux-gnu/release/weir /weir && \
    cp deploy/container/weir.toml /weir.toml

# Or the binary built on the host.
FROM scratch AS context
COPY weir weir.toml /

FROM ${binary} AS binary

FROM scratch
COPY --from=binary /weir /weir
COPY --from=binary /weir.toml /etc/weir/weir.toml
# No /etc/passwd in the image: a numeric user (distroless's `nonroot`).
USER 65532:65532
# 8080 gateway and /healthz, 8081 the Envoy rate limit service (gRPC),
# 9090 the decision API, admin, /metrics and /readyz.
EXPOSE 8080 8081 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/weir", "healthcheck", "http://127.0.0.1:9090/readyz"]
ENTRYPOINT ["/weir"]
CMD ["serve", "--config", "/etc/weir/weir.toml"]
