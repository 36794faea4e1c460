#!/usr/bin/env bash
# `make run`: a throwaway PostgreSQL with the sample schema and nginx with
# demo.conf on 127.0.0.1:8080, both in /tmp/ngx-gateway-demo. `make stop` ends them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
dir=/tmp/ngx-gateway-demo
module=${MODULE:-$repo/objs/ngx_http_gateway_module.so}
nginx=${NGINX:-/usr/sbin/nginx}

stop() {
    if [ -f "$dir/nginx/logs/nginx.pid" ]; then
        "$nginx" -p "$dir/nginx/" -c "$here/demo.conf" -g "load_module $module;" -s quit 2>/dev/null || true
        sleep 0.5
    fi
    "$here/pg-sandbox.sh" stop "$dir/pg"
    rm -rf "$dir"
}

stop
if [ "${1:-}" = stop ]; then exit 0; fi

"$here/pg-sandbox.sh" start "$dir/pg" 55432 "$here/sample.sql"
# Roles, grants and the row-level security policy of jwt.conf (as the superuser).
PGPASSWORD=$(cat "$dir/pg/superpw") psql -X -q -h 127.0.0.1 -p 55432 -U postgres -d demo -v ON_ERROR_STOP=1 -f "$here/jwt.sql"
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
mkdir -p "$dir/nginx/logs" "$dir/nginx/tmp" "$dir/nginx/html"
cp "$here/events.html" "$dir/nginx/html/"
"$nginx" -p "$dir/nginx/" -c "$here/demo.conf" -g "load_module $module;"

cat <<TXT

ngx_gateway demo is running: nginx on 127.0.0.1:8080, PostgreSQL on 127.0.0.1:55432.

  curl -s http://127.0.0.1:8080/echo | od -A d -t x1 -c    # the RDS stream (README: The response)
  curl -si http://127.0.0.1:8080/cats                      # three rows, NULLs included
  curl -s -X LOCK http://127.0.0.1:8080/methods | od -c     # the LOCK template
  curl -sI http://127.0.0.1:8080/cats/1                    # HEAD: headers only
  curl -si -X POST http://127.0.0.1:8080/cats               # an INSERT: rows affected = 1
  curl -si -X DELETE http://127.0.0.1:8080/cats/2           # a DELETE
  curl -si -X PUT http://127.0.0.1:8080/cats/1              # no template for PUT: 405
  curl -si http://127.0.0.1:8080/cats/abc                   # not an integer: 400
  curl -s 'http://127.0.0.1:8080/search?name=o' | od -c     # a bound text parameter

  The JSON API of nginx-conf/crud.conf:
  curl -s http://127.0.0.1:8080/api/cats
  curl -si -X POST -d '{"name": "Nova", "age": 1}' http://127.0.0.1:8080/api/cats
  curl -s -X PUT -d '{"age": 4, "indoor": true}' http://127.0.0.1:8080/api/cats/1
  curl -si -X DELETE http://127.0.0.1:8080/api/cats/3
  curl -si http://127.0.0.1:8080/api/cats/3                # 404 now

  Live events (nginx-conf/events.conf): open this page in a browser,
    http://127.0.0.1:8080/events.html?channel=demo
  then send events to it:
  curl --data-binary 'hello' 'http://127.0.0.1:8080/notify?channel=demo'
  curl --data-binary \$'two\nlines' 'http://127.0.0.1:8080/notify?channel=demo'
  curl -N 'http://127.0.0.1:8080/listen?channel=demo'      # the stream itself
  Bearer tokens and row-level security (nginx-conf/jwt.conf, jwt.sql):
  curl -s http://127.0.0.1:8080/notes                                     # anonymous: the public note
  curl -s -H 'Authorization: Bearer $alice' http://127.0.0.1:8080/notes   # alice: her notes
  curl -s -H 'Authorization: Bearer $bob' http://127.0.0.1:8080/notes     # bob: his
  curl -s -X POST -H 'Authorization: Bearer $bob' 'http://127.0.0.1:8080/notes?body=hello'
  curl -si -H 'Authorization: Bearer $expired' http://127.0.0.1:8080/notes   # 401

Logs: $dir/nginx/logs/error.log   Stop: make stop
TXT
