# The pool grows only when it pays: sqldb_keepalive max is a ceiling, and
# requests are pipelined onto open connections while their queues are
# shorter than sqldb_pipeline's depth= and the query in front of them has
# run less than slow=. A request is never pipelined behind a query that has
# run longer than that, nor behind a query whose template ran long lately,
# nor behind the first run of a template (how long it runs is not known).
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql stretch pg_sessions);
use Test::More;
use Time::HiRes qw(sleep time);

my $server = GatewayTest::pg_server_line('adaptive');
# -- depth: 32 requests at once, 4 per connection: 8 connections of 32 allowed.
my $port = nginx_start(<<"HTTP");
upstream deep4 {
    sqldb_server $server;
    sqldb_keepalive max=32;
    sqldb_pipeline on depth=4 slow=30s;
}
upstream slow50 {
    sqldb_server $server;
    sqldb_pipeline on slow=50ms;
}
upstream fresh50 {
    sqldb_server $server;
    sqldb_pipeline on slow=50ms;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_result_timeout 30s;
    sqldb_output value;
    location /deep { sqldb_pass deep4; sqldb_query "select pg_sleep(0.3)::text || 'deep'"; }
    location /long { sqldb_pass slow50; sqldb_query "select pg_sleep(\$arg_s::float8)::text || 'long'"; }
    location /learn { sqldb_pass slow50; sqldb_query "select pg_sleep(1.5)::text || 'learn'"; }
    location /fast { sqldb_pass slow50; sqldb_query "select 'fast'"; }
    location /first { sqldb_pass fresh50; sqldb_query "select pg_sleep(1.5)::text || 'first'"; }
    location /fast2 { sqldb_pass fresh50; sqldb_query "select 'fast'"; }
}
HTTP

# (The template's first run shows it is not long: then it is pipelined.)
my ($s0, $b0) = http_get($port, '/deep');
is("$s0 $b0", '200 deep', 'a first request of the template, alone');
my @socks = map { http_send($port, '/deep') } 1 .. 32;
my $most = 0;
my $deadline = time + stretch(1);
while (time < $deadline) {
    my $n = pg_sessions('adaptive');
    $most = $n if $n > $most;
    sleep 0.05;
}
my $ok = grep { my ($s, $b) = http_read($_, 30); ($s // 0) == 200 && ($b // '') eq 'deep' } @socks;
is($ok, 32, 'all 32 requests answered');
is($most, 8, '32 requests at once open 8 connections with depth=4, not the 32 allowed');
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'adaptive'");
sleep 0.3;

# -- slow=50ms: a query running for 2 s holds its connection alone; fast
# requests that come after go elsewhere and do not wait for it.
my $long = http_send($port, '/long?s=4');
sleep 0.3;
my $t0 = time;
my $fast_ok = 0;
for (1 .. 20) {
    my ($s, $b) = http_get($port, '/fast');
    $fast_ok++ if ($s // 0) == 200 && ($b // '') eq 'fast';
}
my $took = time - $t0;
my ($ls, $lb) = http_read($long, 30);
is($fast_ok, 20, '20 fast requests answered while a long query ran');
cmp_ok($took, '<', stretch(3), sprintf('they did not wait for the long query (%.3f s for 20)', $took));
is("$ls $lb", '200 long', 'the long query answered');

# -- A template that ran long once runs alone afterwards: fast requests sent
# right behind it (before it has run long this time) are not pipelined
# behind it.
my ($s1, $b1) = http_get($port, '/learn');
is("$s1 $b1", '200 learn', 'a long query ran (and taught the pool)');
my $learn = http_send($port, '/learn');
sleep 0.005;
$t0 = time;
my @fast = map { http_send($port, '/fast') } 1 .. 4;
my $fast_done = grep { my ($s, $b) = http_read($_, 30); ($s // 0) == 200 && ($b // '') eq 'fast' } @fast;
$took = time - $t0;
is($fast_done, 4, 'fast requests sent right after it answered');
cmp_ok($took, '<', stretch(1.2), sprintf('and did not wait behind it (%.3f s)', $took));
my ($s2, $b2) = http_read($learn, 30);
is("$s2 $b2", '200 learn', 'the long query answered again');

# -- The first run of a template nobody has timed yet: a fast request sent
# right behind it (well within slow=) is not pipelined behind it. (Its
# upstream has one connection, idle: the first run takes it.)
my ($s5, $b5) = http_get($port, '/fast2');
is("$s5 $b5", '200 fast', 'one connection of its own upstream');
my $first = http_send($port, '/first');
sleep 0.005;
$t0 = time;
my ($s3, $b3) = http_read(http_send($port, '/fast2'), 30);
$took = time - $t0;
is("$s3 $b3", '200 fast', 'a fast request right behind a template never run before');
cmp_ok($took, '<', stretch(1), sprintf('did not wait behind it (%.3f s, it runs 1.5 s)', $took));
my ($s4, $b4) = http_read($first, 30);
is("$s4 $b4", '200 first', 'the first run answered');

unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]/, 'no alert');
stop_nginx();
done_testing();
