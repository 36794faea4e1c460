#!/usr/bin/env bash
# `make bench`: first, what the worker spends per request: its CPU time
# (user + kernel, /proc/PID/task/TID/schedstat) per request served for the
# echo, the pk lookup, 100 rows x 3, the cache GET of 100 bytes and the pk
# lookup with a bearer token, beside nginx's own `return 200` of the same
# bytes (for the token: the lookup without one), three interleaved rounds
# of half a run each: medians and the median of the rounds' ratios (the
# figure that does not depend on what PostgreSQL, Redis and wrk take from
# the same cores). Then requests per second and p99 latency through the
# gateway (wrk) next to the raw servers in the same run, as ratios:
#   - SQL: pgbench -M prepared and -M simple, at the same concurrency, for
#     three pool settings: none written (the defaults), max=32 and max=2;
#   - cache GET: redis-benchmark, nginx's own `return 200` of the same bytes
#     (the HTTP ceiling of the machine) and Debian's memc module with
#     memcached;
#   - each SQL scenario and the cache GET beside nginx's own `return 200`
#     of a body of the same length (the HTTP ceiling of the machine), in
#     interleaved rounds, with the worker's CPU time per request of each
#     (user + kernel time from schedstat over the run / requests served);
#   - eight queries stuck for a second (pg_sleep) while fast requests run;
#   - the worker's RSS after warm-up and after each run of the default
#     pool's nginx, with the number of requests it had served by then, and
#     over a million and more requests once every kind has been served;
#   - the primary-key lookup with a bearer token (sqldb_jwt_key, HS256 and
#     RS256: the query runs as the token's role) next to the same lookup
#     without one, same nginx, same run; and what PostgreSQL alone pays
#     for the same statements (pgbench, the preamble and the lookup
#     pipelined in one transaction).
# Absolute numbers vary on shared machines; the ratios are the figures.
# Writes the table to target/bench/results.txt, the raw figures to
# results.tsv and a chart to chart.svg beside them.
#   BENCH_SECONDS   seconds per run (default 10)
#   BENCH_CONNS     client connections (default 32)
#   BENCH_WORKERS   nginx worker processes (default 1)
#   BENCH_DIR, BENCH_PG_PORT, BENCH_REDIS_PORT, BENCH_MEMC_PORT, BENCH_PORT
#                   where it runs (default /tmp/ngx-gateway-bench, 55433,
#                   56379, 51211, 8081)
#   BENCH_ONLY=jwt  only the pk lookups with and without a token (each twice,
#                   interleaved), the pgbench pair, and their ratios
#   BENCH_ONLY=hol  only the head-of-line check, three times on one nginx
#   BENCH_ONLY=release  only the first table (rounds of BENCH_SECONDS), with
#                   the worker's system calls per request beside (strace -c
#                   -f on the worker, a run of its own for each); the
#                   figures that differ between Debian releases (libpq 15
#                   or 17): make bench DIST=trixie BENCH_ONLY=release
# bench/callgrind.sh counts the worker's instructions per request of the
# same scenarios (stable whatever else runs on the machine).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
secs=${BENCH_SECONDS:-10}
conns=${BENCH_CONNS:-32}
workers=${BENCH_WORKERS:-1}
dir=${BENCH_DIR:-/tmp/ngx-gateway-bench}
out=$repo/target/bench
pgport=${BENCH_PG_PORT:-55433}
redisport=${BENCH_REDIS_PORT:-56379}
memcport=${BENCH_MEMC_PORT:-51211}
port=${BENCH_PORT:-8081}
nginx=${NGINX:-/usr/sbin/nginx}
module=${MODULE:-$repo/objs/ngx_http_gateway_module.so}
memc=/usr/lib/nginx/modules/ngx_http_memc_module.so
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
    if [ -f "$dir/memcached.pid" ]; then
        kill "$(cat "$dir/memcached.pid")" 2>/dev/null || true
        wait "$(cat "$dir/memcached.pid")" 2>/dev/null || true
    fi
    "$repo/nginx-conf/pg-sandbox.sh" stop "$dir/pg" || true
}
trap cleanup EXIT

