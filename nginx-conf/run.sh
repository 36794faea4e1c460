#!/usr/bin/env bash
# `make run`: a throwaway PostgreSQL with the sample schema and nginx with
# demo.conf, both in one folder. `make stop` ends them.
#   PORT=8080     nginx's port (127.0.0.1)
#   PGPORT=55432  PostgreSQL's port (127.0.0.1)
#   REDISPORT=56380  Redis's port (127.0.0.1)
#   DIR=/tmp/ngx-gateway-demo  the folder (removed by `make stop`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
port=${PORT:-8080}
pgport=${PGPORT:-55432}
redisport=${REDISPORT:-56380}
dir=${DIR:-/tmp/ngx-gateway-demo}
module=${MODULE:-$repo/objs/ngx_http_gateway_module.so}
nginx=${NGINX:-/usr/sbin/nginx}
for p in "$port" "$pgport" "$redisport"; do
    case $p in '' | *[!0-9]*) echo "run.sh: not a port: $p" >&2; exit 2 ;; esac
done
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac

stop() {
    if [ -f "$dir/nginx/logs/nginx.pid" ]; then
        if kill -QUIT "$(cat "$dir/nginx/logs/nginx.pid")" 2>/dev/null; then
            for _ in $(seq 50); do [ -f "$dir/nginx/logs/nginx.pid" ] || break; sleep 0.1; done
        fi
    fi
    "$here/pg-sandbox.sh" stop "$dir/pg"
    if [ -f "$dir/redis/redis.pid" ]; then
        kill "$(cat "$dir/redis/redis.pid")" 2>/dev/null || true
        for _ in $(seq 50); do [ -f "$dir/redis/redis.pid" ] || break; sleep 0.1; done
    fi
    # Only a folder this script made is removed.
    if [ -f "$dir/.ngx-gateway-demo" ]; then rm -rf "$dir"; fi
}

stop
if [ "${1:-}" = stop ]; then exit 0; fi

if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "run.sh: $dir is there and not empty; pick another DIR=" >&2
    exit 1
fi
mkdir -p "$dir" && touch "$dir/.ngx-gateway-demo"
chmod 0755 "$dir"    # nginx's workers and the postgres user reach their folders in it
# Whatever fails from here (a port in use, say): what was started stops.
trap 'echo "run.sh: make run failed (see above); what it started is stopped" >&2; stop' ERR
"$here/pg-sandbox.sh" start "$dir/pg" "$pgport" "$here/sample.sql"
# A Redis of the demo's own, for the streams of events.conf.
mkdir -p "$dir/redis"
redis-server --port "$redisport" --bind 127.0.0.1 --dir "$dir/redis" --daemonize yes \
    --pidfile "$dir/redis/redis.pid" --logfile "$dir/redis/redis.log" --save '' --appendonly no
