# syntax=docker/dockerfile:1
#
# The worker image. It also carries the demo producer and consumer that
# docker-compose.yml runs (entrypoint /usr/local/bin/producer or consumer).
#
#   docker build -t outbox .
#   docker run --rm outbox help
#   docker run --rm -e OUTBOX_MONGO_URI=... -e OUTBOX_AMQP_URL=... -p 8080:8080 outbox
#   docker run --rm -e OUTBOX_MONGO_URI=... outbox stats

# The exact version go.mod asks for: the official images set
# GOTOOLCHAIN=local, so an older Go would refuse to build.
ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION} AS build
# The build the worker names (worker version, /status,
# outbox_build_info): docker build --build-arg VERSION=v0.1.0 --build-arg
# REVISION=$(git rev-parse HEAD) --build-arg BUILD_DATE=$(date -u
# +%Y-%m-%dT%H:%M:%SZ). Unset, it says devel and unknown: the build
# context has no .git to read them from.
ARG VERSION=""
ARG REVISION=""
ARG BUILD_DATE=""
WORKDIR /src
ENV CGO_ENABLED=0
# The whole context: go.mod replaces the public module
# (github.com/outboxrelay/outbox/events) with ./events, so the build needs
# that directory as much as the relay's own.
COPY . .
# Static binaries; the module and build caches survive between builds.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath \
      -ldflags="-s -w -X github.com/outboxrelay/outbox/internal/buildinfo.Version=${VERSION} -X github.com/outboxrelay/outbox/internal/buildinfo.Revision=${REVISION} -X github.com/outboxrelay/outbox/internal/buildinfo.BuildDate=${BUILD_DATE}" \
      -o /out/ ./cmd/worker ./cmd/producer ./cmd/consumer

FROM gcr.io/distroless/static-debian12:nonroot
# The same build arguments: the labels say the build the worker names
# (.goreleaser.yaml labels a release's image the same way).
ARG VERSION=""
ARG REVISION=""
ARG BUILD_DATE=""
LABEL org.opencontainers.image.title="outbox" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.source="https://github.com/outboxrelay/outbox" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /usr/local/bin/
COPY LICENSE /usr/share/doc/outbox/LICENSE
# uid 65532: the worker needs no privileges, no shell and no writable files.
USER nonroot:nonroot
# OUTBOX_HTTP_ADDR: /healthz, /readyz, /metrics, /status, /trigger. It
# listens on every interface so that probes and Prometheus reach it; POST
# /trigger needs OUTBOX_HTTP_TOKEN from other hosts. The profiler
# (OUTBOX_PPROF_ADDR) is loopback only and not exposed.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/worker"]
CMD ["run"]
