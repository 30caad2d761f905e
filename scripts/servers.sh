#!/usr/bin/env bash
# What the relay and its tests need on this machine, the one place that
# ensures it: PostgreSQL (the backend of the embedded FerretDB that stands
# in for MongoDB) and RabbitMQ, installed with apt-get where they are
# missing, started where they are not running, and left running; and the
# tools of the tests, promtool (the alert rules' unit tests), Chromium
# (the console's browser test), jq (scripts/release-snapshot.sh, which
# scripts/'s tests run) and apidiff (scripts/api-check.sh), installed
# where missing.
#
# scripts/dev.sh (make dev) sources this file and calls ensure_postgres and
# ensure_rabbitmq; make test and make test-race run it alone, which ensures
# everything (ensure_test); .ci/run runs make test. So make dev and make
# test work in either order on a fresh Debian machine with Go, and CI gets
# what a developer gets. Run alone it ensures everything:
#
#   sudo scripts/servers.sh
#
# Installing and starting need root: this script uses it when it runs as
# root or with passwordless sudo (`sudo -n true`). Otherwise a server that
# is already installed and running is used as it is, and one that is not
# stops the script with the one command to run instead (the line above).
#
# The caller sets `set -euo pipefail` and runs from the repository's root.

HOST=${HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
AMQP_PORT=${AMQP_PORT:-5672}
WAIT_SECONDS=${WAIT_SECONDS:-60}

log() { printf '==> %s\n' "$*"; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# SUDO runs a command as root: empty as root, sudo -n with passwordless
# sudo. ADMIN says whether either is the case.
SUDO=()
ADMIN=true
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		SUDO=(sudo -n)
	else
		ADMIN=false
	fi
fi

# as_admin WHAT COMMAND...: run COMMAND as root, or stop with the command
# that does the same for a user who may.
as_admin() {
	local what=$1
	shift
	if [ "$ADMIN" = true ]; then
		"${SUDO[@]}" "$@"
		return
	fi
	die "$what needs root, and this user is neither root nor allowed passwordless sudo.
Run this once, then run this again:

    sudo scripts/servers.sh
"
}

apt_updated=false
# apt_install PACKAGE...: install Debian packages (and apt-get update once).
apt_install() {
	command -v apt-get >/dev/null 2>&1 \
		|| die "apt-get is not available to install $*: install $* with this system's package manager, then run this again"
	[ "$ADMIN" = true ] || as_admin "installing $*" # stops with the command to run
	if [ "$apt_updated" = false ]; then
		log "apt-get update"
		as_admin "installing $*" env DEBIAN_FRONTEND=noninteractive apt-get update -q
		apt_updated=true
	fi
	log "apt-get install -y $*"
	as_admin "installing $*" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

# port_open HOST PORT: whether a TCP connection succeeds within 2 seconds.
port_open() {
	timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

# wait_for DESCRIPTION COMMAND...: retry COMMAND every second, up to WAIT_SECONDS.
wait_for() {
	local what=$1
	shift
	local i
	for ((i = 0; i < WAIT_SECONDS; i++)); do
		if "$@" >/dev/null 2>&1; then
			log "$what: ready"
			return 0
		fi
		sleep 1
	done
	return 1
}

pg_query_ok() {
	PGCONNECT_TIMEOUT=5 psql -w -h "$HOST" -p "$PG_PORT" -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1
}

ensure_postgres() {
	# Running and open to user postgres without a password: nothing to do,
	# and no root needed.
	if command -v psql >/dev/null 2>&1 && pg_query_ok; then
		log "PostgreSQL on $HOST:$PG_PORT: running; user postgres connects without a password"
		return
	fi
	if ! command -v pg_lsclusters >/dev/null 2>&1 || ! command -v psql >/dev/null 2>&1; then
		log "PostgreSQL is not installed"
		apt_install postgresql
	fi

	local version
	version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1 || true)
	[ -n "$version" ] || die "no PostgreSQL cluster under /etc/postgresql"

	if pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" && $4 ~ /^online/ { found = 1 } END { exit !found }'; then
		log "PostgreSQL $version/main: already online"
	else
		log "starting PostgreSQL $version/main: pg_ctlcluster --skip-systemctl-redirect $version main start"
		as_admin "starting PostgreSQL" pg_ctlcluster --skip-systemctl-redirect "$version" main start
	fi
	wait_for "PostgreSQL on $HOST:$PG_PORT" pg_isready -q -h "$HOST" -p "$PG_PORT" \
		|| die "PostgreSQL did not accept connections on $HOST:$PG_PORT within ${WAIT_SECONDS}s (see /var/log/postgresql/)"

	if pg_query_ok; then
		log "PostgreSQL: user postgres connects from $HOST without a password"
		return
	fi

	# The tests and devdb connect as postgres over TCP with no password:
	# allow trust auth for loopback only, ahead of the other rules
	# (pg_hba.conf is first-match).
	local hba="/etc/postgresql/$version/main/pg_hba.conf"
	log "PostgreSQL: enabling trust auth for loopback in $hba"
	as_admin "enabling trust auth for loopback in $hba" sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
	as_admin "reloading PostgreSQL" pg_ctlcluster --skip-systemctl-redirect "$version" main reload
	wait_for "PostgreSQL trust auth" pg_query_ok \
		|| die "psql -h $HOST -U postgres -c 'select 1' still fails; check $hba"
}

# PG_MIN_CONNECTIONS: the test suite runs two packages at once, each of
# whose tests may start an embedded FerretDB with a pool of its own; on a
# busy host their connections stay open longer, and PostgreSQL's default
# of 100 ran out ("too many clients already"). Raising the limit needs a
# restart, done once, when it is lower.
PG_MIN_CONNECTIONS=${PG_MIN_CONNECTIONS:-300}

ensure_pg_connections() {
	local have
	have=$(psql -w -h "$HOST" -p "$PG_PORT" -U postgres -d postgres -Atqc 'show max_connections') \
		|| die "cannot read PostgreSQL's max_connections"
	if [ "$have" -ge "$PG_MIN_CONNECTIONS" ]; then
		log "PostgreSQL: max_connections $have"
		return
	fi
	local version
	version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1 || true)
	[ -n "$version" ] || die "PostgreSQL's max_connections is $have, below $PG_MIN_CONNECTIONS, and no cluster under /etc/postgresql to restart"
	log "PostgreSQL: raising max_connections from $have to $PG_MIN_CONNECTIONS (a restart)"
	psql -w -h "$HOST" -p "$PG_PORT" -U postgres -d postgres -Atqc "alter system set max_connections = $PG_MIN_CONNECTIONS" >/dev/null \
		|| die "could not set PostgreSQL's max_connections"
	as_admin "restarting PostgreSQL" pg_ctlcluster --skip-systemctl-redirect "$version" main restart
	wait_for "PostgreSQL on $HOST:$PG_PORT" pg_query_ok \
		|| die "PostgreSQL did not come back within ${WAIT_SECONDS}s after its restart (see /var/log/postgresql/)"
}

ensure_rabbitmq() {
	# The AMQP 1.0 plugin: the CloudEvents interop tests read through it
	# as sdk-go's AMQP binding does (enable is idempotent).
	local amqp10=(as_admin "enabling RabbitMQ's AMQP 1.0 plugin" rabbitmq-plugins -q enable rabbitmq_amqp1_0)
	if port_open "$HOST" "$AMQP_PORT"; then
		log "RabbitMQ on $HOST:$AMQP_PORT: running"
		"${amqp10[@]}" >/dev/null
		return
	fi
	if ! command -v rabbitmq-server >/dev/null 2>&1; then
		log "RabbitMQ is not installed"
		apt_install rabbitmq-server
	fi

	# The package may have started it; otherwise start it.
	if timeout 30 "${SUDO[@]}" rabbitmqctl -q status >/dev/null 2>&1; then
		log "RabbitMQ: already running"
	else
		log "starting RabbitMQ: rabbitmq-server -detached"
		as_admin "starting RabbitMQ" rabbitmq-server -detached
	fi

	# Ready means the AMQP port answers; await_startup blocks (bounded) while
	# the node boots, so the loop does not spin.
	local deadline=$((SECONDS + WAIT_SECONDS))
	while ((SECONDS < deadline)); do
		if port_open "$HOST" "$AMQP_PORT"; then
			log "RabbitMQ on $HOST:$AMQP_PORT: ready"
			"${amqp10[@]}" >/dev/null
			return
		fi
		timeout 10 "${SUDO[@]}" rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1 || sleep 1
	done
	die "RabbitMQ did not accept connections on $HOST:$AMQP_PORT within ${WAIT_SECONDS}s (try: rabbitmqctl status)"
}

# ensure_tool COMMAND PACKAGE installs the Debian PACKAGE that carries
# COMMAND when COMMAND is missing, and says which version is there.
ensure_tool() {
	local cmd=$1 pkg=$2
	if command -v "$cmd" >/dev/null 2>&1; then
		log "$cmd: $("$cmd" --version 2>&1 | grep -m 1 -E "[0-9]+\.[0-9]+")"
		return
	fi
	log "$cmd is not installed"
	apt_install "$pkg"
	command -v "$cmd" >/dev/null 2>&1 || die "$cmd still missing after installing the $pkg package"
}

# promtool unit-tests deploy/prometheus/outbox-rules.yml; with CI=true the
# test fails rather than skips without it. Debian's prometheus package
# carries it (its service is not started: no systemd here, and CI needs
# none).
ensure_promtool() { ensure_tool promtool prometheus; }

# Chromium: the console's browser test drives it headless (chromedp); with
# CI=true it fails rather than skips without it. Nothing to start.
ensure_chromium() { ensure_tool chromium chromium; }

# jq: scripts/release-snapshot.sh reads GoReleaser's JSON with it, and
# scripts/'s tests run that script; they fail without it.
ensure_jq() { ensure_tool jq jq; }

# apidiff compares the public module's API with the last release's
# (scripts/api-check.sh, make api-check, .ci/run). Pinned: a newer one may
# judge a change differently. Installed with go install into GOBIN (or
# GOPATH/bin) unless that version is there.
APIDIFF_MODULE=golang.org/x/exp
APIDIFF_VERSION=v0.0.0-20261113113407-e3970619a1a4
APIDIFF=$(go env GOBIN 2>/dev/null || true)
APIDIFF=${APIDIFF:-$(go env GOPATH 2>/dev/null)/bin}/apidiff
ensure_apidiff() {
	if go version -m "$APIDIFF" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]]+$APIDIFF_MODULE[[:space:]]+$APIDIFF_VERSION([[:space:]]|$)"; then
		log "apidiff: $APIDIFF_MODULE $APIDIFF_VERSION"
		return
	fi
	log "go install $APIDIFF_MODULE/cmd/apidiff@$APIDIFF_VERSION"
	GOBIN=$(dirname "$APIDIFF") go install "$APIDIFF_MODULE/cmd/apidiff@$APIDIFF_VERSION"
}

# ensure_test: everything make test needs, the servers and the tools.
ensure_test() {
	ensure_postgres
	ensure_pg_connections
	ensure_rabbitmq
	ensure_promtool
	ensure_chromium
	ensure_jq
	ensure_apidiff
}

# Run alone (not sourced): everything, servers and tools.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -euo pipefail
	cd "$(dirname "$0")/.."
	exec </dev/null
	export DEBIAN_FRONTEND=noninteractive
	ensure_test
fi
