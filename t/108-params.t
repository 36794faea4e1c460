# Typed parameters: $var::type is bound, never spliced into the SQL text.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: an integer parameter from the query string
--- config
location /item {
    sqldb_pass database;
    sqldb_query "select id, label from items where id = $arg_id::int";
}
--- request
GET /item?id=42
--- response_body eval
GatewayTest::rds_rows([['id', 23], ['label', 25]], [[42, 'item 42']])



=== TEST 2: a value that is not an integer: 400, not 500
--- config
location /item {
    sqldb_pass database;
    sqldb_query "select id, label from items where id = $arg_id::int";
}
--- request
GET /item?id=1%20or%201=1
--- error_code: 400
--- error_log
sqldb: a parameter was rejected: ERROR: invalid input syntax for type integer: "1%20or%201=1" (SQLSTATE 22P02)
--- no_error_log
[error]



=== TEST 2b: a misspelt argument is an empty value: 400, and the info line names the parameter
--- config
location /item {
    sqldb_pass database;
    sqldb_query "select id, label from items where id = $arg_idd::int and label <> $arg_l::text";
}
--- request
GET /item?id=42
--- error_code: 400
--- error_log eval
qr/\[info\] .*sqldb: a parameter was rejected: ERROR: invalid input syntax for type integer: "" \(SQLSTATE 22P02\); empty: \$arg_idd::int, \$arg_l::text while/
--- no_error_log
[error]



=== TEST 3: injection through a text parameter stays data
--- config
location /name {
    sqldb_pass database;
    sqldb_query "select $arg_n::text as n, length($arg_n::text) as len";
}
--- request
GET /name?n=x');drop%20table%20items;--
--- response_body eval
GatewayTest::rds_rows([['n', 25], ['len', 23]], [["x');drop%20table%20items;--", 27]])



=== TEST 4: quotes, backslashes, semicolons and comments in a text parameter
--- config
location /echo {
    sqldb_pass database;
    sqldb_query "select ${http_x_value}::text as v, (select count(*) from items)::int as still_there";
}
--- more_headers
X-Value: it's \ a ; -- /* test */ $$ quote
--- request
GET /echo
--- response_body eval
GatewayTest::rds_rows([['v', 25], ['still_there', 23]], [["it's \\ a ; -- /* test */ \$\$ quote", 10000]])



=== TEST 5: invalid UTF-8 in a parameter: 400
--- config
location /echo {
    sqldb_pass database;
    sqldb_query "select $http_x_value::text as v";
}
--- more_headers eval
"X-Value: \xff\xfe"
--- request
GET /echo
--- error_code: 400
--- error_log
SQLSTATE 22021



=== TEST 6: several parameters, of several types, and an untyped variable beside them
--- config
location /mix {
    sqldb_pass database;
    sqldb_query "select $arg_a::int + $arg_b::int as sum, $arg_d::date as d, '$arg_c' as c";
}
--- request
GET /mix?a=2&b=40&d=2024-02-29&c=plain
--- response_body eval
GatewayTest::rds_rows([['sum', 23], ['d', 1082], ['c', 25]], [[42, '2024-02-29', 'plain']])



=== TEST 7: a constant template with parameters is prepared once per connection
--- config
location /item {
    sqldb_pass database;
    sqldb_query "select label from items where id = $arg_id::int";
}
location /count {
    sqldb_pass database;
    sqldb_query "select count(*)::int as n from pg_prepared_statements where name like 'ngx\_gateway\_%'";
}
--- request eval
["GET /item?id=1", "GET /item?id=2", "GET /item?id=3", "GET /count"]
--- response_body eval
[GatewayTest::rds_rows([['label', 25]], [['item 1']]), GatewayTest::rds_rows([['label', 25]], [['item 2']]),
 GatewayTest::rds_rows([['label', 25]], [['item 3']]), GatewayTest::rds_rows([['n', 23]], [[2]])]



=== TEST 8: a missing variable is an empty value (here: not an integer, 400)
--- config
location /item {
    sqldb_pass database;
    sqldb_query "select label from items where id = $arg_id::int";
}
--- request
GET /item
--- error_code: 400



