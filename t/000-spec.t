# The specified behaviour: template selection by method, inheritance
# from the server level, $request_method, 405, and the RDS stream.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

run_tests();

__DATA__

=== TEST 1: default template only, GET
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /echo {
    sqldb_pass database;
    sqldb_query "select 'default' as echo";
}
--- request
GET /echo
--- error_code: 200
--- response_headers
Content-Type: application/x-gateway-dbd-stream
--- response_body eval
"\x00\x03\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00" .
"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00" .
"\x01\x00" . "\x06\x80\x19\x00\x04\x00echo" .
"\x01\x07\x00\x00\x00default" . "\x00"



=== TEST 2: method list LOCK GET UNLOCK, GET runs it with $request_method
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /methods {
    sqldb_pass database;
    sqldb_query LOCK GET UNLOCK "select '$request_method' as echo";
}
--- request
GET /methods
--- response_body eval
GatewayTest::rds('echo', 'GET')



=== TEST 3: method list LOCK GET UNLOCK, LOCK
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /methods {
    sqldb_pass database;
    sqldb_query LOCK GET UNLOCK "select '$request_method' as echo";
}
--- request
LOCK /methods
--- response_body eval
GatewayTest::rds('echo', 'LOCK')



=== TEST 4: method list LOCK GET UNLOCK, UNLOCK
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /methods {
    sqldb_pass database;
    sqldb_query LOCK GET UNLOCK "select '$request_method' as echo";
}
--- request
UNLOCK /methods
--- response_body eval
GatewayTest::rds('echo', 'UNLOCK')



=== TEST 5: method list LOCK GET UNLOCK, HEAD has no template: 405
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /methods {
    sqldb_pass database;
    sqldb_query LOCK GET UNLOCK "select '$request_method' as echo";
}
--- request
HEAD /methods
--- error_code: 405
--- response_headers
!X-Nothing



=== TEST 6: default plus method template, GET takes the method one (declared after)
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /mixed {
    sqldb_pass database;
    sqldb_query "select 'default' as echo";
    sqldb_query LOCK GET UNLOCK "select '$request_method' as echo";
}
--- request
GET /mixed
--- response_body eval
GatewayTest::rds('echo', 'GET')



=== TEST 7: default plus method template, POST takes the default
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /mixed {
    sqldb_pass database;
    sqldb_query "select 'default' as echo";
    sqldb_query LOCK GET UNLOCK "select '$request_method' as echo";
}
--- request
POST /mixed
--- response_body eval
GatewayTest::rds('echo', 'default')



=== TEST 8: PATCH
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /patch {
    sqldb_pass database;
    sqldb_query PATCH "select '$request_method' as echo";
}
--- request
PATCH /patch
--- response_body eval
GatewayTest::rds('echo', 'PATCH')



=== TEST 9: a location with only a method template ignores the server's default: 405
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
sqldb_query "select 'server default' as echo";
location /own {
    sqldb_pass database;
    sqldb_query GET "select 'own' as echo";
}
--- request
POST /own
--- error_code: 405



=== TEST 10: ... and its own template still answers its method
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
sqldb_query "select 'server default' as echo";
location /own {
    sqldb_pass database;
    sqldb_query GET "select 'own' as echo";
}
--- request
GET /own
--- response_body eval
GatewayTest::rds('echo', 'own')



=== TEST 11: a location without templates inherits the server's default and method ones (method)
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
sqldb_query "select 'server default' as echo";
sqldb_query LOCK GET UNLOCK "select 'server $request_method' as echo";
location /inherit {
    sqldb_pass database;
}
--- request
LOCK /inherit
--- response_body eval
GatewayTest::rds('echo', 'server LOCK')



=== TEST 12: ... and the default for other methods
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
sqldb_query "select 'server default' as echo";
sqldb_query LOCK GET UNLOCK "select 'server $request_method' as echo";
location /inherit {
    sqldb_pass database;
}
--- request
POST /inherit
--- response_body eval
GatewayTest::rds('echo', 'server default')



=== TEST 13: inherited method template without a default: other methods get 405
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
sqldb_query GET "select 'server get' as echo";
location /inherit {
    sqldb_pass database;
}
--- request
DELETE /inherit
--- error_code: 405



=== TEST 14: every method nginx knows can be listed
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /all {
    sqldb_pass database;
    sqldb_query GET POST PUT DELETE MKCOL COPY MOVE OPTIONS PROPFIND PROPPATCH LOCK UNLOCK PATCH TRACE "select '$request_method' as echo";
}
--- request eval
[map { "$_ /all" } qw(GET POST PUT DELETE MKCOL COPY MOVE OPTIONS PROPFIND PROPPATCH LOCK UNLOCK PATCH)]
--- response_body eval
[map { GatewayTest::rds('echo', $_) } qw(GET POST PUT DELETE MKCOL COPY MOVE OPTIONS PROPFIND PROPPATCH LOCK UNLOCK PATCH)]



=== TEST 15: HEAD with a template gets the headers only
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /head {
    sqldb_pass database;
    sqldb_query HEAD "select 'x' as echo";
}
--- request
HEAD /head
--- response_headers
Content-Type: application/x-gateway-dbd-stream
Content-Length: 47
--- response_body
