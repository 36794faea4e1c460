#!/usr/bin/env bash
# `make bench`: requests per second through the gateway (wrk) next to the
# raw server (pgbench) in the same run, at the same concurrency, as ratios.
# Absolute numbers vary on shared machines; the ratios are the figures.
#   BENCH_SECONDS (default 10), BENCH_CONNS (default 32)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
secs=${BENCH_SECONDS:-10}
conns=${BENCH_CONNS:-32}
dir=/tmp/ngx-gateway-bench
pgport=55433
port=8081
nginx=${NGINX:-/usr/sbin/nginx}
module=${MODULE:-$repo/objs/ngx_http_gateway_module.so}

cleanup() {
    [ -f "$dir/nginx/logs/nginx.pid" ] && kill "$(cat "$dir/nginx/logs/nginx.pid")" 2>/dev/null || true
    "$repo/nginx-conf/pg-sandbox.sh" stop "$dir/pg" || true
}
trap cleanup EXIT

"$repo/nginx-conf/pg-sandbox.sh" start "$dir/pg" $pgport
export PGPASSWORD='demo pass'
pgbench -q -i -s 1 -h 127.0.0.1 -p $pgport -U demo demo >/dev/null 2>&1
echo "select 'default' as echo;" >"$dir/echo.sql"

start_nginx() {
    local workers=$1
    [ -f "$dir/nginx/logs/nginx.pid" ] && kill "$(cat "$dir/nginx/logs/nginx.pid")" 2>/dev/null && sleep 0.5
    rm -rf "$dir/nginx" && mkdir -p "$dir/nginx/logs" "$dir/nginx/tmp"
    cat >"$dir/nginx/nginx.conf" <<CONF
load_module $module;
worker_processes $workers;
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path tmp/body;
    upstream bench_db {
        sqldb_server 127.0.0.1:$pgport dbname=demo user=demo "password=demo pass" sslmode=disable;
        sqldb_keepalive max=$((conns / workers));
    }
    server {
        listen 127.0.0.1:$port;
        location = /echo { sqldb_pass bench_db; sqldb_query "select 'default' as echo"; }
    }
}
CONF
    "$nginx" -p "$dir/nginx/" -c "$dir/nginx/nginx.conf"
    sleep 0.3
}

wrk_rps() { # prints "rps p99_ms"
    wrk -t1 -c"$conns" -d"${secs}s" --latency "http://127.0.0.1:$port$1" | awk '
        /Requests\/sec/ { rps = $2 }
        /^ +99%/ { v = $2; if (v ~ /us$/) { sub(/us/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms/, "", v) } else if (v ~ /s$/) { sub(/s/, "", v); v *= 1000 } p99 = v }
        / Non-2xx/ { bad = $NF }
        END { printf "%.0f %.2f %s\n", rps, p99, bad ? bad : 0 }'
}

pgb_tps() { # args: extra pgbench options; prints tps
    pgbench -n -c"$conns" -j1 -T"$secs" -h 127.0.0.1 -p $pgport -U demo "$@" demo 2>/dev/null |
        awk '/^tps/ { printf "%.0f\n", $3; exit }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }'; }

echo "ngx_gateway benchmark: $conns connections, ${secs}s per run, $(nproc) cores, $("$nginx" -v 2>&1)"
pg_simple=$(pgb_tps -M simple -f "$dir/echo.sql")
pg_prep=$(pgb_tps -M prepared -f "$dir/echo.sql")
pg_connect=$(pgb_tps -M simple -C -f "$dir/echo.sql")
pg_s=$(pgb_tps -S)
printf "%-48s %10s\n" "pgbench -S (select-only built-in)" "$pg_s tps"
printf "%-48s %10s\n" "pgbench select 'default' as echo, simple" "$pg_simple tps"
printf "%-48s %10s\n" "pgbench select 'default' as echo, prepared" "$pg_prep tps"
printf "%-48s %10s\n" "pgbench ... simple, new connection each (-C)" "$pg_connect tps"
for w in 1 2; do
    start_nginx $w
    wrk -t1 -c4 -d1s "http://127.0.0.1:$port/echo" >/dev/null 2>&1 || true
    read -r rps p99 bad < <(wrk_rps /echo)
    printf "%-48s %10s  p99 %s ms  non-2xx %s\n" "gateway /echo, $w worker(s)" "$rps rps" "$p99" "$bad"
    printf "    ratio vs pgbench -S %s, vs simple %s, vs prepared %s, vs -C %s\n" \
        "$(ratio "$rps" "$pg_s")" "$(ratio "$rps" "$pg_simple")" "$(ratio "$rps" "$pg_prep")" "$(ratio "$rps" "$pg_connect")"
done
