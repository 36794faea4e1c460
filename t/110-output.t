# sqldb_output: text, value, binary_value, json, csv, none.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: json: typed values, NULL, embedded json, escaping
--- config
location /j {
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "select id, name, notes, indoor, weight, '{\"a\": [1, 2]}'::jsonb as doc from cats where id <= 2 order by id";
}
--- request
GET /j
--- response_headers
Content-Type: application/json
--- response_body chomp
[{"id":1,"name":"Tom","notes":null,"indoor":true,"weight":4.5,"doc":{"a": [1, 2]}},{"id":2,"name":"Bob","notes":"","indoor":false,"weight":5.25,"doc":{"a": [1, 2]}}]



=== TEST 2: json: an empty result is [], a statement gives the affected count
--- config
location /none {
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "select id from cats where false";
}
location /upd {
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "update cats set age = age where age is not null";
}
--- request eval
["GET /none", "POST /upd"]
--- response_body eval
["[]", '{"affected":2}']



=== TEST 3: json: strings with quotes, backslashes, control characters
--- config
location /s {
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "select E'a\"b\\\\c\\td\\x01' as s";
}
--- request
GET /s
--- response_body chomp
[{"s":"a\"b\\c\td\u0001"}]



=== TEST 4: text: every cell on its own line, NULL as (null)
--- config
location /t {
    sqldb_pass database;
    sqldb_output text;
    sqldb_query "select id, notes from cats order by id";
}
--- request
GET /t
--- response_headers
Content-Type: text/plain
--- response_body
1
(null)
2

3
no data



=== TEST 5: csv with a header line (RFC 4180)
--- config
location /c {
    sqldb_pass database;
    sqldb_output csv;
    sqldb_query "select id, name, 'a,b \"c\"' as odd, notes from cats where id <= 2 order by id";
}
--- request
GET /c
--- response_headers
Content-Type: text/csv
--- response_body eval
"id,name,odd,notes\r\n1,Tom,\"a,b \"\"c\"\"\",\r\n2,Bob,\"a,b \"\"c\"\"\",\r\n"



=== TEST 6: value: one cell, raw, with default_type
--- config
default_type application/x-raw;
location /v {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select name from cats where id = $arg_id::int";
}
--- request
GET /v?id=3
--- response_headers
Content-Type: application/x-raw
--- response_body chomp
Jerry



=== TEST 7: value: more than one row is an error that says how many
--- config
location /v {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select name from cats";
}
--- request
GET /v
--- error_code: 500
--- error_log
sqldb: "sqldb_output value" needs one value, the query returned 3 rows of 1 columns



=== TEST 8: value: NULL and the empty string are errors
--- config
location /v {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select notes from cats where id = 1";
}
location /empty {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select ''::text as nothing";
}
--- request eval
["GET /v", "GET /empty"]
--- error_code eval
[500, 500]
--- error_log
sqldb: "sqldb_output value" got NULL
sqldb: "sqldb_output value" got an empty value



=== TEST 9: binary_value: PostgreSQL's binary format (int4 42, big endian)
--- config
location /b {
    sqldb_pass database;
    sqldb_output binary_value;
    sqldb_query "select 42::int4";
}
--- request
GET /b
--- response_body eval
"\x00\x00\x00\x2a"



=== TEST 10: none: the status only
--- config
location /n {
    sqldb_pass database;
    sqldb_output none;
    sqldb_query "select 1";
}
--- request
GET /n
--- response_headers
Content-Length: 0
--- response_body chomp



=== TEST 11: an invalid sqldb_output
--- config
location /x {
    sqldb_pass database;
    sqldb_output xml;
    sqldb_query "select 1";
}
--- must_die
--- error_log eval
qr/\[emerg\].*invalid value "xml" in "sqldb_output" directive, it must be rds, text, value, binary_value, json, csv or none in \S+nginx\.conf:\d+/
