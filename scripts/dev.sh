#!/usr/bin/env bash
# `make dev`: the whole relay on this machine, without Docker or MongoDB.
#
#   devdb      FerretDB (MongoDB wire protocol) on the local PostgreSQL,
#              database outbox_dev, at 127.0.0.1:27017
#   consumer   durable queue outbox-demo-ordered (single active consumer) bound
#              with "#" to exchange "events", deduplicating through the inbox
#              package (collection inbox in devdb)
#   worker x3  HTTP on :8081, :8082, :8083; worker ids <hostname>-<pid>
#   producer   order.created events at PRODUCER_RATE per second (default 20)
#   summary    bin/devwatch: every 2 s one line on the terminal (published
#              per second, the backlog, each replica's count, the consumer's
#              totals and the duplicates it skipped)
#
# PostgreSQL and RabbitMQ are installed where missing and started where not
# running, exactly as make test does (both use scripts/servers.sh), and left
# running afterwards: other work on this machine shares them. That needs
# root or passwordless sudo; without either, servers already running are
# used, and a missing one stops the script with the one command to run
# (sudo scripts/servers.sh). Ctrl-C (or SIGTERM) stops everything else this
# script started, in an order that lets the workers finish their batches:
# producer, workers, consumer, devdb. Logs go to a fresh directory under
# /tmp, printed at start.
#
# Environment: PRODUCER_RATE (20), DEVDB_LISTEN (127.0.0.1:27017),
# DEVDB_POSTGRES_URL (postgres://postgres@127.0.0.1:5432/outbox_dev).
#
# FerretDB has no transactions, and its claims are not atomic when two
# workers claim the same events at once; the three workers do not: they
# divide the outbox by partition, taken with inserts that are atomic on
# FerretDB too. So the demo delivers each event once, and a duplicate needs
# a failure (a worker killed mid-batch, a lost confirm), which the
# consumer's inbox skips and counts. See docs/design.md, "Where duplicates
# come from".
set -euo pipefail

cd "$(dirname "$0")/.."

PRODUCER_RATE=${PRODUCER_RATE:-20}
DEVDB_LISTEN=${DEVDB_LISTEN:-127.0.0.1:27017}
DEVDB_POSTGRES_URL=${DEVDB_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/outbox_dev}
WORKER_PORTS=(8081 8082 8083)

# PostgreSQL and RabbitMQ: installed and started the same way as for CI
# (.ci/run), by the functions of scripts/servers.sh (which also defines
# log, die, port_open, HOST and AMQP_PORT).
# shellcheck source=scripts/servers.sh
. scripts/servers.sh

ensure_ports_free() {
	local addr
	for addr in "$DEVDB_LISTEN" "${WORKER_PORTS[@]/#/127.0.0.1:}"; do
		if port_open "${addr%:*}" "${addr##*:}"; then
			die "$addr is already in use (another make dev or devdb?); stop it first"
		fi
	done
}

# Children, in the order they stop: producer, workers, consumer, devdb.
PIDS=()
NAMES=()

# start NAME COMMAND...: run COMMAND in the background, logging to
# $LOG_DIR/NAME.log. Job control (set -m below) puts it in its own process
# group, so a Ctrl-C reaches only this script, which stops the children in
# order rather than all at once.
start() {
	local name=$1; shift
	"$@" >"$LOG_DIR/$name.log" 2>&1 &
	PIDS+=("$!")
	NAMES+=("$name")
	log "started $name (pid $!): $*"
}

# stop_pid NAME PID: SIGTERM, then up to 40s (a worker's shutdown timeout is
# 30s) before SIGKILL.
stop_pid() {
	local name=$1 pid=$2 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 400; i++)); do
		kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
		sleep 0.1
	done
	log "$name (pid $pid) did not stop in 40s: SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

