# Configurations written for the established C module (ngx_postgres), with
# postgres_ renamed to sqldb_, behave as they did there: contexts (http
# level, "if" in location), sqldb_rewrite's order and conditions,
# sqldb_escape in place, value's Content-Type, keywords in any letter case.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: sqldb_query at http level, inherited by a location without its own
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
sqldb_query "select 'from http' as echo";
--- config
location /h { sqldb_pass database; }
--- request
GET /h
--- response_body eval
GatewayTest::rds('echo', 'from http')



=== TEST 2: sqldb_pass, sqldb_query, sqldb_output inside "if", and the location's own answer outside it
--- config
location /if {
    if ($arg_go) {
        sqldb_pass database;
        sqldb_query "select name from cats where id = 1";
        sqldb_output value;
        break;
    }
    return 404;
}
--- request eval
["GET /if?go=1", "GET /if"]
--- error_code eval
[200, 404]
--- response_body_like eval
["^Tom\$", "404 Not Found"]



=== TEST 3: sqldb_rewrite inside "if"; the "if" block uses the location's sqldb_pass and query
--- config
location /r {
    sqldb_pass database;
    sqldb_query "select * from cats where id = $arg_id::int";
    if ($arg_strict) {
        sqldb_rewrite no_rows 410;
    }
}
--- request eval
["GET /r?id=99&strict=1", "GET /r?id=99"]
--- error_code eval
[410, 200]



=== TEST 4: value and binary_value use default_type, whatever the extension of the URI
--- config
default_type text/plain;
location /v { sqldb_pass database; sqldb_output value; sqldb_query "select 'test' as echo"; }
--- request
GET /v.jpg
--- response_headers
Content-Type: text/plain
--- response_body chomp
test



=== TEST 5: sqldb_escape =$var escapes in place, an empty value as ''
--- config
location /e {
    set $empty "";
    set $quote "it's";
    sqldb_escape =$empty;
    sqldb_escape =$quote;
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select $empty || '|' || $quote";
}
--- request
GET /e
--- response_body chomp
|it's



=== TEST 6: a rewrite to 300 or more answers before a required sqldb_set is looked at
--- config
location /auth {
    sqldb_pass database;
    sqldb_query "select name from cats where name = $arg_user::text";
    sqldb_rewrite no_rows 403;
    sqldb_set $login 0 0 required;
    sqldb_output none;
    add_header X-Login $login;
}
--- request eval
["GET /auth?user=nobody", "GET /auth?user=Tom"]
--- error_code eval
[403, 200]
--- no_error_log
is required



=== TEST 7: changes and no_changes count statements that return rows (RETURNING)
--- config
location /ins {
    sqldb_pass database;
    sqldb_query POST "insert into kv values ('compat-' || $arg_k::text, 'v') returning k";
    sqldb_query PUT "update kv set v = 'w' where k = 'compat-' || $arg_k::text returning k";
    sqldb_rewrite POST changes 201;
    sqldb_rewrite PUT no_changes 410;
    sqldb_output text;
}
--- request eval
["POST /ins?k=a", "PUT /ins?k=absent", "PUT /ins?k=a"]
--- error_code eval
[201, 410, 200]
--- response_body_like eval
["^compat-a\$", "410 Gone", "^compat-a\$"]



=== TEST 8: no_rows holds for a statement without rows; no_changes does not hold for DDL or SELECT
--- config
location /upd {
    sqldb_pass database;
    sqldb_query "update cats set age = age where id = 999";
    sqldb_rewrite no_rows 410;
}
location /ddl {
    sqldb_pass database;
    sqldb_query "create temp table if not exists t (a int)";
    sqldb_rewrite no_changes 409;
}
location /sel {
    sqldb_pass database;
    sqldb_query "select 1 where false";
    sqldb_rewrite no_changes 409;
}
--- request eval
["GET /upd", "GET /ddl", "GET /sel"]
--- error_code eval
[410, 200, 200]



=== TEST 9: a rule for the method beats the condition's rule for every method
--- config
location /m {
    sqldb_pass database;
    sqldb_query "select 1 as one";
    sqldb_rewrite rows 206;
    sqldb_rewrite GET rows 201;
    sqldb_output text;
}
--- request eval
["GET /m", "POST /m"]
--- error_code eval
[201, 206]
--- response_body eval
["1\n", "1\n"]



=== TEST 10: keywords in any letter case; sqldb_keepalive max=0 is no keepalive
--- http_config
upstream database {
    sqldb_server $TEST_NGINX_PG_SERVER;
    sqldb_keepalive max=0 mode=SINGLE overflow=REJECT;
}
--- config
location /k {
    sqldb_pass database;
    sqldb_query get "select 'one' as v";
    sqldb_output VALUE;
    sqldb_set $v 0 0 REQUIRED;
    sqldb_rewrite GET ROWS 201;
    add_header X-V $v;
}
--- request eval
["GET /k", "GET /k"]
--- error_code eval
[201, 201]
--- response_headers
X-V: one
--- response_body eval
["one", "one"]