=== TEST 9: typed parameters with several statements are refused by nginx -t
--- config
location /x {
    sqldb_pass database;
    sqldb_query "select 1; select $arg_a::int";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_query" directive: typed parameters need a query of one statement in \S+nginx\.conf:\d+/



=== TEST 10: the ${name}::type form, and a regex capture
--- config
location ~ ^/cap/(\d+)$ {
    sqldb_pass database;
    sqldb_query "select label from items where id = $1::int and ${arg_x}::text = ''";
}
--- request
GET /cap/7
--- response_body eval
GatewayTest::rds_rows([['label', 25]], [['item 7']])



=== TEST 11: a value past a limit of the server (program limit exceeded, 54000): the client's mistake, 400 at info
--- config
location /r {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select length(repeat('x', $arg_n::int))::text";
}
--- request eval
["GET /r?n=3", "GET /r?n=2000000000", "GET /r?n=4"]
--- error_code eval
[200, 400, 200]
--- response_body_like eval
["^3\$", "400 Bad Request", "^4\$"]
--- error_log eval
qr/\[info\].*sqldb: a parameter was rejected: .*SQLSTATE 54000/



=== TEST 12: invalid UTF-8 through sqldb_escape (a variable in the SQL text): 400 at info
--- config
location /e {
    sqldb_pass database;
    sqldb_escape $v $http_x_value;
    sqldb_output value;
    sqldb_query "select $v";
}
--- more_headers eval
"X-Value: \xff\xfe"
--- request
GET /e
--- error_code: 400
--- error_log eval
qr/\[info\].*SQLSTATE 22021/



=== TEST 13: a session switched to an unsafe client_encoding (a SET in a template) is never used again: the next request goes out on a fresh connection
--- http_config
upstream db1 { sqldb_server $TEST_NGINX_PG_SERVER; sqldb_keepalive max=1; }
--- config
location /sjis { sqldb_pass db1; sqldb_output value; sqldb_query "select set_config('client_encoding', 'SJIS', false)"; }
location /e { sqldb_pass db1; sqldb_escape $v $arg_v; sqldb_output value; sqldb_query "select $v || current_setting('client_encoding')"; }
--- request eval
["GET /sjis", "GET /e?v=x", "GET /e?v=y"]
--- error_code eval
[200, 200, 200]
--- response_body eval
["SJIS", "xUTF8", "yUTF8"]
--- error_log eval
qr/\[error\].*sqldb: idle connection to \S+: the session's client_encoding is SJIS, in which quoting values byte by byte is unsafe/



=== TEST 14: a row count the server refuses (LIMIT -1: 2201W, OFFSET -1: 2201X) from a typed parameter: the client's mistake, 400 at info
--- config
location /l {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select count(*)::text from (select g from generate_series(1, 5) g limit $arg_n::int offset $arg_o::int) s";
}
--- request eval
["GET /l?n=2&o=0", "GET /l?n=-1&o=0", "GET /l?n=2&o=-1", "GET /l?n=9&o=1"]
--- error_code eval
[200, 400, 400, 200]
--- response_body_like eval
["^2\$", "400 Bad Request", "400 Bad Request", "^4\$"]
--- error_log eval
[qr/\[info\].*sqldb: a parameter was rejected: .*SQLSTATE 2201W/, qr/\[info\].*sqldb: a parameter was rejected: .*SQLSTATE 2201X/]



=== TEST 15: control bytes a server's message quotes from the client (ESC, BEL) are written as \xNN: one line of plain text in the error log
--- config
location /i {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select $http_x_id::int";
}
--- more_headers eval
"X-Id: 1\x1b[31mRED\x07"
--- request
GET /i
--- error_code: 400
--- error_log eval
qr/\[info\].*sqldb: a parameter was rejected: ERROR: invalid input syntax for type integer: "1\\x1b\[31mRED\\x07" \(SQLSTATE 22P02\)/
--- no_error_log eval
[qr/sqldb:.*[\x1b\x07]/]



=== TEST 16: a server's message past 1.5 KB is cut with "...", and nginx's own part of the line (client, request) still follows it
--- config
location /i {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select $arg_id::int";
}
--- request eval
"GET /i?id=" . ("x" x 3000)
--- error_code: 400
--- error_log eval
qr/\[info\].*sqldb: a parameter was rejected: ERROR: invalid input syntax for type integer: "x{1000,}\.\.\. while [^\n]*client: 127\.0\.0\.1/
