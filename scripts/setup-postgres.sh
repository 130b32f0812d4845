#!/usr/bin/env bash
# Starts the PostgreSQL the store and API tests run against, idempotently (Debian 12, as root):
# installs the `postgresql` package when it is missing, keeps its own cluster in
# $RIVET_PG_DIR (default /var/lib/rivet-pg-test) listening on 127.0.0.1 only, port
# $RIVET_PG_PORT (default 55432), and makes a role `rivet` (password `rivet`, CREATEDB: every
# test makes and drops its own database) and a database `rivet`.
# The distribution's own cluster (5432) is left alone. The last line printed is the URL:
#   postgres://rivet:rivet@127.0.0.1:55432/rivet
# Safe to run again: it only does what is missing, and restarts a cluster that is down.
set -euo pipefail

DIR=${RIVET_PG_DIR:-/var/lib/rivet-pg-test}
PORT=${RIVET_PG_PORT:-55432}
DATA="$DIR/data"

if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  echo "setup-postgres: installing postgresql" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_pg() { runuser -u postgres -- "$@"; }

if [ ! -f "$DATA/PG_VERSION" ]; then
  echo "setup-postgres: creating a test cluster in $DATA" >&2
  mkdir -p "$DATA"
  chown -R postgres:postgres "$DIR"
  chmod 700 "$DIR" "$DATA"
  # Peer auth on the socket (for this script), passwords over TCP (for the tests). Text
  # collates as en-US (ICU), as most production databases do, so the tests prove the store
  # orders names byte-wise like SQLite whatever the database's collation.
  as_pg "$BIN/initdb" -D "$DATA" -E UTF8 --locale=C.UTF-8 \
    --locale-provider=icu --icu-locale=en-US \
    --auth-local=peer --auth-host=scram-sha-256 >/dev/null
  # A throw-away test cluster: durability off for speed, room for parallel tests' pools.
  cat >>"$DATA/postgresql.conf" <<EOF

# rivet test cluster (scripts/setup-postgres.sh)
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
fi

if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  echo "setup-postgres: starting the test cluster on 127.0.0.1:$PORT" >&2
  as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DIR/postgresql.log" -w -t 60 start >/dev/null
fi

psql_pg() { as_pg "$BIN/psql" -h "$DIR" -p "$PORT" -d postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
if [ "$(psql_pg -c "SELECT 1 FROM pg_roles WHERE rolname = 'rivet'")" != 1 ]; then
  psql_pg -c "CREATE ROLE rivet LOGIN CREATEDB PASSWORD 'rivet'"
fi
if [ "$(psql_pg -c "SELECT 1 FROM pg_database WHERE datname = 'rivet'")" != 1 ]; then
  psql_pg -c "CREATE DATABASE rivet OWNER rivet"
fi
echo "setup-postgres: ok" >&2
echo "postgres://rivet:rivet@127.0.0.1:$PORT/rivet"
