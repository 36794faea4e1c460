#!/usr/bin/env bash
# A throwaway PostgreSQL for the demo and the benchmark.
#   pg-sandbox.sh start DIR PORT [SQL_FILE]   initdb in DIR, listen on 127.0.0.1:PORT,
#                                             role "demo" (password "demo pass"), database "demo"
#   pg-sandbox.sh stop DIR                    stop it and remove DIR
set -euo pipefail
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)}
cmd=$1 dir=$2

as_owner() {
    if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi
}

case $cmd in
start)
    port=$3 sql=${4:-}
    rm -rf "$dir" && mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    # The superuser's password: for its owner only (initdb reads it).
    (umask 077 && echo "super-$RANDOM$RANDOM" >"$dir/superpw")
    [ "$(id -u)" = 0 ] && chown postgres "$dir/superpw"
    as_owner "'$PG_BIN/initdb' -D '$dir/data' -U postgres -A scram-sha-256 --pwfile='$dir/superpw' --no-sync -E UTF8 --locale=C >'$dir/initdb.log' 2>&1"
    cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 300
fsync = off
synchronous_commit = off
CONF
    if ! as_owner "'$PG_BIN/pg_ctl' -D '$dir/data' -l '$dir/server.log' -w -s start"; then
        echo "pg-sandbox.sh: PostgreSQL did not start on 127.0.0.1:$port; the end of its log, $dir/server.log:" >&2
        tail -n 5 "$dir/server.log" >&2 || true
        exit 1
    fi
    export PGPASSWORD=$(cat "$dir/superpw")
    psql -X -q -h 127.0.0.1 -p "$port" -U postgres -c "create role demo login password 'demo pass'" -c "create database demo owner demo"
    if [ -n "$sql" ]; then
        PGPASSWORD='demo pass' psql -X -q -h 127.0.0.1 -p "$port" -U demo -d demo -v ON_ERROR_STOP=1 -f "$sql"
    fi
    ;;
stop)
    if [ -d "$dir/data" ]; then
        as_owner "'$PG_BIN/pg_ctl' -D '$dir/data' -m fast -w -s stop" >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start DIR PORT [SQL] | stop DIR" >&2
    exit 2
    ;;
esac
