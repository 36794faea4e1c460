# No head-of-line stall under many slow queries: when long queries hold
# every open connection and the pool may open more (default settings: no
# sqldb_keepalive line), one spare connection is opened ahead of need, so
# that a fast request that comes then neither queues behind a slow query
# nor waits for a connect. The spare counts within sqldb_keepalive max.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql stretch pg_sessions);
use Test::More;
use Time::HiRes qw(sleep time);

plan skip_all => 'its bounds are times, which valgrind stretches' if GatewayTest::under_valgrind();

my $SLOW = 4;
my $spare = GatewayTest::pg_server_line('spare');
my $bound = GatewayTest::pg_server_line('spare8');
my $port = nginx_start(<<"HTTP");
upstream dflt { sqldb_server $spare; }
upstream max8 { sqldb_server $bound; sqldb_keepalive max=8; }
server {
    listen 127.0.0.1:\$PORT;
    sqldb_result_timeout 30s;
    sqldb_output value;
    location /slow { sqldb_pass dflt; sqldb_query "select pg_sleep($SLOW)::text || 'slow'"; }
    location /fast { sqldb_pass dflt; sqldb_query "select 'fast'"; }
    location /slow8 { sqldb_pass max8; sqldb_query "select pg_sleep($SLOW)::text || 'slow'"; }
}
HTTP

# Eight slow queries, one after the other (each on a connection of its own
# once the one before has run past slow=).
sub eight_slow {
    my ($path) = @_;
    my @socks;
    for (1 .. 8) {
        push @socks, http_send($port, $path);
        sleep 0.1;
    }
    return @socks;
}

# The most sessions of `app` seen within `secs` (or until `enough` are).
sub most_sessions {
    my ($app, $secs, $enough) = @_;
    my ($most, $deadline) = (0, time + $secs);
    while (time < $deadline) {
        my $n = pg_sessions($app);
        $most = $n if $n > $most;
        last if $enough && $most >= $enough;
        sleep 0.05;
    }
    return $most;
}

my $t0 = time;
my @slow = eight_slow('/slow');
# (A busy machine takes a while to start a backend: up to 2.5 s, within
# the slow queries' time.)
my $most = most_sessions('spare', 2.5, 9);
cmp_ok(time - $t0, '<', $SLOW, 'the slow queries still run') or diag('the machine is too slow for this test');
is($most, 9, 'eight slow queries hold eight connections: a ninth is opened, ready, before any fast request');

# Fast requests now, four at a time: none waits behind a slow query (the
# slow ones hold their connections for seconds) or for a connect.
my ($fast_ok, $worst) = (0, 0);
for (1 .. 10) {
    my @socks = map { [http_send($port, '/fast'), time] } 1 .. 4;
    for (@socks) {
        my ($s, $b) = http_read($_->[0], 30);
        my $took = time - $_->[1];
        $worst = $took if $took > $worst;
        $fast_ok++ if ($s // 0) == 200 && ($b // '') eq 'fast';
    }
}
is($fast_ok, 40, '40 fast requests answered beside eight slow queries');
cmp_ok($worst, '<', $SLOW / 4, sprintf('none waited for a slow query (the slowest took %.3f s, a slow query %d s)', $worst, $SLOW));
my $before_end = time - $t0 < $SLOW;
my $done = grep { my ($s, $b) = http_read($_, 30); ($s // 0) == 200 && ($b // '') eq 'slow' } @slow;
is($done, 8, 'the eight slow queries answered');
SKIP: {
    skip 'the fast requests ended after the slow ones (a busy machine)', 1 unless $before_end;
    pass('the fast requests were all served while the slow queries ran');
}

# The spare stays within the pool's bound: with sqldb_keepalive max=8,
# eight slow queries hold every connection the pool may open, and no ninth
# is opened.
@slow = eight_slow('/slow8');
$most = most_sessions('spare8', 0.8);
is($most, 8, 'with max=8, no spare past the bound');
$done = grep { my ($s, $b) = http_read($_, 30); ($s // 0) == 200 && ($b // '') eq 'slow' } @slow;
is($done, 8, 'the eight slow queries of max=8 answered');

unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]/, 'no alert');
stop_nginx();
done_testing();
