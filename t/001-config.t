# Configuration: what loads, what nginx -t refuses (with file and line),
# connection parameters, upstream selection by variable.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

run_tests();

__DATA__

=== TEST 1: two default templates at one level
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /x {
    sqldb_pass database;
    sqldb_query "select 1";
    sqldb_query "select 2";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_query" directive is duplicate: a default query is already set in \S+nginx\.conf:\d+/



=== TEST 2: one method in two lists at one level
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /x {
    sqldb_pass database;
    sqldb_query GET POST "select 1";
    sqldb_query PUT POST "select 2";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_query" directive is duplicate: a query for method "POST" is already set in \S+nginx\.conf:\d+/



=== TEST 3: unknown method name
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /x {
    sqldb_pass database;
    sqldb_query FETCH "select 1";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_query" directive: unknown HTTP method "FETCH" in \S+nginx\.conf:\d+/



=== TEST 4: the same template level may repeat a method in one list? no
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /x {
    sqldb_pass database;
    sqldb_query GET GET "select 1";
}
--- must_die
--- error_log eval
qr/\[emerg\].*method "GET" is listed twice in \S+nginx\.conf:\d+/



=== TEST 5: sqldb_pass names no upstream
--- config
location /x {
    sqldb_pass nosuch;
    sqldb_query "select 1";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_pass" names upstream "nosuch", which has no "sqldb_server" in \S+nginx\.conf:\d+/



=== TEST 6: sqldb_pass names a plain (non-database) upstream
--- http_config
upstream web { server 127.0.0.1:1; }
--- config
location /x {
    sqldb_pass web;
    sqldb_query "select 1";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_pass" names upstream "web", which has no "sqldb_server"/



=== TEST 7: an upstream mixing server and sqldb_server
--- http_config
upstream database {
    server 127.0.0.1:1;
    sqldb_server $TEST_NGINX_PG_SERVER;
}
--- config
location /x {
    sqldb_pass database;
    sqldb_query "select 1";
}
--- must_die
--- error_log eval
qr/\[emerg\].*upstream "database" mixes "server" and "sqldb_server" in \S+nginx\.conf:\d+/



=== TEST 8: a malformed libpq keyword
--- http_config
upstream database { sqldb_server 127.0.0.1:5432 DBname=x; }
--- config
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_server" directive: invalid libpq keyword "DBname" in \S+nginx\.conf:\d+/



=== TEST 9: host= is not a keyword (the address is)
--- http_config
upstream database { sqldb_server 127.0.0.1:5432 host=elsewhere; }
--- config
--- must_die
--- error_log eval
qr/\[emerg\].*"host" is not allowed: the address is the first parameter in \S+nginx\.conf:\d+/



=== TEST 10: sqldb_server outside an upstream block
--- config
sqldb_server 127.0.0.1:5432 dbname=x;
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_server" directive is not allowed here in \S+nginx\.conf:\d+/



=== TEST 11: sqldb_pass twice
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /x {
    sqldb_pass database;
    sqldb_pass database;
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_pass" directive is duplicate in \S+nginx\.conf:\d+/



=== TEST 12: an invalid address
--- http_config
upstream database { sqldb_server 127.0.0.1:99999 dbname=x; }
--- config
--- must_die
--- error_log eval
qr/\[emerg\].*invalid port in "127.0.0.1:99999" of the "sqldb_server" directive in \S+nginx\.conf:\d+/



=== TEST 13: an unsupported balancer parameter
--- http_config
upstream database {
    hash $arg_k;
    sqldb_server $TEST_NGINX_PG_SERVER backup;
}
--- config
--- must_die
--- error_log eval
qr/\[emerg\].*balancing method does not support parameter "backup" in \S+nginx\.conf:\d+/



=== TEST 14: libpq keywords pass through (application_name), password with a space and a quote
--- http_config
upstream database {
    sqldb_server 127.0.0.1:$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER "password=$TEST_NGINX_PG_PASSWORD" application_name=gw_test connect_timeout=5 sslmode=disable;
}
--- config
location /app {
    sqldb_pass database;
    sqldb_query "select current_setting('application_name') as app, current_user as u";
}
--- request
GET /app
--- response_body eval
GatewayTest::rds_rows([['app', 25], ['u', 19]], [['gw_test', 'gateway']])



=== TEST 15: a unix socket directory as the address
--- http_config
upstream database {
    sqldb_server unix:$TEST_NGINX_PG_SOCKET_DIR port=$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER "password=$TEST_NGINX_PG_PASSWORD";
}
--- config
location /unix {
    sqldb_pass database;
    sqldb_query "select coalesce(inet_client_addr()::text, 'local') as via";
}
--- request
GET /unix
--- response_body eval
GatewayTest::rds('via', 'local')



=== TEST 16: sqldb_pass with a variable that names an upstream
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /var {
    set $target database;
    sqldb_pass $target;
    sqldb_query "select 'by variable' as echo";
}
--- request
GET /var
--- response_body eval
GatewayTest::rds('echo', 'by variable')



=== TEST 17: sqldb_pass with a variable that names nothing known: 500
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /var {
    sqldb_pass $arg_db;
    sqldb_query "select 1 as one";
}
--- request
GET /var?db=nosuch
--- error_code: 500
--- response_body_like: 500 Internal Server Error
--- error_log
sqldb: "sqldb_pass" value "nosuch" names no upstream with "sqldb_server"



=== TEST 18: an upstream declared after the location that uses it, with two servers
--- config
location /late {
    sqldb_pass later;
    sqldb_query "select 'late' as echo";
}
--- http_config
upstream later {
    sqldb_server $TEST_NGINX_PG_SERVER weight=2 max_fails=3 fail_timeout=5s;
    sqldb_server unix:$TEST_NGINX_PG_SOCKET_DIR port=$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER "password=$TEST_NGINX_PG_PASSWORD";
}
--- request eval
["GET /late", "GET /late", "GET /late"]
--- response_body eval
[GatewayTest::rds('echo', 'late'), GatewayTest::rds('echo', 'late'), GatewayTest::rds('echo', 'late')]



=== TEST 19: sqldb_pass inside "if" in location
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /if {
    sqldb_query "select 'plain' as echo";
    if ($arg_db) {
        sqldb_pass database;
    }
}
--- request
GET /if?db=1
--- response_body eval
GatewayTest::rds('echo', 'plain')



=== TEST 20: ... and without the condition the location has no database handler
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /if {
    sqldb_query "select 'plain' as echo";
    if ($arg_db) {
        sqldb_pass database;
    }
}
--- request
GET /if
--- error_code: 404



=== TEST 21: a mistyped libpq keyword is refused when the configuration is read
--- http_config
upstream database { sqldb_server 127.0.0.1:5432 dbnmae=x user=y; }
--- config
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_server" directive: invalid connection option "dbnmae" in \S+nginx\.conf:\d+/



=== TEST 22: a value libpq checks only when connecting (sslmode) is checked now
--- http_config
upstream database { sqldb_server 127.0.0.1:5432 dbname=x sslmode=requird; }
--- config
--- must_die
--- error_log eval
qr/\[emerg\].*invalid value "requird" of "sslmode", it must be disable, allow, prefer, require, verify-ca, verify-full in \S+nginx\.conf:\d+/



=== TEST 23: port= next to host:port is a conflict
--- http_config
upstream database { sqldb_server 127.0.0.1:5432 port=5433 dbname=x; }
--- config
--- must_die
--- error_log eval
qr/\[emerg\].*"port=" conflicts with the port of the address "127\.0\.0\.1:5432" in the "sqldb_server" directive in \S+nginx\.conf:\d+/



=== TEST 24: port= with an address without a port is the port
--- http_config
upstream database { sqldb_server 127.0.0.1 port=$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER "password=$TEST_NGINX_PG_PASSWORD"; }
--- config
location /p { sqldb_pass database; sqldb_output value; sqldb_query "select current_setting('port')"; }
--- request
GET /p
--- response_body_like: ^\d+$
--- response_body eval
$ENV{TEST_NGINX_PG_PORT}



=== TEST 25: cache_pass to an upstream of sqldb_server lines
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /c { set $cache_key $uri; cache_pass database; }
--- must_die
--- error_log eval
qr/\[emerg\].*"cache_pass" names upstream "database", which has "sqldb_server" lines \(use "sqldb_pass"\) in \S+nginx\.conf:\d+/



=== TEST 26: sqldb_pass and cache_pass in one location, in either order
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
upstream redis { server 127.0.0.1:6379; }
--- config
location /a { set $cache_key $uri; sqldb_pass database; cache_pass redis; }
--- must_die
--- error_log eval
qr/\[emerg\].*"cache_pass" cannot be in the same location as "sqldb_pass" in \S+nginx\.conf:\d+/



=== TEST 27: cache_pass then sqldb_pass
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
upstream redis { server 127.0.0.1:6379; }
--- config
location /a { set $cache_key $uri; cache_pass redis; sqldb_pass database; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_pass" cannot be in the same location as "cache_pass" in \S+nginx\.conf:\d+/



=== TEST 28: another module's content handler after sqldb_pass
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; proxy_pass http://127.0.0.1:1; }
--- must_die
--- error_log eval
qr/\[emerg\].*another directive of the location replaced the content handler that "sqldb_pass" set in \S+nginx\.conf:\d+/



=== TEST 29: ... and before it
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { proxy_pass http://127.0.0.1:1; sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_pass" cannot be in the same location as another content handler \(such as "proxy_pass"\) in \S+nginx\.conf:\d+/



=== TEST 30: a typed parameter inside a string literal
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 'id: $arg_id::int'"; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_query" directive: the typed parameter "\$arg_id::int" is inside a string literal, where it cannot be a parameter.* in \S+nginx\.conf:\d+/



=== TEST 31: ... inside a dollar-quoted string (quoted names and comments: core's unit tests)
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select $$ $arg_a::int $$"; }
location /b { sqldb_pass database; sqldb_query 'select 1 as "${arg_b}::text"'; }
location /c { sqldb_pass database; sqldb_query "select 1 /* $arg_c::int */"; }
--- must_die
--- error_log eval
qr/\[emerg\].*the typed parameter "\$arg_a::int" is inside a string literal.* in \S+nginx\.conf:\d+/



=== TEST 32: nginx -t refuses a zero timeout
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER;  }
--- config
location /a { sqldb_pass database; sqldb_connect_timeout 0; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_connect_timeout" must be more than 0.* in \S+nginx\.conf:\d+/


=== TEST 33: nginx -t refuses a zero result timeout at the server level
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER;  }
--- config
sqldb_result_timeout 0s; location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_result_timeout" must be more than 0.* in \S+nginx\.conf:\d+/


=== TEST 34: nginx -t refuses sqldb_set into a regex capture
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER;  }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_set $1 0 0; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid variable name "\$1" in "sqldb_set" directive \(a variable is written \$name\) in \S+nginx\.conf:\d+/


=== TEST 35: nginx -t refuses sqldb_pipeline twice
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline on; sqldb_pipeline off; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_pipeline" directive is duplicate.* in \S+nginx\.conf:\d+/


=== TEST 36: nginx -t refuses a keepalive parameter given twice
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_keepalive max=2 max=5; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*parameter "max=" is duplicate in "sqldb_keepalive" directive.* in \S+nginx\.conf:\d+/


=== TEST 37: nginx -t refuses a rewrite rule that an earlier one shadows
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER;  }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_rewrite no_rows 404; sqldb_rewrite no_rows 410; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_rewrite" directive is duplicate: an earlier rule has the condition "no_rows" for the same methods.* in \S+nginx\.conf:\d+/


=== TEST 38: nginx -t refuses a method and no query
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER;  }
--- config
location /a { sqldb_pass database; sqldb_query GET; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_query" directive has the method "GET" but no query.* in \S+nginx\.conf:\d+/


=== TEST 39: nginx -t refuses connect_timeout= that is not a number
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER connect_timeout=abc; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid value "abc" of "connect_timeout", it must be a whole number.* in \S+nginx\.conf:\d+/


=== TEST 40: nginx -t refuses binary_value with a query of several statements
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER;  }
--- config
location /a { sqldb_pass database; sqldb_output binary_value; sqldb_query "select 1; select 2"; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_output binary_value" needs queries of one statement.* in \S+nginx\.conf:\d+/


=== TEST 41: on/off and next_upstream values in any letter case, as nginx reads them
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline OFF; sqldb_keepalive max=2 mode=MULTI; }
--- config
location /a { sqldb_pass database; sqldb_next_upstream Error TIMEOUT; sqldb_output value; sqldb_query "select 'ok'"; }
--- request
GET /a
--- response_body chomp
ok



=== TEST 42: nginx -t refuses a typed parameter without its type
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select $arg_x::"; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_query" directive: "\$arg_x::" has no type after "::".* in \S+nginx\.conf:\d+/



=== TEST 43: the module says its version at start-up, at notice level
--- config
location /v { return 200 "ok"; }
--- request
GET /v
--- error_log eval
qr/\[notice\].*ngx_gateway\/\d+\.\d+\.\d+ \(built for nginx \d+\.\d+\.\d+\)/



=== TEST 44: nginx -t refuses sqldb_pipeline off depth=4;
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline off depth=4; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*parameter "depth=4" in "sqldb_pipeline" directive needs "on" in \S+nginx\.conf:\d+/



=== TEST 45: nginx -t refuses sqldb_pipeline on depth=0;
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline on depth=0; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid parameter "depth=0" in "sqldb_pipeline" directive in \S+nginx\.conf:\d+/



=== TEST 46: nginx -t refuses sqldb_pipeline on slow=0;
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline on slow=0; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid parameter "slow=0" in "sqldb_pipeline" directive in \S+nginx\.conf:\d+/



=== TEST 47: nginx -t refuses sqldb_pipeline on slow=soon;
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline on slow=soon; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid parameter "slow=soon" in "sqldb_pipeline" directive in \S+nginx\.conf:\d+/



=== TEST 48: nginx -t refuses sqldb_pipeline on depth=4 depth=8;
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline on depth=4 depth=8; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*parameter "depth" is duplicate in "sqldb_pipeline" directive in \S+nginx\.conf:\d+/



=== TEST 49: nginx -t refuses sqldb_pipeline on width=4;
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline on width=4; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid parameter "width=4" in "sqldb_pipeline" directive in \S+nginx\.conf:\d+/



=== TEST 50: sqldb_pipeline takes depth= and slow=
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_pipeline on depth=3 slow=20ms; }
--- config
location /a { sqldb_pass database; sqldb_output value; sqldb_query "select 'piped'"; }
--- request
GET /a
--- response_body chomp
piped



=== TEST 51: nginx -t refuses two sqldb_target without methods at one level
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a {
    sqldb_pass database;
    sqldb_query "select 1";
    sqldb_target primary;
    sqldb_target standby;
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_target" directive is duplicate: a target for every method is already set in \S+nginx\.conf:\d+/



=== TEST 52: nginx -t refuses one method in two sqldb_target lists
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a {
    sqldb_pass database;
    sqldb_query "select 1";
    sqldb_target GET HEAD prefer-standby;
    sqldb_target POST head primary;
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_target" directive is duplicate: a target for method "HEAD" is already set in \S+nginx\.conf:\d+/



=== TEST 53: nginx -t refuses a method twice in one sqldb_target list
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_target GET get standby; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_target" directive: method "GET" is listed twice in \S+nginx\.conf:\d+/



=== TEST 54: nginx -t refuses an unknown sqldb_target value
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_target GET replica; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid value "replica" in "sqldb_target" directive, it must be any, primary, standby, prefer-standby, read-write or read-only in \S+nginx\.conf:\d+/



=== TEST 55: nginx -t refuses an unknown method in a sqldb_target list
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_target FETCH primary; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_target" directive: unknown HTTP method "FETCH" in \S+nginx\.conf:\d+/



=== TEST 56: nginx -t refuses sqldb_target with a method and no value
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_target POST; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid value "POST" in "sqldb_target" directive, .* \(a method needs a value after it\) in \S+nginx\.conf:\d+/



=== TEST 57: sqldb_target any at the server level, by method below: a single server serves
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
sqldb_target any;
location /a {
    sqldb_pass database;
    sqldb_target GET primary;
    sqldb_output value;
    sqldb_query "select pg_is_in_recovery()::text";
}
--- request
GET /a
--- response_body chomp
false



=== TEST 58: nginx -t refuses sqldb_stream_connections 0
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_stream on; sqldb_stream_connections 0; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid value "0" in "sqldb_stream_connections" directive, it must be a number of 1 or more in \S+nginx\.conf:\d+/



=== TEST 59: nginx -t refuses a sqldb_stream_connections that is not a number
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_stream_connections half; }
--- must_die
--- error_log eval
qr/\[emerg\].*invalid value "half" in "sqldb_stream_connections" directive, it must be a number of 1 or more in \S+nginx\.conf:\d+/



=== TEST 60: nginx -t refuses sqldb_stream_connections twice
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_query "select 1"; sqldb_stream_connections 2; sqldb_stream_connections 3; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_stream_connections" directive is duplicate in \S+nginx\.conf:\d+/



=== TEST 61: sqldb_stream_connections at the server level, inherited by a streamed location
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
sqldb_stream_connections 3;
location /a {
    sqldb_pass database;
    sqldb_stream on;
    sqldb_output text;
    sqldb_query "select 'streamed'";
}
--- request
GET /a
--- response_body
streamed



=== TEST 62: nginx -t refuses a sqldb_listen_buffers_max that is not a size
--- http_config
sqldb_listen_buffers_max 4q;
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_listen a; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_listen_buffers_max" directive invalid value in \S+nginx\.conf:\d+/



=== TEST 63: nginx -t refuses cache_subscribe_buffers_max 0
--- http_config
cache_subscribe_buffers_max 0;
--- config
location /a { return 204; }
--- must_die
--- error_log eval
qr/\[emerg\].*"cache_subscribe_buffers_max" must be more than 0 in \S+nginx\.conf:\d+/



=== TEST 64: sqldb_listen_buffers_max is for the http level only
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /a { sqldb_pass database; sqldb_listen a; sqldb_listen_buffers_max 1m; }
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_listen_buffers_max" directive is not allowed here in \S+nginx\.conf:\d+/



=== TEST 65: two quoted strings to sqldb_query: the first is taken for a method, and the message says where the template goes
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /x {
    sqldb_pass database;
    sqldb_query "select 1" extra;
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_query" directive: unknown HTTP method "select 1" \(methods come first, then the template as one argument, in quotes\) in \S+nginx\.conf:\d+/
