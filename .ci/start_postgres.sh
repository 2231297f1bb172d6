#!/usr/bin/env bash
# Start a throwaway PostgreSQL for the store tests and print its SQLAlchemy URL on stdout.
#
#   export INFERGOAL_TEST_PG_URL="$(.ci/start_postgres.sh [DIR])"
#   pytest tests/store
#   .ci/start_postgres.sh --stop [DIR]
#
# DIR (default $INFERGOAL_PG_DIR or /tmp/infergoal-pg) holds the cluster, its socket and log.
# Port: $INFERGOAL_PG_PORT (default 54329). Binaries: $PG_BIN, else the newest
# /usr/lib/postgresql/*/bin, else whatever is on PATH. PostgreSQL refuses to run as root, so as
# root the cluster belongs to a user `pgtest` (created if missing). Auth is `trust`: only for tests.
# Running it again on a live cluster just prints the URL. Everything but the URL goes to stderr.
set -euo pipefail

stop=0
if [[ "${1:-}" == "--stop" ]]; then stop=1; shift; fi
dir="${1:-${INFERGOAL_PG_DIR:-/tmp/infergoal-pg}}"
port="${INFERGOAL_PG_PORT:-54329}"
db="infergoal_test"

if [[ -z "${PG_BIN:-}" ]]; then
  PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  if [[ -z "$PG_BIN" ]]; then PG_BIN="$(dirname "$(command -v pg_ctl)")"; fi
fi
[[ -x "$PG_BIN/pg_ctl" ]] || { echo "no pg_ctl found (set PG_BIN)" >&2; exit 1; }

if [[ "$(id -u)" == 0 ]]; then
  user="pgtest"
  if ! id "$user" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /bin/sh "$user" >&2
  fi
  as_user() { su "$user" -s /bin/sh -c "$(printf '%q ' "$@")"; }
else
  user="$(id -un)"
  as_user() { "$@"; }
fi

mkdir -p "$dir"
if [[ "$(id -u)" == 0 ]]; then chown "$user" "$dir"; fi
data="$dir/data"

if [[ "$stop" == 1 ]]; then
  as_user "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >&2 || true
  exit 0
fi

if [[ ! -f "$data/PG_VERSION" ]]; then
  as_user "$PG_BIN/initdb" -D "$data" -U "$user" -A trust -E UTF8 --no-sync >&2
fi
if ! as_user "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
  # fsync off: a test cluster trades durability for speed.
  as_user "$PG_BIN/pg_ctl" -D "$data" -l "$dir/postgres.log" -w -t 60 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off" start >&2
fi
if ! as_user "$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U "$user" -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
  as_user "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U "$user" "$db" >&2
fi
echo "stop with: $0 --stop $dir" >&2
echo "postgresql+psycopg://$user@127.0.0.1:$port/$db"
