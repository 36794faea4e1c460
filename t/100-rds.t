# The RDS stream in full: columns, rows, NULL, empty strings, empty results,
# statements without rows, RETURNING, PostgreSQL types, large results.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: several columns and rows, NULL and empty string kept apart
--- config
location /cats {
    sqldb_pass database;
    sqldb_query "select id, name, notes from cats order by id";
}
--- request
GET /cats
--- response_body eval
GatewayTest::rds_rows([['id', 23], ['name', 25], ['notes', 25]],
    [[1, 'Tom', undef], [2, 'Bob', ''], [3, 'Jerry', 'no data']])



=== TEST 2: empty result set: columns, then only the terminator
--- config
location /none {
    sqldb_pass database;
    sqldb_query "select id, name from cats where false";
}
--- request
GET /none
--- response_body eval
GatewayTest::rds_rows([['id', 23], ['name', 25]], [])



=== TEST 3: UPDATE: driver errcode 1, rows affected, no columns, no row list
--- config
location /update {
    sqldb_pass database;
    sqldb_query "update cats set age = age where age is not null";
}
--- request
POST /update
--- response_body eval
GatewayTest::rds_command(2)



=== TEST 4: INSERT and DELETE in one query: the last statement's count
--- config
location /insdel {
    sqldb_pass database;
    sqldb_query "insert into kv values ('a', '1'), ('b', '2'), ('c', '3'); delete from kv";
}
--- request
POST /insdel
--- response_body eval
GatewayTest::rds_command(3)



=== TEST 5: INSERT ... RETURNING gives rows and the insert count
--- config
location /returning {
    sqldb_pass database;
    sqldb_query "insert into kv values ('r1', 'x'), ('r2', null) returning k, v";
}
--- request
POST /returning
--- response_body eval
GatewayTest::rds_rows([['k', 25], ['v', 25]], [['r1', 'x'], ['r2', undef]], affected => 2)



=== TEST 6: a DDL statement (no count in its tag)
--- config
location /ddl {
    sqldb_pass database;
    sqldb_query "create temporary table t (a int)";
}
--- request
POST /ddl
--- response_body eval
GatewayTest::rds_command(0)



=== TEST 7: PostgreSQL types map to RDS std types; driver type is the OID
--- config
location /types {
    sqldb_pass database;
    sqldb_query "select 1::int8 as a, 2::int4 as b, 3::int2 as c, true as d, 1.5::float8 as e, 2.5::float4 as f, 3.25::numeric as g, 'x'::varchar as h, 'y'::char as i, 'z'::name as j, '2020-01-02'::date as k, '10:11:12'::time as l, '10:11:12+02'::timetz as m, '2020-01-02 03:04:05'::timestamp as n, '1 day'::interval as o, '\x00ff'::bytea as p, B'101'::bit(3) as q, B'11'::varbit as r, '<a/>'::xml as s, '{}'::jsonb as t";
}
--- request
GET /types
--- response_body eval
GatewayTest::rds_rows([['a', 20], ['b', 23], ['c', 21], ['d', 16], ['e', 701], ['f', 700], ['g', 1700],
    ['h', 1043], ['i', 1042], ['j', 19], ['k', 1082], ['l', 1083], ['m', 1266], ['n', 1114], ['o', 1186],
    ['p', 17], ['q', 1560], ['r', 1562], ['s', 142], ['t', 3802]],
    [[1, 2, 3, 't', '1.5', '2.5', '3.25', 'x', 'y', 'z', '2020-01-02', '10:11:12', '10:11:12+02',
      '2020-01-02 03:04:05', '1 day', '\x00ff', '101', '11', '<a/>', '{}']])



=== TEST 8: timestamp with time zone
--- config
location /tz {
    sqldb_pass database;
    sqldb_query "set time zone 'UTC'; select '2020-01-02 03:04:05+00'::timestamptz as ts";
}
--- request
GET /tz
--- response_body eval
GatewayTest::rds_rows([['ts', 1184]], [['2020-01-02 03:04:05+00']])



=== TEST 9: newlines, quotes, backslashes and UTF-8 come back as they are
--- config
location /text {
    sqldb_pass database;
    sqldb_query "select E'line1\\nline2' as t, 'it''s \\ here' as q, convert_from('\\xc3a9'::bytea, 'UTF8') as u";
}
--- request
GET /text
--- response_body eval
GatewayTest::rds_rows([['t', 25], ['q', 25], ['u', 25]], [["line1\nline2", "it's \\ here", "\xc3\xa9"]])



=== TEST 10: 100,000 rows: no fixed buffer limits the result
--- config
location /big {
    sqldb_pass database;
    sqldb_query "select g as id, 'item ' || g as label from generate_series(1, 100000) g";
}
--- request
GET /big
--- response_body eval
GatewayTest::rds_rows([['id', 23], ['label', 25]], [map { [$_, "item $_"] } 1 .. 100000])
--- timeout: 30



=== TEST 11: zero columns (select without a target list): no row list, as for statements
--- config
location /nocols {
    sqldb_pass database;
    sqldb_query "select from generate_series(1, 3)";
}
--- request
GET /nocols
--- response_body eval
GatewayTest::rds_rows([], [])



=== TEST 12: a query with variables from the request
--- config
location /item {
    sqldb_pass database;
    sqldb_query "select label from items where id = $arg_id";
}
--- request
GET /item?id=4242
--- response_body eval
GatewayTest::rds_rows([['label', 25]], [['item 4242']])
