# sqldb_stream on: rows go out as they arrive; the bytes are the same as
# without streaming.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: RDS, 100,000 rows, streamed (chunked), byte for byte
--- config
location /big {
    sqldb_pass database;
    sqldb_stream on;
    sqldb_query "select g as id, 'item ' || g as label from generate_series(1, 100000) g";
}
--- request
GET /big
--- response_headers
Transfer-Encoding: chunked
!Content-Length
--- response_body eval
GatewayTest::rds_rows([['id', 23], ['label', 25]], [map { [$_, "item $_"] } 1 .. 100000])
--- timeout: 30



=== TEST 2: json, csv and text stream the same bytes as whole results
--- config
location /j { sqldb_pass database; sqldb_stream on; sqldb_output json; sqldb_query "select id, name, notes from cats order by id"; }
location /c { sqldb_pass database; sqldb_stream on; sqldb_output csv; sqldb_query "select id, name, notes from cats order by id"; }
location /t { sqldb_pass database; sqldb_stream on; sqldb_output text; sqldb_query "select id, notes from cats order by id"; }
--- request eval
["GET /j", "GET /c", "GET /t"]
--- response_body eval
['[{"id":1,"name":"Tom","notes":null},{"id":2,"name":"Bob","notes":""},{"id":3,"name":"Jerry","notes":"no data"}]',
 "id,name,notes\r\n1,Tom,\r\n2,Bob,\r\n3,Jerry,no data\r\n",
 "1\n(null)\n2\n\n3\nno data\n"]



=== TEST 3: an empty result and a statement answer as without streaming
--- config
location /none { sqldb_pass database; sqldb_stream on; sqldb_query "select id from cats where false"; }
location /upd { sqldb_pass database; sqldb_stream on; sqldb_query "update cats set age = age where id = 1"; }
--- request eval
["GET /none", "POST /upd"]
--- response_body eval
[GatewayTest::rds_rows([['id', 23]], []), GatewayTest::rds_command(1)]



=== TEST 4: HEAD with streaming: headers only
--- config
location /h { sqldb_pass database; sqldb_stream on; sqldb_query HEAD "select g from generate_series(1, 1000) g"; }
--- request
HEAD /h
--- response_headers
Content-Type: application/x-gateway-dbd-stream



=== TEST 5: an error after rows went out cuts the response short, with a log line counting only the rows that went out (fewer than 50,000)
--- config
location /cut {
    sqldb_pass database;
    sqldb_stream on;
    sqldb_query "select case when g = 50000 then 1 / (g - g) else g end as v from generate_series(1, 100000) g";
}
--- request
GET /cut
--- timeout: 10
--- abort
--- error_log eval
qr/\[error\].*sqldb: the response was cut short after [1-4]?\d{1,4} rows had gone out: ERROR: division by zero \(SQLSTATE 22012\)/



=== TEST 5b: an error before the first batch of rows went out (2,999 rows gathered, under 16 KiB) still gets its own status, and the location's error_page; the log has the error, not a cut-short line
--- config
location /early {
    sqldb_pass database;
    sqldb_stream on;
    sqldb_output text;
    sqldb_query "select 1 / (3000 - g) from generate_series(1, 5000) g";
}
location /early_ep {
    sqldb_pass database;
    sqldb_stream on;
    sqldb_output text;
    sqldb_query "select 1 / (3000 - g) from generate_series(1, 5000) g";
    error_page 500 = /fallback;
}
location /fallback { return 200 "fallback"; }
--- request eval
["GET /early", "GET /early_ep", "HEAD /early"]
--- error_code eval
[500, 200, 500]
--- response_body_like eval
[qr/500 Internal Server Error/, qr/^fallback\z/, qr/^\z/]
--- error_log
division by zero (SQLSTATE 22012)
--- no_error_log
cut short



=== TEST 6: what needs the whole result does not stream (sqldb_set, value)
--- config
location /v {
    sqldb_pass database;
    sqldb_stream on;
    sqldb_output value;
    sqldb_query "select name from cats where id = 1";
}
--- request
GET /v
--- response_headers
Content-Length: 3
--- response_body chomp
Tom



=== TEST 7: the last rows fill a whole batch: the response still ends (an empty last buffer is not a "zero size buf") (text, csv, an empty text stream), then the next request on the connection
--- config
location /t { sqldb_pass database; sqldb_stream on; sqldb_output text; sqldb_query "select repeat('x', 20000)"; }
location /c { sqldb_pass database; sqldb_stream on; sqldb_output csv; sqldb_query "select repeat('y', 20000) as v"; }
location /e { sqldb_pass database; sqldb_stream on; sqldb_output text; sqldb_query "select g from generate_series(1, 0) g"; }
--- request eval
["GET /t", "GET /c", "GET /e", "GET /t"]
--- response_body eval
["x" x 20000 . "\n", "v\r\n" . ("y" x 20000) . "\r\n", "", "x" x 20000 . "\n"]
--- no_error_log
zero size buf
[alert]
