# The request body in templates: $request_body (in memory or from nginx's
# temporary file), bound as a typed parameter.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: POST JSON into a row with json_populate_record
--- config
location /cats {
    sqldb_pass database;
    sqldb_output json;
    sqldb_query POST "insert into cats select * from json_populate_record(null::cats, $request_body::json) returning id, name, age";
}
--- more_headers
Content-Type: application/json
--- request
POST /cats
{"id": 100, "name": "Nova \"the\" cat", "age": 2}
--- error_code: 200
--- response_body chomp
[{"id":100,"name":"Nova \"the\" cat","age":2}]



=== TEST 2: a body nginx wrote to a temporary file is read back
--- config
client_body_buffer_size 1k;
location /len {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query POST "select length($request_body::text)::text";
}
--- request eval
"POST /len\n" . ("x" x 100000)
--- response_body chomp
100000



=== TEST 3: malformed JSON in the body: 400
--- config
location /cats {
    sqldb_pass database;
    sqldb_query POST "select * from json_populate_record(null::cats, $request_body::json)";
}
--- request
POST /cats
{"id": 1, oops
--- error_code: 400
--- error_log
sqldb: a parameter was rejected



=== TEST 4: a body over client_max_body_size: 413
--- config
location /len {
    client_max_body_size 1k;
    sqldb_pass database;
    sqldb_query POST "select length($request_body::text)";
}
--- request eval
"POST /len\n" . ("x" x 5000)
--- error_code: 413



=== TEST 5: a GET without a body still works (nothing to read)
--- config
location /g {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select coalesce(nullif($request_body::text, ''), 'empty')";
}
--- request
GET /g
--- response_body chomp
empty



=== TEST 6: a NUL byte in a typed parameter (the body): 400, nothing runs
--- config
location /nul {
    sqldb_pass database;
    sqldb_query POST "insert into kv values ('nul', $request_body::text)";
}
--- request eval
"POST /nul\nbefore\x00after"
--- error_code: 400
--- error_log
sqldb: parameter $1 contains a NUL byte



=== TEST 7: quotes, semicolons and comments in the body stay data
--- config
location /inj {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query POST "select $request_body::text || ' / ' || (select count(*) from items)::text";
}
--- request eval
"POST /inj
'); delete from items; -- /* x */ \\'"
--- response_body eval
"'); delete from items; -- /* x */ \\' / 10000"