mkdir -p "$dir" "$out"
"$repo/nginx-conf/pg-sandbox.sh" start "$dir/pg" $pgport "$here/schema.sql"
redis-server --port $redisport --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile "$dir/redis.log"
# (Not -d -P: memcached writes its pid file after dropping to nobody, which
# cannot write in $dir, so the cleanup would not find it.)
if command -v memcached >/dev/null; then
    memcached -l 127.0.0.1 -p $memcport -U 0 -u nobody >/dev/null 2>&1 &
    echo $! >"$dir/memcached.pid"
fi
# The role that requests with a token run as (the tokens' "role" claim).
PGPASSWORD=$(cat "$dir/pg/superpw") psql -X -q -h 127.0.0.1 -p $pgport -U postgres -d demo \
    -c "create role bench_web nologin" -c "grant bench_web to demo" -c "grant select on items to bench_web"
# Keys and tokens (valid for a day): an HMAC secret and an RSA key.
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
head -c 48 /dev/urandom | b64url >"$dir/jwt.secret"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$dir/jwt.rsa" -quiet
openssl pkey -in "$dir/jwt.rsa" -pubout -out "$dir/jwt.rsa.pub"
claims_json=$(printf '{"sub":"bench","role":"bench_web","exp":%d}' $(($(date +%s) + 86400)))
claims=$(printf '%s' "$claims_json" | b64url)
msg="$(printf '{"alg":"HS256","typ":"JWT"}' | b64url).$claims"
token_hs="$msg.$(printf '%s' "$msg" | openssl dgst -sha256 -hmac "$(cat "$dir/jwt.secret")" -binary | b64url)"
msg="$(printf '{"alg":"RS256","typ":"JWT"}' | b64url).$claims"
token_rs="$msg.$(printf '%s' "$msg" | openssl dgst -sha256 -sign "$dir/jwt.rsa" -binary | b64url)"
sleep 0.3
value=$(printf 'v%.0s' $(seq 100))
# redis-benchmark's GET reads the key its SET writes ("key:__rand_int__"):
# the gateway, memc and `return 200` serve the same 100 bytes.
redis-cli -p $redisport set key:__rand_int__ "$value" >/dev/null
printf 'set key:__rand_int__ 0 0 100\r\n%s\r\n' "$value" | python3 -c "
import socket, sys
s = socket.create_connection(('127.0.0.1', $memcport)); s.sendall(sys.stdin.buffer.read()); s.recv(100)"
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
# What PostgreSQL itself pays for a token: the statements the gateway sends
# for /bj (the preamble, then the lookup, in one sync segment: pipelined),
# run by pgbench.
cat >"$dir/scripts/bj.sql" <<SQL
\\set id random(1, 10000)
\\startpipeline
select set_config('role', 'bench_web', true), set_config('request.jwt.claims', '$claims_json', true), set_config('transaction_read_only', 'on', true);
select id, label from items where id = :id;
\\endpipeline
SQL
# The same lookups with a token: /bj (HS256), /bjr (RS256).
for t in bj:$token_hs bjr:$token_rs; do
    cat >"$dir/scripts/${t%%:*}.lua" <<LUA
math.randomseed(os.time())
local headers = { ["Authorization"] = "Bearer ${t#*:}" }
request = function()
    return wrk.format("GET", "/${t%%:*}?id=" .. math.random(1, 10000), headers)
end
LUA
done

# The bodies of the SQL scenarios' lengths (known once nginx has served
# them: see below); `return 200` serves one of each length.
declare -A lens=([a]=1 [b]=1 [c]=1)
filler() { printf 'x%.0s' $(seq "$1"); }

