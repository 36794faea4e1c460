# The keepalive pool and prepared statements, seen from the session: a
# temporary sequence lives as long as its connection, so nextval() tells
# whether a request got the same connection as the one before.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

sub seq { GatewayTest::rds_rows([['nextval', 20]], [[$_[0]]]) }

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: the pool is on by default: consecutive requests share a connection
--- config
location /seq {
    sqldb_pass database;
    sqldb_query "create temp sequence if not exists s; select nextval('s')";
}
--- request eval
["GET /seq", "GET /seq", "GET /seq"]
--- response_body eval
[main::seq(1), main::seq(2), main::seq(3)]



=== TEST 2: sqldb_keepalive off: a connection per request
--- keepalive: sqldb_keepalive off;
--- config
location /seq {
    sqldb_pass database;
    sqldb_query "create temp sequence if not exists s; select nextval('s')";
}
--- request eval
["GET /seq", "GET /seq"]
--- response_body eval
[main::seq(1), main::seq(1)]



=== TEST 3: a failed query does not cost a reconnect
--- config
location /seq {
    sqldb_pass database;
    sqldb_query "create temp sequence if not exists s; select nextval('s')";
}
location /bad {
    sqldb_pass database;
    sqldb_query "select * from no_such_table";
}
--- request eval
["GET /seq", "GET /bad", "GET /seq"]
--- error_code eval
[200, 500, 200]
--- response_body eval
[main::seq(1), undef, main::seq(2)]



=== TEST 4: a connection left inside a transaction is not reused
--- config
location /begin {
    sqldb_pass database;
    sqldb_query "begin; create temp sequence if not exists s; select nextval('s')";
}
location /seq {
    sqldb_pass database;
    sqldb_query "create temp sequence if not exists s; select nextval('s')";
}
--- request eval
["GET /begin", "GET /seq"]
--- response_body eval
[main::seq(1), main::seq(1)]



=== TEST 5: requests=N closes a connection after N requests
--- keepalive: sqldb_keepalive max=4 requests=2;
--- config
location /seq {
    sqldb_pass database;
    sqldb_query "create temp sequence if not exists s; select nextval('s')";
}
--- request eval
["GET /seq", "GET /seq", "GET /seq", "GET /seq"]
--- response_body eval
[main::seq(1), main::seq(2), main::seq(1), main::seq(2)]



=== TEST 6: constant templates are prepared once per connection, under our names
--- config
location /a {
    sqldb_pass database;
    sqldb_query "select 'a' as v";
}
location /count {
    sqldb_pass database;
    sqldb_query "select count(*)::int as n from pg_prepared_statements where name like 'ngx\_gateway\_%'";
}
--- request eval
["GET /a", "GET /a", "GET /count", "GET /count"]
--- response_body eval
[GatewayTest::rds('v', 'a'), GatewayTest::rds('v', 'a'),
 GatewayTest::rds_rows([['n', 23]], [[2]]), GatewayTest::rds_rows([['n', 23]], [[2]])]



=== TEST 7: sqldb_prepare off: nothing is prepared
--- config
sqldb_prepare off;
location /a {
    sqldb_pass database;
    sqldb_query "select 'a' as v";
}
location /count {
    sqldb_pass database;
    sqldb_query "select count(*)::int as n from pg_prepared_statements";
}
--- request eval
["GET /a", "GET /count"]
--- response_body eval
[GatewayTest::rds('v', 'a'), GatewayTest::rds_rows([['n', 23]], [[0]])]



=== TEST 8: statements deallocated behind our back are prepared again, without an error
--- config
location /a {
    sqldb_pass database;
    sqldb_query "select 'a' as v";
}
location /dealloc {
    sqldb_pass database;
    sqldb_query "deallocate all";
}
--- request eval
["GET /a", "GET /dealloc", "GET /a", "GET /dealloc", "GET /a"]
--- error_code eval
[200, 200, 200, 200, 200]
--- response_body eval
[GatewayTest::rds('v', 'a'), GatewayTest::rds_command(0), GatewayTest::rds('v', 'a'), GatewayTest::rds_command(0), GatewayTest::rds('v', 'a')]
--- no_error_log
[error]



=== TEST 9: a template with variables that holds several statements runs through the simple protocol
--- config
location /two {
    sqldb_pass database;
    sqldb_query "select '$arg_a' as a; select '$arg_b' as b";
}
--- request
GET /two?a=x&b=y
--- response_body eval
GatewayTest::rds('b', 'y')



=== TEST 10: a variable template of one statement runs as the unnamed statement (nothing stays prepared)
--- config
location /one {
    sqldb_pass database;
    sqldb_query "select '$arg_a' as a";
}
location /count {
    sqldb_pass database;
    sqldb_prepare off;
    sqldb_query "select count(*)::int as n from pg_prepared_statements";
}
--- request eval
["GET /one?a=1", "GET /one?a=2", "GET /count"]
--- response_body eval
[GatewayTest::rds('a', '1'), GatewayTest::rds('a', '2'), GatewayTest::rds_rows([['n', 23]], [[0]])]



=== TEST 11: invalid sqldb_keepalive parameters
--- keepalive: sqldb_keepalive max=-1;
--- config
--- must_die
--- error_log eval
qr/\[emerg\].*invalid parameter "max=-1" in "sqldb_keepalive" directive, it must be off, or max=N with mode=single\|multi, overflow=ignore\|reject, idle_timeout=time, requests=N in \S+nginx\.conf:\d+/



=== TEST 12: invalid sqldb_next_upstream value
--- config
sqldb_next_upstream error http_500;
--- must_die
--- error_log eval
qr/\[emerg\].*invalid value "http_500" in "sqldb_next_upstream" directive/
