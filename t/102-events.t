# The worker never waits for PostgreSQL: a slow query in flight does not
# delay other requests on the same (single) worker, and a client that goes
# away early does not leave a database connection behind.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql rds stretch under_valgrind);
use Test::More;
use Time::HiRes qw(time sleep);

my $port = nginx_start(<<'HTTP', workers => 1);
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
server {
    listen 127.0.0.1:$PORT;
    location /slow { sqldb_pass database; sqldb_query "select pg_sleep($arg_s)::text as slept, 'slow' as tag"; }
    location /fast { sqldb_pass database; sqldb_query "select 'fast' as echo"; }
}
HTTP

# 1. A 3 s query in flight; fast requests on the same worker answer at once
# (the bounds leave room for a busy machine, and are far below what waiting
# behind the slow query would take).
my $t0 = time;
my $slow = http_send($port, '/slow?s=3');
sleep 0.1;
my @lat;
for (1 .. 10) {
    my $t = time;
    my ($status, $body) = http_get($port, '/fast');
    push @lat, time - $t;
    is($status, 200, "fast request $_ answered");
    is($body, rds('echo', 'fast'), "fast request $_ body");
}
my $worst = (sort { $b <=> $a } @lat)[0];
SKIP: {
    skip 'latency bounds: under valgrind every request is tens of times slower', 2 if under_valgrind();
    cmp_ok($worst, '<', stretch(1.5), sprintf('fast requests did not wait for the slow one (worst %.3f s)', $worst));
    cmp_ok(time - $t0, '<', stretch(2.9), 'all fast requests were done before the slow query ended');
}
my ($status) = http_read($slow);
is($status, 200, 'the slow request completed too');
cmp_ok(time - $t0, '>=', 2.9, 'the slow request really took its time');

# 2. Many slow requests at once are all in flight together.
$t0 = time;
my @socks = map { http_send($port, '/slow?s=1') } 1 .. 8;
my @codes = map { (http_read($_))[0] } @socks;
is_deeply(\@codes, [(200) x 8], 'eight concurrent slow requests succeeded');
SKIP: {
    skip 'a speed bound: under valgrind opening connections alone takes longer than 2 s', 1 if under_valgrind();
    cmp_ok(time - $t0, '<', stretch(4), sprintf('they ran concurrently (%.2f s for 8 x 1 s)', time - $t0));
}

# 3. A client that closes early: its query is cancelled on the server (the
# connection then goes back to the pool, clean); a query left running would
# show here as active.
sub sleeping_backends {
    psql("select count(*) from pg_stat_activity where application_name = 'ngx_gateway' "
        . "and state = 'active' and query like '%pg_sleep(" . stretch(1) . ")%'");
}
is(sleeping_backends(), 0, 'no backend has run the test query yet');
my $early = http_send($port, '/slow?s=' . stretch(1));
my $running = 0;
for (1 .. stretch(10)) {
    $running = sleeping_backends();
    last if $running;
    sleep 0.03;
}
is($running, 1, 'the slow query holds one connection');
close $early;
my $left = 1;
for (1 .. stretch(40)) {
    $left = sleeping_backends();
    last if $left == 0;
    sleep 0.1;
}
is($left, 0, 'the query of the aborted request no longer runs');
like(nginx_error_log(), qr/client prematurely closed connection|499/, 'nginx noticed the client went away')
    or diag(nginx_error_log());
unlike(nginx_error_log(), qr/\[alert\]|\[crit\]|exited on signal/, 'no alert, no crash');

stop_nginx();
done_testing();
