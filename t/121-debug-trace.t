# Debug traces in nginx's style: with `error_log ... debug` on a
# --with-debug build (make vendored builds one), the life of a database
# connection, the pool's decisions and the routing of results are in the
# log. Skipped on a build without debug logging.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket;

my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
if (`$bin -V 2>&1` !~ /--with-debug/) {
    plan(skip_all => "$bin is not built --with-debug");
} else {
    plan('no_plan');
}

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: a connection's life, the pool's picks and the results routed
--- config
location /q { sqldb_pass database; sqldb_output value; sqldb_query "select 'one'"; }
--- request eval
["GET /q", "GET /q"]
--- response_body eval
["one", "one"]
--- error_log eval
[qr/\[debug\].*sqldb: connection #\d+ opened/,
 qr/\[debug\].*sqldb: a step of connection #\d+'s connect runs on a thread/,
 qr/\[debug\].*sqldb: connection #\d+ to \S+ is up \(backend \d+\)/,
 qr/\[debug\].*sqldb: pool picks idle connection #\d+/,
 qr/\[debug\].*sqldb: connection #\d+: Final routed: Result\(/,
 qr/\[debug\].*sqldb: connection #\d+: Sync routed: Drop/]
