#!/usr/bin/env bash
# Instructions per request of one nginx worker under callgrind, for the
# scenarios of `make bench` and nginx's own `return 200` of the same bytes:
# stable figures whatever else the machine runs (bench/run.sh's rates and
# CPU times are not).
#   bash bench/callgrind.sh [PATH...]    default: /ret /a /b?id=5000 /c /r /bj?id=5000
# (/ret: nginx's `return 200` of the cache GET's 100 bytes.) For each
# path: nginx (master_process off, daemon off) under valgrind
# --tool=callgrind, a warm-up, then the counters zeroed, wrk -t1 -cCG_CONNS
# for CG_SECONDS (default 4), the counters dumped; prints the instructions
# per request served (user space, every thread) and leaves the dump in
# CG_DIR/PATH.out.req for callgrind_annotate.
#   CG_CONNS one by default: one request at a time, so that no figure
#            depends on how many requests an event-loop turn happens to serve
#   CG_DIR   where it runs (default /tmp/ngx-gateway-callgrind)
#   MODULE   the module to load (default objs/ngx_http_gateway_module.so)
#   CG_PG_PORT, CG_REDIS_PORT, CG_PORT  (default 55443, 56389, 8091)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
dir=${CG_DIR:-/tmp/ngx-gateway-callgrind}
pgport=${CG_PG_PORT:-55443}
redisport=${CG_REDIS_PORT:-56389}
port=${CG_PORT:-8091}
secs=${CG_SECONDS:-4}
nginx=${NGINX:-/usr/sbin/nginx}
module=${MODULE:-$repo/objs/ngx_http_gateway_module.so}
export PGPASSWORD='demo pass'
vg_pid=""

cleanup() {
    [ -n "$vg_pid" ] && kill "$vg_pid" 2>/dev/null && wait "$vg_pid" 2>/dev/null
    redis-cli -p $redisport shutdown nosave >/dev/null 2>&1 || true
    "$repo/nginx-conf/pg-sandbox.sh" stop "$dir/pg" || true
}
trap cleanup EXIT
mkdir -p "$dir"
"$repo/nginx-conf/pg-sandbox.sh" start "$dir/pg" $pgport "$here/schema.sql" >/dev/null
PGPASSWORD=$(cat "$dir/pg/superpw") psql -X -q -h 127.0.0.1 -p $pgport -U postgres -d demo \
    -c "create role bench_web nologin" -c "grant bench_web to demo" -c "grant select on items to bench_web"
# Connections are made without a password exchange: SCRAM's key
# derivation under valgrind takes seconds, which the measured requests
# never pay (the pool keeps its connections).
sed -i 's/scram-sha-256$/trust/' "$dir/pg/data/pg_hba.conf"
PGPASSWORD=$(cat "$dir/pg/superpw") psql -X -q -h 127.0.0.1 -p $pgport -U postgres -d demo -c "select pg_reload_conf()" >/dev/null
redis-server --port $redisport --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile "$dir/redis.log"
sleep 0.3
value=$(printf 'v%.0s' $(seq 100))
redis-cli -p $redisport set key:__rand_int__ "$value" >/dev/null
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
head -c 48 /dev/urandom | b64url >"$dir/jwt.secret"
msg="$(printf '{"alg":"HS256","typ":"JWT"}' | b64url).$(printf '{"sub":"bench","role":"bench_web","exp":%d}' $(($(date +%s) + 86400)) | b64url)"
token="$msg.$(printf '%s' "$msg" | openssl dgst -sha256 -hmac "$(cat "$dir/jwt.secret")" -binary | b64url)"
cat >"$dir/bj.lua" <<LUA
wrk.headers["Authorization"] = "Bearer $token"
LUA

rm -rf "$dir/nginx" && mkdir -p "$dir/nginx/logs" "$dir/nginx/tmp"
cat >"$dir/nginx/nginx.conf" <<CONF
load_module $module;
master_process off;
daemon off;
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path tmp/body;
    upstream bench_redis { server 127.0.0.1:$redisport; keepalive 32; }
    upstream bench_db {
        sqldb_server 127.0.0.1:$pgport dbname=demo user=demo "password=demo pass" sslmode=disable;
    }
    server {
        listen 127.0.0.1:$port;
        location = /a { sqldb_pass bench_db; sqldb_query "select 'default' as echo"; }
        location = /b { sqldb_pass bench_db; sqldb_query "select id, label from items where id = \$arg_id::int"; }
        location = /bj {
            sqldb_pass bench_db;
            sqldb_jwt_key $dir/jwt.secret;
            sqldb_query "select id, label from items where id = \$arg_id::int";
        }
        location = /c { sqldb_pass bench_db; sqldb_query "select id, label, price from items where id <= 100"; }
        location = /r { set \$cache_key "key:__rand_int__"; cache_pass bench_redis; }
        location = /ret { return 200 "$value"; }
    }
}
CONF

paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(/ret /a "/b?id=5000" /c /r "/bj?id=5000")
for path in "${paths[@]}"; do
    name=$(printf '%s' "${path#/}" | tr -c 'a-z0-9' _)
    script=()
    case $path in /bj*) script=(-s "$dir/bj.lua") ;; esac
    valgrind --tool=callgrind --callgrind-out-file="$dir/$name.out" \
        "$nginx" -p "$dir/nginx/" -c "$dir/nginx/nginx.conf" 2>"$dir/valgrind.log" &
    vg_pid=$!
    for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/ret" && break; sleep 0.2; done
    # Warm-up: until the database pool has all its connections (they are
    # made on threads, slowly under valgrind) and two runs agree.
    prev=0
    for _ in $(seq 8); do
        cur=$(wrk -t1 -c${CG_CONNS:-1} -d2s "${script[@]}" "http://127.0.0.1:$port$path" | awk '/ requests in / { print $1 }')
        [ "$prev" -gt 0 ] && [ $((cur * 10)) -le $((prev * 11)) ] && [ $((cur * 11)) -ge $((prev * 10)) ] && break
        prev=$cur
    done
    callgrind_control -z $vg_pid >/dev/null
    wrk -t1 -c${CG_CONNS:-1} -d"${secs}s" "${script[@]}" "http://127.0.0.1:$port$path" >"$dir/wrk.out"
    callgrind_control -d $vg_pid >/dev/null
    n=$(awk '/ requests in / { print $1 }' "$dir/wrk.out")
    bad=$(awk '/Non-2xx/ { print $NF }' "$dir/wrk.out")
    kill $vg_pid && wait $vg_pid 2>/dev/null || true
    vg_pid=""
    # The dump of the measured window is the one callgrind_control -d wrote.
    dump=$(ls -t "$dir/$name.out".[0-9]* 2>/dev/null | tail -n 1)
    [ -n "$dump" ] && mv "$dump" "$dir/$name.out.req" && rm -f "$dir/$name.out".[0-9]*
    ir=$(awk '/^summary:/ { print $2 }' "$dir/$name.out.req")
    printf '%-14s %8s requests %12s Ir %9.0f Ir/request%s\n' "$path" "$n" "$ir" \
        "$(awk -v a="$ir" -v b="$n" 'BEGIN { print a / b }')" "${bad:+  non-2xx $bad}"
done
