# Cancels that are never lost. PostgreSQL drops a cancel request that
# reaches a backend before its query started (or between two of its
# messages); the gateway sends another while the query still runs, after a
# pause that doubles from 100 ms up to 1 s. And a connection closed while a
# query of a request that is gone still runs on it (no cancel request
# landed within the drain's 5 s) has its backend ended from a session of
# its own (pg_terminate_backend), so that no query runs on unseen.
#
# The races are made to happen on purpose, every run, with the build with
# fault injection (make fault): NGX_GATEWAY_HOLD_QUERY=<text> holds a query
# whose text has <text> back (not sent) until the first cancel request for
# it is through, so that it reaches an idle backend, which drops it;
# NGX_GATEWAY_LOSE_CANCELS=1 sends every cancel request with a key the
# server does not know, so that it drops them all.
use strict;
use warnings;
use lib 't/lib';

BEGIN {
    if (!$ENV{TEST_NGINX_FAULT_MODULE} || !-f $ENV{TEST_NGINX_FAULT_MODULE}) {
        require Test::More;
        Test::More::plan(skip_all => 'the fault-injection build is made for Debian\'s nginx only (make fault)');
    }
    $ENV{TEST_NGINX_LOAD_MODULES} = $ENV{TEST_NGINX_FAULT_MODULE};
}

use GatewayTest qw(wait_until nginx_start stop_nginx nginx_error_log http_send http_read http_get psql stretch);
use Test::More;
use Time::HiRes qw(sleep time);

my $server = GatewayTest::pg_server_line('race');

sub start {
    my ($fault) = @_;
    return nginx_start(<<"HTTP", main => "env $fault;\n");
upstream database {
    sqldb_server $server;
    sqldb_keepalive max=1;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_result_timeout 30s;
    location /held { sqldb_pass database; sqldb_output value; sqldb_query "select pg_sleep(20)::text /* held */"; }
    location /held-short {
        sqldb_pass database;
        sqldb_result_timeout 300ms;
        sqldb_output value;
        sqldb_query "select pg_sleep(21)::text /* held */";
    }
    location /sleep { sqldb_pass database; sqldb_output value; sqldb_query "select pg_sleep(20)::text"; }
    location /echo { sqldb_pass database; sqldb_output value; sqldb_query "select 'echo'"; }
}
HTTP
}

# The one backend of the gateway's pool (it has max=1).
sub backend {
    return psql("select pid from pg_stat_activity where application_name = 'race'");
}

# What that backend does now: "<state>|<query>" (empty once it is gone).
sub doing {
    my ($pid) = @_;
    return psql("select state || '|' || query from pg_stat_activity where pid = $pid");
}

# 1. A client that leaves: the first cancel request reaches the backend
# before the query (held back until it is through) and is dropped; the
# next one, 100 ms later, ends the query.
my $port = start('NGX_GATEWAY_HOLD_QUERY=held');
is((http_get($port, '/echo'))[1], 'echo', 'warm');
my $pid = backend();
like($pid, qr/^\d+$/, "one backend ($pid)");
my $s = http_send($port, '/held');
sleep stretch(0.3);
is(doing($pid), "idle|select 'echo'", 'the query is held back: the server has not seen it');
my $mark = length nginx_error_log();
close $s;
my $t0 = time;
ok(wait_until(sub { doing($pid) =~ /^idle\|select pg_sleep\(20\)/ }, 1),
    sprintf('the abandoned query reached the server and ended within 1 s (%.2f s)', time - $t0));
my $log = substr(nginx_error_log(), $mark);
like($log, qr/sqldb: cancelling the query of a request that is gone on \S+ \(backend $pid\)/, 'a first cancel request');
like($log, qr/sqldb: the query of a request that is gone still runs on \S+ \(backend $pid\): cancel request 2 sent/,
    'it was dropped: a second one was sent');
is((http_get($port, '/echo'))[1], 'echo', 'the next request is served');
is(doing($pid), "idle|select 'echo'", 'on the same pooled connection');
unlike(nginx_error_log(), qr/did not end within|\[alert\]/, 'the connection was never closed on the query');

# 2. The same race after sqldb_result_timeout: 504, and the query ends.
$mark = length nginx_error_log();
$t0 = time;
my ($st) = http_get($port, '/held-short');
is($st, 504, 'a result timeout: 504');
ok(wait_until(sub { doing($pid) =~ /^idle\|select pg_sleep\(21\)/ }, 1),
    sprintf('the timed-out query reached the server and ended within 1 s of the timeout (%.2f s in all)', time - $t0));
like(substr(nginx_error_log(), $mark), qr/cancel request 2 sent/, 'after a second cancel request');
is((http_get($port, '/echo'))[1], 'echo', 'the next request is served');
is(doing($pid), "idle|select 'echo'", 'on the same pooled connection');

# 3. Every cancel request dropped: cancel requests go on, with growing
# pauses, for the drain's 5 s; then the connection closes, and its backend,
# still running the query, is ended from a session of the gateway's own.
stop_nginx();
$port = start('NGX_GATEWAY_LOSE_CANCELS=1');
is((http_get($port, '/echo'))[1], 'echo', 'warm');
$pid = backend();
$s = http_send($port, '/sleep');
ok(wait_until(sub { doing($pid) =~ /^active\|select pg_sleep/ }, 5), 'the query runs');
$mark = length nginx_error_log();
close $s;
$t0 = time;
sleep 2;    # (not stretched: the drain's 5 s are not either)
like(doing($pid), qr/^active\|select pg_sleep/, 'its cancel requests are dropped: it runs on');
ok(wait_until(sub { doing($pid) eq '' }, 8),
    sprintf('its backend is gone once the drain time is over (%.2f s)', time - $t0));
cmp_ok(time - $t0, '>', 4.5, 'not before the drain time');
$log = substr(nginx_error_log(), $mark);
like($log, qr/cancel request 5 sent/, 'cancel requests went on, again and again');
like($log, qr/\[warn\].*sqldb: queries of requests that are gone did not end within 5000 ms on \S+ \(backend $pid\)/,
    'the drain time is over');
like($log, qr/\[info\].*sqldb: ending backend $pid on \S+: it still runs a query of a request that is gone/,
    'the log says the backend is ended');
# (The line comes with the reply of pg_terminate_backend, which may follow
# the backend's leaving pg_stat_activity by a moment on a busy machine.)
ok(wait_until(sub { substr(nginx_error_log(), $mark) =~ /\[info\].*sqldb: backend $pid on \S+ was ended \(pg_terminate_backend\)/ }, stretch(5)),
    'and that it was') or diag(substr(nginx_error_log(), $mark));
is((http_get($port, '/echo'))[1], 'echo', 'the next request is served (on a new connection)');
unlike(nginx_error_log(), qr/\[alert\]|could not be ended/, 'no trouble');
stop_nginx();

done_testing();
