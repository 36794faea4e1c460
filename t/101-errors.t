# Errors with real triggers: bad SQL, a refused or missing server, a wrong
# password, a server that never answers, slow queries, a stopped server.
# Each gets the right status and one clear error-log line.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: SQL syntax error: 500 and PostgreSQL's message in the log
--- config
location /bad {
    sqldb_pass database;
    sqldb_query "selec 1";
}
--- request
GET /bad
--- error_code: 500
--- response_body_like: 500 Internal Server Error
--- error_log eval
qr/\[error\].*sqldb: query failed: ERROR: syntax error at or near "selec" \(SQLSTATE 42601\) while reading result from PostgreSQL, client: 127\.0\.0\.1, .*upstream: "postgres:\/\/127\.0\.0\.1:\d+"/



=== TEST 2: a missing table
--- config
location /missing {
    sqldb_pass database;
    sqldb_query "select * from no_such_table";
}
--- request
GET /missing
--- error_code: 500
--- error_log
relation "no_such_table" does not exist (SQLSTATE 42P01)



=== TEST 3: a constraint violation, with PostgreSQL's detail
--- config
location /dup {
    sqldb_pass database;
    sqldb_query "insert into items values (1, 'again')";
}
--- request
POST /dup
--- error_code: 500
--- error_log
duplicate key value violates unique constraint "items_pkey" DETAIL: Key (id)=(1) already exists. (SQLSTATE 23505)



=== TEST 4: the query is empty after variables: 500 without asking the server
--- config
location /empty {
    sqldb_pass database;
    sqldb_query "$arg_q";
}
--- request
GET /empty
--- error_code: 500
--- error_log
sqldb: the query is empty after variable substitution



=== TEST 5: only white space reaches the server: 500
--- config
location /blank {
    sqldb_pass database;
    sqldb_query "  $arg_q  ";
}
--- request
GET /blank
--- error_code: 500
--- error_log
sqldb: the query holds no statement



=== TEST 6: no sqldb_query at all: 500
--- config
location /noquery {
    sqldb_pass database;
}
--- request
GET /noquery
--- error_code: 500
--- error_log
sqldb: no "sqldb_query" is configured for this location



=== TEST 7: connection refused: 502
--- http_config
upstream database { sqldb_server 127.0.0.1:$TEST_NGINX_CLOSED_PORT dbname=x user=y password=z; }
--- config
location /refused {
    sqldb_pass database;
    sqldb_query "select 1";
}
--- request
GET /refused
--- error_code: 502
--- response_body_like: 502 Bad Gateway
--- error_log eval
qr/\[error\].*sqldb: connect.*127\.0\.0\.1.*Connection refused/



=== TEST 8: a unix socket directory without a server: 502
--- http_config
upstream database { sqldb_server unix:/nonexistent/pg dbname=x user=y password=z; }
--- config
location /nosocket {
    sqldb_pass database;
    sqldb_query "select 1";
}
--- request
GET /nosocket
--- error_code: 502
--- error_log eval
qr/\[error\].*sqldb: connect.*\/nonexistent\/pg\/\.s\.PGSQL\.5432.*No such file or directory/



=== TEST 9: wrong password: 502 with the server's reason
--- http_config
upstream database { sqldb_server 127.0.0.1:$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER password=wrong; }
--- config
location /auth {
    sqldb_pass database;
    sqldb_query "select 1";
}
--- request
GET /auth
--- error_code: 502
--- error_log
password authentication failed for user "gateway"



=== TEST 10: a server that accepts but never answers: 504 after sqldb_connect_timeout
--- http_config
upstream database { sqldb_server 127.0.0.1:$TEST_NGINX_SILENT_PORT dbname=x user=y password=z; }
--- config
location /silent {
    sqldb_connect_timeout 300ms;
    sqldb_pass database;
    sqldb_query "select 1";
}
--- request
GET /silent
--- error_code: 504
--- response_body_like: 504 Gateway Time-out
--- error_log
sqldb: timed out (300 ms) connecting



=== TEST 11: a query slower than sqldb_result_timeout: 504
--- config
location /slow {
    sqldb_result_timeout 300ms;
    sqldb_pass database;
    sqldb_query "select pg_sleep(3)";
}
--- request
GET /slow
--- error_code: 504
--- error_log
sqldb: timed out (300 ms) waiting for the result



=== TEST 12: a query within the timeout
--- config
location /slow {
    sqldb_result_timeout 2s;
    sqldb_pass database;
    sqldb_query "select pg_sleep(0.2)::text as slept";
}
--- request
GET /slow
--- response_body eval
GatewayTest::rds('slept', '')



=== TEST 13: COPY cannot be served: 500, and the worker carries on
--- config
location /copy {
    sqldb_pass database;
    sqldb_query "copy items to stdout";
}
location /after {
    sqldb_pass database;
    sqldb_query "select 'fine' as echo";
}
--- request eval
["GET /copy", "GET /after"]
--- error_code eval
[500, 200]
--- error_log
sqldb: the query started a COPY (PGRES_COPY_OUT), which the gateway cannot serve



=== TEST 14: a statement that fails after one that succeeded: 500
--- config
location /partial {
    sqldb_pass database;
    sqldb_query "select 1; select 1/0";
}
--- request
GET /partial
--- error_code: 500
--- error_log
division by zero (SQLSTATE 22012)



=== TEST 15: the server is stopped: 502, one log line
--- init
GatewayTest::pg_stop();
--- config
location /stopped {
    sqldb_pass database;
    sqldb_query "select 1";
}
--- request
GET /stopped
--- error_code: 502
--- error_log eval
qr/\[error\].*sqldb: connect.*Connection refused/
--- no_error_log
[alert]
[crit]



=== TEST 16: the server is back: requests succeed again
--- init
GatewayTest::pg_start();
--- config
location /back {
    sqldb_pass database;
    sqldb_query "select 'back' as echo";
}
--- request
GET /back
--- response_body eval
GatewayTest::rds('echo', 'back')