for _ in $(seq 50); do redis-cli -p "$redisport" ping >/dev/null 2>&1 && break; sleep 0.1; done
# The outbox of events.conf (as the demo role, its owner).
PGPASSWORD='demo pass' psql -X -q -h 127.0.0.1 -p "$pgport" -U demo -d demo -v ON_ERROR_STOP=1 -f "$here/outbox.sql"
# Roles, grants and the row-level security policy of jwt.conf (as the superuser).
PGPASSWORD=$(cat "$dir/pg/superpw") psql -X -q -h 127.0.0.1 -p "$pgport" -U postgres -d demo -v ON_ERROR_STOP=1 -f "$here/jwt.sql"
# Tokens for it, signed with the demo secret (HS256, valid for a day).
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
token() {
    local msg
    msg="$(printf '{"alg":"HS256","typ":"JWT"}' | b64url).$(printf '%s' "$1" | b64url)"
    printf '%s.%s' "$msg" "$(printf '%s' "$msg" | openssl dgst -sha256 -hmac "$(cat "$here/jwt-demo.secret")" -binary | b64url)"
}
exp=$(($(date +%s) + 86400))
alice=$(token "{\"sub\":\"alice\",\"role\":\"notes_user\",\"exp\":$exp}")
bob=$(token "{\"sub\":\"bob\",\"role\":\"notes_user\",\"exp\":$exp}")
expired=$(token "{\"sub\":\"alice\",\"role\":\"notes_user\",\"exp\":$((exp - 2 * 86400))}")
mkdir -p "$dir/nginx/logs" "$dir/nginx/tmp" "$dir/nginx/html" "$dir/nginx/conf"
cp "$here/events.html" "$dir/nginx/html/"
# The configuration with the ports asked for (the files name 8080 and 55432).
cp "$here/jwt-demo.secret" "$dir/nginx/conf/"
for f in "$here"/*.conf; do
    sed -e "s/127\.0\.0\.1:8080/127.0.0.1:$port/g" -e "s/127\.0\.0\.1:55432/127.0.0.1:$pgport/g" \
        -e "s/127\.0\.0\.1:56380/127.0.0.1:$redisport/g" \
        "$f" >"$dir/nginx/conf/$(basename "$f")"
done
"$nginx" -p "$dir/nginx/" -c "$dir/nginx/conf/demo.conf" -g "load_module $module;"
trap - ERR

cat <<TXT

ngx_gateway demo is running: nginx on 127.0.0.1:$port, PostgreSQL on 127.0.0.1:$pgport, Redis on 127.0.0.1:$redisport, in $dir.

  curl -s http://127.0.0.1:$port/echo | od -A d -t x1 -c    # the RDS stream (docs/sqldb.md: The response)
  curl -si http://127.0.0.1:$port/cats                      # three rows, NULLs included
  curl -s -X LOCK http://127.0.0.1:$port/methods | od -c     # the LOCK template
  curl -sI http://127.0.0.1:$port/cats/1                    # HEAD: headers only
  curl -si -X POST http://127.0.0.1:$port/cats               # an INSERT: rows affected = 1
  curl -si -X DELETE http://127.0.0.1:$port/cats/2           # a DELETE
  curl -si -X PUT http://127.0.0.1:$port/cats/1              # no template for PUT: 405
  curl -si http://127.0.0.1:$port/cats/abc                   # not an integer: 400
  curl -s 'http://127.0.0.1:$port/search?name=o' | od -c     # a bound text parameter

  The JSON API of nginx-conf/crud.conf:
  curl -s http://127.0.0.1:$port/api/cats
  curl -si -X POST -d '{"name": "Nova", "age": 1}' http://127.0.0.1:$port/api/cats
  curl -s -X PUT -d '{"age": 4, "indoor": true}' http://127.0.0.1:$port/api/cats/1
  curl -si -X DELETE http://127.0.0.1:$port/api/cats/3
  curl -si http://127.0.0.1:$port/api/cats/3                # 404 now

  Live events (nginx-conf/events.conf): open this page in a browser,
    http://127.0.0.1:$port/events.html?room=demo
  then send events to it (each one is a row of the outbox table, with its id):
  curl --data-binary 'hello' http://127.0.0.1:$port/send/demo
  curl --data-binary \$'two\nlines' http://127.0.0.1:$port/send/demo
  curl -N http://127.0.0.1:$port/events/demo                          # the stream itself
  curl -N -H 'Last-Event-ID: 1' http://127.0.0.1:$port/events/demo    # what came after event 1, then live
  The same over a Redis stream: http://127.0.0.1:$port/events.html?room=demo&source=redis
  curl --data-binary 'hello' http://127.0.0.1:$port/stream-send/demo
  Bearer tokens and row-level security (nginx-conf/jwt.conf, jwt.sql):
  curl -s http://127.0.0.1:$port/notes                                     # anonymous: the public note
  curl -s -H 'Authorization: Bearer $alice' http://127.0.0.1:$port/notes   # alice: her notes
  curl -s -H 'Authorization: Bearer $bob' http://127.0.0.1:$port/notes     # bob: his
  curl -s -X POST -H 'Authorization: Bearer $bob' 'http://127.0.0.1:$port/notes?body=hello'
  curl -si -H 'Authorization: Bearer $expired' http://127.0.0.1:$port/notes   # 401

Logs: $dir/nginx/logs/error.log   Stop: make stop DIR=$dir
TXT