STOPPING=false
cleanup() {
	$STOPPING && return
	STOPPING=true
	set +e +m # +m: no job notices for the children stopped below
	trap '' INT TERM # a second Ctrl-C must not cut the drain short
	echo
	log "stopping"
	local i pids=()
	# The summary first (quietly), then the producer, so no new events arrive.
	for ((i = 0; i < ${#NAMES[@]}; i++)); do
		case ${NAMES[i]} in summary | producer) stop_pid "${NAMES[i]}" "${PIDS[i]}" ;; esac
	done
	# The workers together: each drains its batch and releases the rest.
	for ((i = 0; i < ${#NAMES[@]}; i++)); do
		case ${NAMES[i]} in worker-*)
			kill -TERM "${PIDS[i]}" 2>/dev/null || true
			pids+=("$i")
			;;
		esac
	done
	for i in "${pids[@]}"; do stop_pid "${NAMES[i]}" "${PIDS[i]}"; done
	# Then the consumer, which has counted the last confirms, and devdb last.
	for ((i = 0; i < ${#NAMES[@]}; i++)); do
		case ${NAMES[i]} in consumer) stop_pid consumer "${PIDS[i]}" ;; esac
	done
	for ((i = 0; i < ${#NAMES[@]}; i++)); do
		case ${NAMES[i]} in devdb) stop_pid devdb "${PIDS[i]}" ;; esac
	done
	if [ -n "${LOG_DIR:-}" ] && [ -f "$LOG_DIR/consumer.log" ]; then
		log "consumer totals: $(grep '"consumer stopped"' "$LOG_DIR/consumer.log" | tail -n 1 || true)"
	fi
	log "stopped everything make dev started; PostgreSQL and RabbitMQ keep running. Logs: ${LOG_DIR:-none}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

command -v go >/dev/null 2>&1 || die "go is not on PATH"

log "building bin/worker bin/devdb bin/producer bin/consumer bin/devwatch"
mkdir -p bin
for cmd in worker devdb producer consumer devwatch; do
	go build -o "bin/$cmd" "./cmd/$cmd"
done

ensure_postgres
ensure_rabbitmq
# Not for the stack: make api-check's tool, so that a developer has what
# CI runs (scripts/servers.sh pins it).
ensure_apidiff
ensure_ports_free

LOG_DIR=$(mktemp -d /tmp/outbox-dev.XXXXXX)
log "logs: $LOG_DIR"
set -m

start devdb bin/devdb --listen "$DEVDB_LISTEN" --postgres-url "$DEVDB_POSTGRES_URL"
deadline=$((SECONDS + 30))
until port_open "${DEVDB_LISTEN%:*}" "${DEVDB_LISTEN##*:}"; do
	kill -0 "${PIDS[0]}" 2>/dev/null || die "devdb exited: $(tail -n 5 "$LOG_DIR/devdb.log")"
	((SECONDS < deadline)) || die "devdb did not listen on $DEVDB_LISTEN within 30s; see $LOG_DIR/devdb.log"
	sleep 0.2
done
log "devdb: serving on $DEVDB_LISTEN"

export OUTBOX_MONGO_URI="mongodb://$DEVDB_LISTEN/"
export OUTBOX_AMQP_URL="amqp://guest:guest@$HOST:$AMQP_PORT/"
export OUTBOX_AMQP_EXCHANGE=events

# The consumer binds its queue before any worker publishes: a message no
# queue is bound to comes back unroutable and is retried with backoff.
# x-expires lets RabbitMQ drop the demo queue 15 minutes after make dev
# stops, so it does not collect messages on a shared broker forever.
# It keeps its inbox in devdb (OUTBOX_MONGO_URI above): FerretDB has no
# transactions, so it logs once that its handler must be idempotent.
# The queue has single active consumer (docs/ordering.md); the demo queue
# of older versions, outbox-demo, had not and cannot gain it, hence the name.
start consumer bin/consumer --queue outbox-demo-ordered --queue-expires 15m --report-every 5s
sleep 1

# One replica after the other, each once /readyz says it is ready.
for i in "${!WORKER_PORTS[@]}"; do
	port=${WORKER_PORTS[i]}
	OUTBOX_HTTP_ADDR=":$port" start "worker-$((i + 1))" bin/worker run
	deadline=$((SECONDS + 60))
	until curl -fsS -o /dev/null "http://127.0.0.1:$port/readyz" 2>/dev/null; do
		kill -0 "${PIDS[-1]}" 2>/dev/null || die "worker-$((i + 1)) exited: $(tail -n 5 "$LOG_DIR/worker-$((i + 1)).log")"
		((SECONDS < deadline)) || die "worker-$((i + 1)) not ready within 60s; see $LOG_DIR/worker-$((i + 1)).log"
		sleep 0.1
	done
done
log "workers ready: :${WORKER_PORTS[*]}"
start producer bin/producer --rate "$PRODUCER_RATE"
# The summary, on the terminal: one line every 2 s.
workers_csv=$(printf 'http://127.0.0.1:%s,' "${WORKER_PORTS[@]}")
bin/devwatch --workers "${workers_csv%,}" --consumer-log "$LOG_DIR/consumer.log" --every 2s &
PIDS+=("$!")
NAMES+=(summary)

cat <<EOF

==> running. Where to look:
      curl -s localhost:8081/status          (also :8082, :8083; /readyz, /metrics)
      OUTBOX_MONGO_URI=$OUTBOX_MONGO_URI bin/worker stats
      tail -f $LOG_DIR/worker-1.log          (the consumer's: $LOG_DIR/consumer.log)
    A summary follows below, every 2 s: published per second, the backlog,
    each replica's published count, and the consumer's totals with the
    duplicates its inbox skipped. Ctrl-C stops everything.

EOF

# Wait until a signal, or until a child that should run forever exits.
while true; do
	for ((i = 0; i < ${#PIDS[@]}; i++)); do
		if ! kill -0 "${PIDS[i]}" 2>/dev/null; then
			log "${NAMES[i]} exited unexpectedly; last lines of $LOG_DIR/${NAMES[i]}.log:"
			tail -n 5 "$LOG_DIR/${NAMES[i]}.log" >&2 || true
			exit 1
		fi
	done
	sleep 2 &
	wait $! || true
done