# start_nginx KEEPALIVE_LINE
start_nginx() {
    stop_nginx
    rm -rf "$dir/nginx" && mkdir -p "$dir/nginx/logs" "$dir/nginx/tmp"
    local memc_load="" memc_loc=""
    if [ -f "$memc" ]; then
        memc_load="load_module $memc;"
        memc_loc="location = /m { set \$memc_cmd get; set \$memc_key key:__rand_int__; memc_pass bench_memc; }"
    fi
    cat >"$dir/nginx/nginx.conf" <<CONF
load_module $module;
$memc_load
worker_processes $workers;
error_log logs/error.log warn;
pid logs/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path tmp/body;
    upstream bench_redis { server 127.0.0.1:$redisport; keepalive $conns; }
    upstream bench_memc { server 127.0.0.1:$memcport; keepalive $conns; }
    upstream bench_db {
        sqldb_server 127.0.0.1:$pgport dbname=demo user=demo "password=demo pass" sslmode=disable;
        $1
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
        location = /bjr {
            sqldb_pass bench_db;
            sqldb_jwt_key $dir/jwt.rsa.pub;
            sqldb_query "select id, label from items where id = \$arg_id::int";
        }
        location = /c { sqldb_pass bench_db; sqldb_query "select id, label, price from items where id <= 100"; }
        location = /sleep { sqldb_pass bench_db; sqldb_query "select pg_sleep(1)"; }
        location = /r { set \$cache_key "key:__rand_int__"; cache_pass bench_redis; }
        location = /roff { set \$cache_key "key:__rand_int__"; cache_pipeline off; cache_pass bench_redis; }
        location = /ret { return 200 "$value"; }
        location = /ret_a { default_type application/x-resty-dbd-stream; return 200 "$(filler "${lens[a]}")"; }
        location = /ret_b { default_type application/x-resty-dbd-stream; return 200 "$(filler "${lens[b]}")"; }
        location = /ret_c { default_type application/x-resty-dbd-stream; return 200 "$(filler "${lens[c]}")"; }
        $memc_loc
    }
}
CONF
    "$nginx" -p "$dir/nginx/" -c "$dir/nginx/nginx.conf"
    sleep 0.3
}

