# Every response ends on a keep-alive connection, empty bodies included:
# each output format on an empty result, an empty cell and a statement
# without rows, buffered and streamed, with and without sqldb_rewrite; the
# next request on the same client connection is answered too.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: text: empty result, one '' cell, an UPDATE, then a request after them
--- config
location /none { sqldb_pass database; sqldb_output text; sqldb_query "select 1 where false"; }
location /blank { sqldb_pass database; sqldb_output text; sqldb_query "select ''::text as b"; }
location /upd { sqldb_pass database; sqldb_output text; sqldb_query "update cats set age = age where false"; }
location /one { sqldb_pass database; sqldb_output text; sqldb_query "select 'x' as one"; }
--- pipelined_requests eval
["GET /none", "GET /blank", "GET /upd", "GET /one"]
--- error_code eval
[200, 200, 200, 200]
--- response_body eval
["", "\n", "", "x\n"]
--- timeout: 5



=== TEST 2: csv and json of statements without rows and of empty results
--- config
location /csvu { sqldb_pass database; sqldb_output csv; sqldb_query "update cats set age = age where false"; }
location /csve { sqldb_pass database; sqldb_output csv; sqldb_query "select 1 as a where false"; }
location /jsone { sqldb_pass database; sqldb_output json; sqldb_query "select 1 as a where false"; }
location /jsonu { sqldb_pass database; sqldb_output json; sqldb_query "update cats set age = age where false"; }
--- pipelined_requests eval
["GET /csvu", "GET /csve", "GET /jsone", "GET /jsonu"]
--- error_code eval
[200, 200, 200, 200]
--- response_body eval
["", "a\r\n", "[]", '{"affected":0}']
--- timeout: 5



=== TEST 3: streamed text, csv, json and rds on an empty result
--- config
sqldb_stream on;
location /t { sqldb_pass database; sqldb_output text; sqldb_query "select 1 where false"; }
location /c { sqldb_pass database; sqldb_output csv; sqldb_query "select 1 as a where false"; }
location /j { sqldb_pass database; sqldb_output json; sqldb_query "select 1 as a where false"; }
location /r { sqldb_pass database; sqldb_query "select 1 as a where false"; }
location /after { sqldb_pass database; sqldb_output text; sqldb_query "select 'next' as n"; }
--- pipelined_requests eval
["GET /t", "GET /c", "GET /j", "GET /r", "GET /after"]
--- error_code eval
[200, 200, 200, 200, 200]
--- response_body eval
["", "a\r\n", "[]", GatewayTest::rds_rows([['a', 23]], []), "next\n"]
--- timeout: 5



=== TEST 4: sqldb_rewrite with "=" keeps an empty body; HEAD and none
--- config
location /nf {
    sqldb_pass database;
    sqldb_output text;
    sqldb_query "select 1 where false";
    sqldb_rewrite no_rows =404;
}
location /ok { sqldb_pass database; sqldb_output text; sqldb_query "select 'x' as one"; }
location /n { sqldb_pass database; sqldb_output none; sqldb_query "select 1"; }
--- pipelined_requests eval
["GET /nf", "HEAD /ok", "GET /n", "GET /ok"]
--- error_code eval
[404, 200, 200, 200]
--- response_body eval
["", "", "", "x\n"]
--- timeout: 5



=== TEST 5: 405, 404 and an error on the same keep-alive connection (nginx closes after a 500)
--- config
location /bad { sqldb_pass database; sqldb_query "select * from nowhere"; }
location /m { sqldb_pass database; sqldb_query GET "select 1"; }
location /nf { sqldb_pass database; sqldb_output text; sqldb_query "select 1 where false"; sqldb_rewrite no_rows 404; }
location /ok { sqldb_pass database; sqldb_output text; sqldb_query "select 'x' as one"; }
--- pipelined_requests eval
["POST /m", "GET /nf", "GET /ok", "GET /bad"]
--- error_code eval
[405, 404, 200, 500]
--- response_body_like eval
["405 Not Allowed", "404 Not Found", "^x\$", "500 Internal Server Error"]
--- timeout: 5
