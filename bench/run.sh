#!/usr/bin/env bash
# `make bench`: requests per second through the gateway (wrk) next to the
# raw server (pgbench) in the same run, at the same concurrency (wrk -t1
# -c32, pgbench -c32 -j1), as ratios. Absolute numbers vary on shared
# machines; the ratios are the figures.
#   BENCH_SECONDS   seconds per run (default 10)
#   BENCH_CONNS     client connections (default 32)
#   BENCH_POOL      sqldb_keepalive max per worker (default 2; pipelining on)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
secs=${BENCH_SECONDS:-10}
conns=${BENCH_CONNS:-32}
pool=${BENCH_POOL:-2}
dir=/tmp/ngx-gateway-bench
pgport=55433
redisport=56379
port=8081
nginx=${NGINX:-/usr/sbin/nginx}
module=${MODULE:-$repo/objs/ngx_http_gateway_module.so}
export PGPASSWORD='demo pass'

stop_nginx() {
    if [ -f "$dir/nginx/logs/nginx.pid" ]; then
        kill -QUIT "$(cat "$dir/nginx/logs/nginx.pid")" 2>/dev/null || true
        for _ in $(seq 50); do [ -f "$dir/nginx/logs/nginx.pid" ] || break; sleep 0.1; done
    fi
}
cleanup() {
    stop_nginx
    redis-cli -p $redisport shutdown nosave >/dev/null 2>&1 || true
    "$repo/nginx-conf/pg-sandbox.sh" stop "$dir/pg" || true
}
trap cleanup EXIT

"$repo/nginx-conf/pg-sandbox.sh" start "$dir/pg" $pgport "$here/schema.sql"
redis-server --port $redisport --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile "$dir/redis.log"
sleep 0.3
# redis-benchmark's GET reads the key its SET writes: a 100-byte value.
redis-benchmark -p $redisport -t set -n 1000 -d 100 -q >/dev/null
mkdir -p "$dir/scripts"
echo "select 'default' as echo;" >"$dir/scripts/a.sql"
printf '\\set id random(1, 10000)\nselect id, label from items where id = :id;\n' >"$dir/scripts/b.sql"
echo "select id, label, price from items where id <= 100;" >"$dir/scripts/c.sql"
cat >"$dir/scripts/b.lua" <<'LUA'
math.randomseed(os.time())
request = function()
    return wrk.format("GET", "/b?id=" .. math.random(1, 10000))
end
LUA

start_nginx() {
    local workers=$1
    stop_nginx
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
    upstream bench_redis { server 127.0.0.1:$redisport; keepalive $conns; }
    upstream bench_db {
        sqldb_server 127.0.0.1:$pgport dbname=demo user=demo "password=demo pass" sslmode=disable;
        sqldb_keepalive max=$pool;
        sqldb_pipeline on;
    }
    server {
        listen 127.0.0.1:$port;
        location = /a { sqldb_pass bench_db; sqldb_query "select 'default' as echo"; }
        location = /b { sqldb_pass bench_db; sqldb_query "select id, label from items where id = \$arg_id::int"; }
        location = /c { sqldb_pass bench_db; sqldb_query "select id, label, price from items where id <= 100"; }
        location = /r { set \$cache_key "key:__rand_int__"; cache_pass bench_redis; }
    }
}
CONF
    "$nginx" -p "$dir/nginx/" -c "$dir/nginx/nginx.conf"
    sleep 0.3
}

# wrk: prints "rps p99_ms"; also samples the server connections the gateway holds.
wrk_run() {
    local path=$1 script=${2:-}
    local args=(-t1 -c"$conns" -d"${secs}s" --latency)
    [ -n "$script" ] && args+=(-s "$script")
    (sleep $((secs / 2)); psql -X -A -t -h 127.0.0.1 -p $pgport -U demo demo \
        -c "select count(*) - 1 from pg_stat_activity where datname = 'demo'" >"$dir/conns" 2>/dev/null) &
    wrk "${args[@]}" "http://127.0.0.1:$port$path" | awk '
        /Requests\/sec/ { rps = $2 }
        /^ +99%/ { v = $2; if (v ~ /us$/) { sub(/us/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms/, "", v) } else if (v ~ /s$/) { sub(/s/, "", v); v *= 1000 } p99 = v }
        /Non-2xx/ { bad = $NF }
        END { printf "%.0f %.2f %d\n", rps, p99, bad }'
    wait
}

