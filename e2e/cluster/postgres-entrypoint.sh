#!/bin/sh
# Entrypoint of docker.io/nextmini/postgres:dev (busybox sh), with the basics of
# the official postgres image's: POSTGRES_PASSWORD, POSTGRES_USER (default
# postgres), POSTGRES_DB (default the user), PGDATA (default
# /var/lib/postgresql/data), POSTGRES_HOST_AUTH_METHOD (default scram-sha-256),
# POSTGRES_INITDB_ARGS and /docker-entrypoint-initdb.d/*.sql|*.sh on first start.
# Runs as whatever non-root uid the pod gives it (the image's is 999).
set -eu

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
: "${POSTGRES_INITDB_ARGS:=}"
export PGDATA

msg() { echo "entrypoint: $*" >&2; }

# `docker run IMAGE -c foo=bar` style: options go to postgres.
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
  set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
  exec "$@"
fi
shift

if [ "$(id -u)" = 0 ]; then
  msg "refusing to run as root: set runAsUser (e.g. 999)"
  exit 1
fi

# A volume mounted at PGDATA belongs to root (group fsGroup) and cannot be made
# 0700 by us: keep the cluster in a subdirectory of it then.
mkdir -p "$PGDATA" 2>/dev/null || true
if [ ! -s "$PGDATA/PG_VERSION" ] && [ "$(stat -c %u "$PGDATA")" != "$(id -u)" ]; then
  PGDATA=$PGDATA/pgdata
  export PGDATA
  msg "PGDATA's directory is not ours; using $PGDATA"
  mkdir -p "$PGDATA"
fi
chmod 0700 "$PGDATA" 2>/dev/null || true

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
    msg "database is uninitialized and POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)"
    exit 1
  fi
  msg "initializing $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
  # shellcheck disable=SC2086
  initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
    --auth-host="$POSTGRES_HOST_AUTH_METHOD" --locale=C --encoding=UTF8 $POSTGRES_INITDB_ARGS >&2
  rm -f "$pwfile"
  {
    echo
    echo "# added by the nextmini entrypoint"
    echo "host all all all $POSTGRES_HOST_AUTH_METHOD"
  } >>"$PGDATA/pg_hba.conf"
  {
    echo
    echo "listen_addresses = '*'"
  } >>"$PGDATA/postgresql.conf"

  if [ "$POSTGRES_DB" != postgres ] || [ -n "$(ls /docker-entrypoint-initdb.d 2>/dev/null)" ]; then
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/tmp" -w start >&2
    psql_() { psql -v ON_ERROR_STOP=1 -h /tmp --username "$POSTGRES_USER" --no-password "$@"; }
    if [ "$POSTGRES_DB" != postgres ]; then
      echo "CREATE DATABASE \"$POSTGRES_DB\";" | psql_ --dbname postgres >&2
    fi
    for f in /docker-entrypoint-initdb.d/*; do
      case $f in
        *.sql) msg "running $f"; psql_ --dbname "$POSTGRES_DB" -f "$f" >&2 ;;
        *.sh) msg "running $f"; . "$f" ;;
        *) ;;
      esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >&2
  fi
  msg "initialization done"
fi

exec postgres "$@"