# The workers' CPU time so far, in nanoseconds (user and kernel, of every
# thread: the first field of /proc/PID/task/TID/schedstat, which the
# scheduler counts exactly, where /proc/PID/stat's clock ticks are 10 ms).
worker_cpu_ns() {
    local total=0
    for p in $(pgrep -P "$(cat "$dir/nginx/logs/nginx.pid")"); do
        total=$((total + $(cat /proc/"$p"/task/*/schedstat 2>/dev/null | awk '{ n += $1 } END { printf "%.0f\n", n }')))
    done
    echo $total
}

worker_rss_kb() {
    local total=0
    for p in $(pgrep -P "$(cat "$dir/nginx/logs/nginx.pid")"); do
        total=$((total + $(awk '/^VmRSS/ { print $2 }' "/proc/$p/status")))
    done
    echo $total
}

# rss_point NAME: "NAME:requests served so far:worker RSS in kB".
rss_point() {
    echo "$1:$(awk '{ n += $1 } END { print n }' "$dir/served"):$(worker_rss_kb)"
}

# wrk_run PATH [SCRIPT]: prints "rps p99_ms non2xx cpu_us", cpu_us the
# worker's CPU microseconds per request served in the run.
wrk_run() {
    local path=$1 script=${2:-}
    local args=(-t1 -c"$conns" -d"${secs}s" --latency)
    [ -n "$script" ] && args+=(-s "$script")
    (sleep $((secs / 2)); psql -X -A -t -h 127.0.0.1 -p $pgport -U demo demo \
        -c "select count(*) - 1 from pg_stat_activity where datname = 'demo'" >"$dir/conns" 2>/dev/null) &
    local probe=$! t0
    t0=$(worker_cpu_ns)
    wrk "${args[@]}" "http://127.0.0.1:$port$path" >"$dir/wrk.out"
    local ns=$(($(worker_cpu_ns) - t0))
    awk -v served="$dir/served" -v ns=$ns '
        / requests in / { n = $1 }
        /Requests\/sec/ { rps = $2 }
        /^ +99%/ { v = $2; if (v ~ /us$/) { sub(/us/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms/, "", v) } else if (v ~ /s$/) { sub(/s/, "", v); v *= 1000 } p99 = v }
        /Non-2xx/ { bad = $NF }
        END { cpu = n > 0 ? ns / 1000 / n : 0; printf "%.0f %.2f %d %.2f\n", rps, p99, bad, cpu; printf "%d\n", n >>served }' "$dir/wrk.out"
    wait $probe
    echo "$(cat "$dir/conns")" >"$dir/conns.last"
}

pgbench_run() { # mode script: prints "tps p99_ms"
    pgbench -n -c"$conns" -j1 -T"$secs" -M "$1" -l --log-prefix="$dir/pgb" -h 127.0.0.1 -p $pgport -U demo \
        -f "$2" demo 2>/dev/null | awk '/^tps/ { printf "%.0f", $3 }'
    # p99 from the per-transaction log (latency in microseconds, column 3)
    cat "$dir"/pgb.* | awk '{ print $3 }' | sort -n | awk '{ a[NR] = $1 } END { printf " %.2f\n", a[int(NR * 0.99)] / 1000 }'
    rm -f "$dir"/pgb.*
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# BENCH_ONLY=jwt: the pk lookup without a token, with an HS256 one and
# with an RS256 one, twice each, interleaved, on one nginx.
if [ "${BENCH_ONLY:-}" = jwt ]; then
    start_nginx ""
    wrk -t1 -c"$conns" -d1s "http://127.0.0.1:$port/a" >/dev/null 2>&1 || true
    declare -A sum=([b]=0 [bj]=0 [bjr]=0)
    for round in 1 2; do
        for s in b bj bjr; do
            read -r rps p99 bad cpu <<<"$(wrk_run /$s "$dir/scripts/$s.lua")"
            echo "round $round: /$s ${rps}/s p99 ${p99}ms non-2xx $bad, worker ${cpu} us/request"
            sum[$s]=$((sum[$s] + rps))
        done
    done
    stop_nginx
    declare -A psum=([b]=0 [bj]=0)
    for round in 1 2; do
        for s in b bj; do
            read -r tps p99 <<<"$(pgbench_run prepared "$dir/scripts/$s.sql")"
            echo "round $round: pgbench $s.sql ${tps}/s p99 ${p99}ms"
            psum[$s]=$((psum[$s] + tps))
        done
    done
    {
        echo "pk lookup with a token / without: HS256 $(ratio "${sum[bj]}" "${sum[b]}"), RS256 $(ratio "${sum[bjr]}" "${sum[b]}")"
        echo "PostgreSQL alone, the same statements (pgbench -M prepared, preamble and lookup pipelined / lookup): $(ratio "${psum[bj]}" "${psum[b]}")"
    } | tee "$out/jwt.txt"
    exit 0
fi

if [ "${BENCH_ONLY:-}" = hol ]; then
    start_nginx "${BENCH_HOL_LINE:-}"
    wrk -t1 -c"$conns" -d1s "http://127.0.0.1:$port/a" >/dev/null 2>&1 || true
    for round in 1 2 3; do
        echo "round $round: $(python3 "$here/hol.py" "http://127.0.0.1:$port" 200 8 8)"
        sleep 2.2
    done | tee "$out/hol.txt"
    stop_nginx
    exit 0
fi

# syscalls_per_request PATH [SCRIPT]: the worker's system calls per
# request served (strace -c -f on it during a wrk run of its own).
syscalls_per_request() {
    local path=$1 script=${2:-} worker tracer
    local args=(-t1 -c"$conns" -d"${secs}s")
    [ -n "$script" ] && args+=(-s "$script")
    worker=$(pgrep -P "$(cat "$dir/nginx/logs/nginx.pid")" | head -n 1)
    strace -c -f -o "$dir/strace.out" -p "$worker" 2>/dev/null &
    tracer=$!
    sleep 0.5
    wrk "${args[@]}" "http://127.0.0.1:$port$path" >"$dir/wrk.out"
    kill -INT $tracer
    wait $tracer 2>/dev/null || true
    # (The calls: the fourth field of the total line, with or without an
    # errors column.)
    awk -v n="$(awk '/ requests in / { print $1 }' "$dir/wrk.out")" \
        '$NF == "total" { calls = $4 } END { if (n > 0) printf "%.2f\n", calls / n; else print "n/a" }' "$dir/strace.out"
}

# body_lengths: the lengths of the SQL scenarios' bodies (the pk lookup's
# label varies little: one id's), for the `return 200` of the same bytes.
body_lengths() {
    lens[a]=$(curl -s "http://127.0.0.1:$port/a" | wc -c)
    lens[b]=$(curl -s "http://127.0.0.1:$port/b?id=5000" | wc -c)
    lens[c]=$(curl -s "http://127.0.0.1:$port/c" | wc -c)
}

# cpu_table RUN_SECONDS [syscalls]: the first table. Each scenario (echo,
# pk lookup, 100 x 3, cache GET, the pk lookup with an HS256 token) and what
# it is measured against (nginx's `return 200` of the same bytes; for the
# token, the lookup without one), one worker, default pool, three rounds in
# which every run follows the other: the worker's CPU per request (user and
# kernel, schedstat), the median of the rounds, and the median of the
# rounds' ratios. With "syscalls": the worker's system calls per request
# too (strace -c -f, a run of its own for each).
cpu_table() {
    local run_secs=$1 with_syscalls=${2:-}
    start_nginx ""
    body_lengths
    start_nginx ""
    : >"$dir/served"
    wrk -t1 -c"$conns" -d1s "http://127.0.0.1:$port/a" >/dev/null 2>&1 || true
    wrk -t1 -c"$conns" -d1s -s "$dir/scripts/bj.lua" "http://127.0.0.1:$port/bj" >/dev/null 2>&1 || true
    local -A cpu_runs rps_runs ratio_runs
    local groups=("a ret_a" "b ret_b bj" "c ret_c" "r ret") rows=("a ret_a" "b ret_b" "c ret_c" "r ret" "bj b")
    local round group s ref rps p99 bad cpu
    for round in 1 2 3; do
        for group in "${groups[@]}"; do
            for s in $group; do
                read -r rps p99 bad cpu <<<"$(secs=$run_secs wrk_run "/$s" "$(script_of "$s")")"
                cpu_runs[$s]+="$cpu "
                rps_runs[$s]+="$rps "
                cpu_last[$s]=$cpu
            done
        done
        for group in "${rows[@]}"; do
            read -r s ref <<<"$group"
            ratio_runs[$s]+="$(ratio "${cpu_last[$s]}" "${cpu_last[$ref]}") "
        done
    done
    med() { printf '%s\n' $1 | sort -n | sed -n 2p; }
    local -A label=([a]="echo" [b]="pk lookup" [c]="100 rows x 3" [r]="cache GET 100 B" [bj]="pk lookup, token")
    local -A against=([ret_a]="return 200" [ret_b]="return 200" [ret_c]="return 200" [ret]="return 200" [b]="pk, no token")
    echo "Worker CPU per request (user + kernel, schedstat), one worker, default pool, wrk -t1 -c$conns, three interleaved"
    echo "rounds of ${run_secs} s: medians, and the median of the rounds' ratios; $(. /etc/os-release && echo "$PRETTY_NAME")," \
        "nginx $("$nginx" -v 2>&1 | sed 's/.*\///'), libpq $(pkg-config --modversion libpq 2>/dev/null || echo '?'), $(nproc) cores"
    printf '%-18s %10s   %-13s %10s %7s   %-20s %9s %9s' scenario "us/req" against "us/req" ratio "rounds" "rate/s" "its rate"
    [ -n "$with_syscalls" ] && printf ' %10s %10s' "syscalls/r" "its"
    echo
    for group in "${rows[@]}"; do
        read -r s ref <<<"$group"
        printf '%-18s %10s   %-13s %10s %7s   %-20s %9s %9s' "${label[$s]}" "$(med "${cpu_runs[$s]}")" "${against[$ref]}" \
            "$(med "${cpu_runs[$ref]}")" "$(med "${ratio_runs[$s]}")" "$(echo ${ratio_runs[$s]} | tr ' ' ,)" \
            "$(med "${rps_runs[$s]}")" "$(med "${rps_runs[$ref]}")"
        if [ -n "$with_syscalls" ]; then
            printf ' %10s %10s' "$(syscalls_per_request "/$s" "$(script_of "$s")")" \
                "$(syscalls_per_request "/$ref" "$(script_of "$ref")")"
        fi
        echo
    done
    stop_nginx
}
declare -A cpu_last
# script_of NAME: the wrk script of a scenario (the lookups vary the id).
script_of() {
    case $1 in b | bj | bjr) echo "$dir/scripts/$1.lua" ;; esac
}

if [ "${BENCH_ONLY:-}" = release ]; then
    cpu_table "$secs" syscalls | tee "$out/release.txt"
    exit 0
fi

# The first table: the worker's CPU per request beside nginx's own.
cpu_table $(((secs + 1) / 2)) >"$out/cpu.txt"
cat "$out/cpu.txt"

declare -A names=([a]="(a) echo" [b]="(b) pk lookup" [c]="(c) 100 rows x 3")
declare -A lines=([default]="" [max32]="sqldb_keepalive max=32;" [max2]="sqldb_keepalive max=2;")
configs=(default max32 max2)
tsv=$out/results.tsv
printf "scenario\tclient\tconfig\trps\tp99_ms\tnon2xx\tserver_conns\tcpu_us\n" >"$tsv"

# The raw servers first.
declare -A pp ps
for s in a b c; do
    read -r rps p99 <<<"$(pgbench_run prepared "$dir/scripts/$s.sql")"
    pp[$s]="$rps $p99"
    printf "%s\tpgbench -M prepared\t-\t%s\t%s\t0\t%s\t\n" "$s" "$rps" "$p99" "$conns" >>"$tsv"
    read -r rps p99 <<<"$(pgbench_run simple "$dir/scripts/$s.sql")"
    ps[$s]="$rps $p99"
    printf "%s\tpgbench -M simple\t-\t%s\t%s\t0\t%s\t\n" "$s" "$rps" "$p99" "$conns" >>"$tsv"
done
read -r rps p99 <<<"$(pgbench_run prepared "$dir/scripts/bj.sql")"
pp[bj]="$rps $p99"
printf "bj\tpgbench -M prepared\t-\t%s\t%s\t0\t%s\t\n" "$rps" "$p99" "$conns" >>"$tsv"
rb=$(redis-benchmark -p $redisport -t get -c "$conns" -n $((secs * 40000)) -d 100 --csv |
    awk -F'"' '/GET/ { printf "%.0f %.2f\n", $4, $14 }')
printf "r\tredis-benchmark\t-\t%s\t%s\t0\t%s\t\n" $rb "$conns" >>"$tsv"

start_nginx ""
body_lengths

# median_of LINES...: the line with the median first field (of three).
median_of() { printf '%s\n' "$@" | sort -n | sed -n 2p; }

# The gateway under each pool setting.
declare -A g ret rr pr prr
rss_first="" rss_runs=""
for cfg in "${configs[@]}"; do
    start_nginx "${lines[$cfg]}"
    : >"$dir/served"
    wrk -t1 -c"$conns" -d1s "http://127.0.0.1:$port/a" >/dev/null 2>&1 || true
    [ -n "$rss_first" ] || rss_first=$(worker_rss_kb)
    for s in a b c; do
        script=""
        [ $s = b ] && script="$dir/scripts/b.lua"
        if [ "$cfg" = default ]; then
            # Three rounds of half as long: the scenario, then nginx's
            # return 200 of a body of the same length. A figure is the
            # round's with the median requests/s; the ratio, the median of
            # the rounds' ratios.
            # pgbench -M prepared runs in each round too, as long: the
            # ratio to it is the median of the rounds' as well.
            runs=() rets=() ratios=() pratios=()
            for round in 1 2 3; do
                runs+=("$(secs=$(((secs + 1) / 2)) wrk_run /$s $script) $(cat "$dir/conns.last")")
                rets+=("$(secs=$(((secs + 1) / 2)) wrk_run /ret_$s)")
                ratios+=("$(ratio "${runs[-1]%% *}" "${rets[-1]%% *}")")
                pgb=$(secs=$(((secs + 1) / 2)) pgbench_run prepared "$dir/scripts/$s.sql")
                pratios+=("$(ratio "${runs[-1]%% *}" "${pgb%% *}")")
            done
            g[$s.$cfg]=$(median_of "${runs[@]}")
            ret[$s]=$(median_of "${rets[@]}")
            rr[$s]="$(median_of "${ratios[@]}")x (rounds: ${ratios[*]})"
            pr[$s]=$(median_of "${pratios[@]}")
            prr[$s]="${pratios[*]}"
            rss_runs="$rss_runs $(rss_point $s)"
            read -r rps p99 bad cpu _ <<<"${ret[$s]}"
            printf "ret_%s\tnginx\t-\t%s\t%s\t%s\t0\t%s\n" "$s" "$rps" "$p99" "$bad" "$cpu" >>"$tsv"
        else
            g[$s.$cfg]="$(wrk_run /$s $script) $(cat "$dir/conns.last")"
        fi
        read -r rps p99 bad cpu sc <<<"${g[$s.$cfg]}"
        printf "%s\tgateway\t%s\t%s\t%s\t%s\t%s\t%s\n" "$s" "$cfg" "$rps" "$p99" "$bad" "$sc" "$cpu" >>"$tsv"
        # Beside the pk lookup, the same with a token (default pool only).
        if [ $s = b ] && [ "$cfg" = default ]; then
            for j in bj bjr; do
                g[$j]=$(wrk_run /$j "$dir/scripts/$j.lua")
                rss_runs="$rss_runs $(rss_point $j)"
                read -r rps p99 bad cpu <<<"${g[$j]}"
                printf "%s\tgateway\t%s\t%s\t%s\t%s\t0\t%s\n" "$j" "$cfg" "$rps" "$p99" "$bad" "$cpu" >>"$tsv"
            done
        fi
    done
    if [ "$cfg" = default ]; then
        # The cache and its ceilings, with the default pool's nginx:
        # nginx's return 200, the gateway and memc one after the other, three
        # rounds of half as long each (the machine's speed drifts from run
        # to run; each round's ratios are of runs seconds apart). A figure
        # is the round's with the median requests/s; a ratio, the median
        # of the rounds' ratios.
        for round in 1 2 3; do
            for s in ret r m; do
                [ $s = m ] && [ ! -f "$memc" ] && continue
                g[$s.$round]=$(secs=$(((secs + 1) / 2)) wrk_run /$s)
            done
        done
        g[roff]=$(wrk_run /roff)
        for s in ret r m; do
            [ $s = m ] && [ ! -f "$memc" ] && continue
            g[$s]=$(for round in 1 2 3; do echo "${g[$s.$round]}"; done | sort -n | sed -n 2p)
        done
        declare -A cr
        for pair in r/ret r/m; do
            [ "${pair#*/}" = m ] && [ ! -f "$memc" ] && continue
            cr[$pair]=$(for round in 1 2 3; do
                ratio "$(echo "${g[${pair%/*}.$round]}" | cut -d' ' -f1)" "$(echo "${g[${pair#*/}.$round]}" | cut -d' ' -f1)"
                echo
            done | sort -n | tr '\n' ' ')
        done
        for s in ret r roff m; do
            [ -n "${g[$s]:-}" ] || continue
            read -r rps p99 bad cpu <<<"${g[$s]}"
            printf "%s\tnginx\t-\t%s\t%s\t%s\t0\t%s\n" "$s" "$rps" "$p99" "$bad" "$cpu" >>"$tsv"
        done
        rss_runs="$rss_runs $(rss_point cache)"
        # Fast requests while eight queries sleep for a second.
        hol=$(python3 "$here/hol.py" "http://127.0.0.1:$port" 200 8 8)
        printf "hol\tgateway\tdefault\t0\t%s\t0\t0\t\n" "$(echo "$hol" | awk '{ print $2 }')" >>"$tsv"
        # Then the pk lookup and the cache GET again, twice as long each:
        # the RSS over the million and more requests after every kind of
        # request has been served once.
        steady_from=$(rss_point steady)
        secs=$((secs * 2)) wrk_run /b "$dir/scripts/b.lua" >/dev/null
        secs=$((secs * 2)) wrk_run /r >/dev/null
        steady_to=$(rss_point steady)
    fi
done
stop_nginx

{
    echo "ngx_gateway benchmark, $(date -u +%Y-%m-%d): $conns client connections, ${secs}s per run," \
        "$(nproc) cores, $("$nginx" -v 2>&1 | sed 's/.*: //'), $workers worker(s)"
    echo
    cat "$out/cpu.txt"
    echo
    echo "SQL: requests/s, p99 ms, ratio to pgbench -M prepared (and to -M simple), server connections"
    printf "%-18s %-22s %-22s" "" "pgbench prepared" "pgbench simple"
    for cfg in "${configs[@]}"; do printf " %-32s" "gateway, ${lines[$cfg]:-no keepalive line}"; done
    echo
    for s in a b c; do
        read -r p1 p1l <<<"${pp[$s]}"
        read -r s1 s1l <<<"${ps[$s]}"
        printf "%-18s %-22s %-22s" "${names[$s]}" "$p1/s ${p1l}ms" "$s1/s ${s1l}ms"
        for cfg in "${configs[@]}"; do
            read -r rps p99 bad _ sc <<<"${g[$s.$cfg]}"
            cell="$rps/s ${p99}ms $(ratio "$rps" "$p1")x ($(ratio "$rps" "$s1")x) ${sc}c"
            # (The default pool: the median of the interleaved rounds.)
            [ "$cfg" = default ] && [ -n "${pr[$s]:-}" ] &&
                cell="$rps/s ${p99}ms ${pr[$s]}x ($(ratio "$rps" "$s1")x) ${sc}c"
            [ "$bad" != 0 ] && cell="$cell $bad non-2xx"
            printf " %-32s" "$cell"
        done
        echo
    done
    echo "(no keepalive line: the ratio to pgbench -M prepared is the median of three interleaved rounds of" \
        "$(((secs + 1) / 2))s: (a) ${prr[a]:-}, (b) ${prr[b]:-}, (c) ${prr[c]:-})"
    echo
    echo "Beside nginx's own return 200 of a body of the same length, default pool: requests/s, ratio (the median"
    echo "of three interleaved rounds), and the worker's CPU microseconds per request (user + kernel, schedstat / requests)"
    for s in a b c; do
        read -r rps _ _ cpu _ <<<"${g[$s.default]}"
        read -r trps _ _ tcpu <<<"${ret[$s]}"
        printf "%-18s gateway %8s/s %7s us/req   return 200 (%5s bytes) %8s/s %7s us/req   %s\n" \
            "${names[$s]}" "$rps" "$cpu" "${lens[$s]}" "$trps" "$tcpu" "${rr[$s]}"
    done
    echo
    read -r rr rrl _ rrc <<<"${g[r]}"
    read -r rt rtl _ rtc <<<"${g[ret]}"
    read -r rbr rbl <<<"$rb"
    median() { echo "$1" | awk '{ print $2 }'; }
    echo "Cache GET of a 100-byte value: requests/s, p99 ms (return 200, gateway and memc: the median of three rounds)"
    printf "%-34s %10s/s %8sms   %s us/req (worker CPU)\n" "nginx return 200 (ceiling)" "$rt" "$rtl" "$rtc"
    printf "%-34s %10s/s %8sms\n" "redis-benchmark" "$rbr" "$rbl"
    printf "%-34s %10s/s %8sms   %s us/req; %sx of return 200 (rounds: %s), %sx of redis-benchmark\n" \
        "gateway cache_pass" "$rr" "$rrl" "$rrc" "$(median "${cr[r/ret]}")" "${cr[r/ret]% }" "$(ratio "$rr" "$rbr")"
    read -r ro rol _ <<<"${g[roff]}"
    printf "%-34s %10s/s %8sms   %sx of return 200; shared / off %sx\n" "gateway, cache_pipeline off" "$ro" "$rol" \
        "$(ratio "$ro" "$rt")" "$(ratio "$rr" "$ro")"
    if [ -n "${g[m]:-}" ]; then
        read -r rm rml _ rmc <<<"${g[m]}"
        printf "%-34s %10s/s %8sms   %s us/req; %sx of return 200; gateway / memc %sx (rounds: %s)\n" \
            "memc module + memcached" "$rm" "$rml" "$rmc" "$(ratio "$rm" "$rt")" "$(median "${cr[r/m]}")" "${cr[r/m]% }"
    fi
    echo
    read -r jb jbl _ jbc _ <<<"${g[b.default]}"
    read -r jh jhl jhbad jhc <<<"${g[bj]}"
    read -r jr jrl jrbad jrc <<<"${g[bjr]}"
    echo "(b) with a bearer token, default pool: HS256 $jh/s ${jhl}ms ${jhc} us/req ($(ratio "$jh" "$jb")x of (b) without," \
        "${jbc} us/req), RS256 $jr/s ${jrl}ms ${jrc} us/req ($(ratio "$jr" "$jb")x); non-2xx: $jhbad, $jrbad"
    read -r pb _ <<<"${pp[b]}"
    read -r pj _ <<<"${pp[bj]}"
    echo "    PostgreSQL alone, the same statements (pgbench -M prepared, the preamble and the lookup pipelined):" \
        "$pj/s, $(ratio "$pj" "$pb")x of the lookup alone"
    echo
    echo "Head of line: 200 fast requests (8 at a time) while eight pg_sleep(1) run, default pool: $hol"
    echo "Worker RSS (kB), default pool: ${rss_first} after warm-up; after each run, as run:requests served:kB:"
    echo "   $rss_runs"
    IFS=: read -r _ n0 k0 <<<"$steady_from"
    IFS=: read -r _ n1 k1 <<<"$steady_to"
    echo "    then $((n1 - n0)) more requests (the pk lookup and the cache GET, $((secs * 2)) s each): $k0 kB to $k1 kB ($((k1 - k0)) kB)"
} | tee "$out/results.txt"

python3 "$here/chart.py" "$tsv" "$out/chart.svg"
echo "table: $out/results.txt  figures: $tsv  chart: $out/chart.svg"