pgbench_run() { # mode script: prints "tps p99_ms"
    pgbench -n -c"$conns" -j1 -T"$secs" -M "$1" -r -l --log-prefix="$dir/pgb" -h 127.0.0.1 -p $pgport -U demo \
        -f "$2" demo 2>/dev/null | awk '/^tps/ { printf "%.0f", $3 }'
    # p99 from the per-transaction log (latency in microseconds, column 3)
    cat "$dir"/pgb.* | awk '{ print $3 }' | sort -n | awk '{ a[NR] = $1 } END { printf " %.2f\n", a[int(NR * 0.99)] / 1000 }'
    rm -f "$dir"/pgb.*
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }'; }

echo "ngx_gateway benchmark: $conns client connections, ${secs}s per run, $(nproc) cores, $("$nginx" -v 2>&1 | sed 's/.*: //'), pool $pool per worker, pipelining on"
echo
printf "%-34s %12s %12s %16s %16s\n" "" "pgbench" "pgbench" "gateway" "gateway"
printf "%-34s %12s %12s %16s %16s\n" "" "simple" "prepared" "1 worker" "2 workers"

declare -A g1 g2
for w in 1 2; do
    start_nginx $w
    wrk -t1 -c"$conns" -d1s "http://127.0.0.1:$port/a" >/dev/null 2>&1 || true
    for s in a b c r; do
        if [ $s = b ]; then r=$(wrk_run /b "$dir/scripts/b.lua"); else r=$(wrk_run /$s); fi
        read -r rps p99 bad <<<"$r"
        if [ "$w" = 1 ]; then g1[$s]="$rps $p99 $bad $(cat "$dir/conns")"; else g2[$s]="$rps $p99 $bad $(cat "$dir/conns")"; fi
    done
done
stop_nginx

declare -A names=([a]="(a) select 'default' as echo" [b]="(b) primary key lookup, id from URL" [c]="(c) 100 rows x 3 columns")
for s in a b c; do
    read -r ps pps <<<"$(pgbench_run simple "$dir/scripts/$s.sql")"
    read -r pp ppp <<<"$(pgbench_run prepared "$dir/scripts/$s.sql")"
    read -r r1 p1 b1 c1 <<<"${g1[$s]}"
    read -r r2 p2 b2 c2 <<<"${g2[$s]}"
    printf "%-34s %12s %12s %16s %16s\n" "${names[$s]}" "$ps/s" "$pp/s" "$r1/s" "$r2/s"
    printf "%-34s %12s %12s %16s %16s\n" "   p99 latency (ms)" "$pps" "$ppp" "$p1" "$p2"
    printf "%-34s %12s %12s %16s %16s\n" "   server connections" "$conns" "$conns" "$c1" "$c2"
    printf "%-34s %12s %12s %16s %16s\n" "   non-2xx responses" "" "" "$b1" "$b2"
    printf "%-34s %12s %12s %16s %16s\n" "   gateway / pgbench prepared" "" "" "$(ratio "$r1" "$pp")" "$(ratio "$r2" "$pp")"
    printf "%-34s %12s %12s %16s %16s\n" "   gateway / pgbench simple" "" "" "$(ratio "$r1" "$ps")" "$(ratio "$r2" "$ps")"
done

read -r rb < <(redis-benchmark -p $redisport -t get -c "$conns" -n $((secs * 60000)) -d 100 --csv | awk -F'"' '/GET/ { printf "%.0f\n", $4 }')
read -r r1 p1 b1 c1 <<<"${g1[r]}"
read -r r2 p2 b2 c2 <<<"${g2[r]}"
echo
printf "%-34s %12s %12s %16s %16s\n" "" "redis-" "" "gateway" "gateway"
printf "%-34s %12s %12s %16s %16s\n" "" "benchmark" "" "1 worker" "2 workers"
printf "%-34s %12s %12s %16s %16s\n" "(d) cache GET, 100-byte value" "$rb/s" "" "$r1/s" "$r2/s"
printf "%-34s %12s %12s %16s %16s\n" "   p99 latency (ms)" "" "" "$p1" "$p2"
printf "%-34s %12s %12s %16s %16s\n" "   non-2xx responses" "" "" "$b1" "$b2"
printf "%-34s %12s %12s %16s %16s\n" "   gateway / redis-benchmark" "" "" "$(ratio "$r1" "$rb")" "$(ratio "$r2" "$rb")"
