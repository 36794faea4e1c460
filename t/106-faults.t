# Faults: a database server stopped behind a two-server upstream, a
# restart under load, nginx reload and graceful quit with queries in flight.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql rds
    start_extra_pg pg_stop pg_start pg_restart nginx_signal nginx_exited free_port stretch under_valgrind);
use File::Temp qw(tempdir);
use Test::More;
use Time::HiRes qw(sleep time);

my $extra = start_extra_pg();
my $second = "127.0.0.1:$extra->{port} fail_timeout=1s dbname=gateway_test user=gateway \"password=it's a secret\"";

# 1. Two servers; one stops: no request fails; it comes back: both serve again.
my $port = nginx_start(<<"HTTP");
upstream database {
    sqldb_server 127.0.0.1:\$TEST_NGINX_PG_PORT fail_timeout=1s dbname=gateway_test user=gateway "password=it's a secret";
    sqldb_server $second;
    sqldb_keepalive max=8;
}
server {
    listen 127.0.0.1:\$PORT;
    location /port { sqldb_pass database; sqldb_query "select current_setting('port') as port"; }
}
HTTP
my %seen;
for (1 .. 10) {
    my ($st, $body) = http_get($port, '/port');
    $seen{$1}++ if $st == 200 && $body =~ /(\d+)\x00$/;
}
is(scalar keys %seen, 2, 'both servers serve') or diag(explain \%seen);
pg_stop($extra);
my @codes = map { (http_get($port, '/port'))[0] } 1 .. 20;
is_deeply(\@codes, [(200) x 20], 'with one server stopped, every request succeeds');
pg_start($extra);
# Once fail_timeout (1 s) has passed, the server is tried again.
sleep 1.1;
%seen = ();
my $both = GatewayTest::wait_until(sub {
    my ($st, $body) = http_get($port, '/port');
    $seen{$1}++ if $st == 200 && $body =~ /(\d+)\x00$/;
    keys %seen == 2;
}, 5);
ok($both, 'after it is back and fail_timeout passed, both serve again') or diag(explain \%seen);
stop_nginx();

# 2. The server restarts under load: no worker dies, every request gets
# 200 or 502/503/504 (no hang, no reset), and service resumes within a second.
SKIP: {
skip 'a restart under wrk load: under valgrind nginx serves too few requests in wrk\'s 4 s, and service '
    . 'cannot resume within a second', 8 if under_valgrind();
$port = nginx_start(<<'HTTP', workers => 2);
upstream database {
    sqldb_server $TEST_NGINX_PG_SERVER;
    sqldb_keepalive max=8;
}
server {
    listen 127.0.0.1:$PORT;
    location /echo { sqldb_pass database; sqldb_result_timeout 5s; sqldb_query "select 'x' as echo"; }
}
HTTP
my $dir = tempdir(CLEANUP => 1);
open my $lua, '>', "$dir/count.lua" or die $!;
print $lua <<'LUA';
local counts = {}
function response(status, headers, body)
    counts[status] = (counts[status] or 0) + 1
end
function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("errors connect=%d read=%d write=%d timeout=%d status=%d\n",
        e.connect, e.read, e.write, e.timeout, e.status))
end
LUA
close $lua;
# wrk runs its response() in its own Lua state per thread; count statuses
# from the access log instead, and socket errors from wrk's summary.
my $wrk_out = "$dir/wrk.out";
my $wrk = fork;
if (!$wrk) {
    open STDOUT, '>', $wrk_out;
    exec 'wrk', '-t1', '-c16', '-d4s', '-s', "$dir/count.lua", "http://127.0.0.1:$port/echo";
    exit 127;
}
sleep 1.5;
pg_restart();
my $back = time;
waitpid($wrk, 0);
my $summary = do { local $/; open my $f, '<', $wrk_out; <$f> };
like($summary, qr/errors connect=0 read=0 write=0 timeout=0/, 'no connection was reset or hung') or diag($summary);
my ($requests) = $summary =~ /(\d+) requests in/;
cmp_ok($requests // 0, '>', 1000, "wrk completed $requests requests");
my $log = do { local $/; open my $f, '<', "$GatewayTest::NginxRoot/logs/access.log"; <$f> };
my %status;
$status{$1}++ while $log =~ /" (\d{3}) /g;
# wrk closes its 16 connections at the end of its run, requests in flight
# or not: nginx logs those as 499 (client closed request).
my $closed_by_wrk = delete $status{499} // 0;
cmp_ok($closed_by_wrk, '<=', 16, "at most one 499 per wrk connection ($closed_by_wrk)");
my @bad = grep { !/^(200|502|503|504)$/ } keys %status;
is_deeply(\@bad, [], 'every response was 200, 502, 503 or 504') or diag(explain \%status);
cmp_ok($status{200} // 0, '>', 0, "and there were successes ($status{200} of them)");

# Service resumes within a second of the server being back.
pg_restart();
my $t0 = time;
my $ok_at;
while (time - $t0 < stretch(6)) {
    my ($st) = http_get($port, '/echo');
    if ($st == 200) { $ok_at = time; last }
    sleep 0.02;
}
# (About 1 s when the machine is quiet; a busy one gets room.)
ok(defined $ok_at && $ok_at - $t0 < stretch(2.5), sprintf('service resumed %.3f s after the restart', ($ok_at // 99) - $t0));
my @after = map { (http_get($port, '/echo'))[0] } 1 .. 20;
is_deeply(\@after, [(200) x 20], 'and every request after it succeeds');
unlike(nginx_error_log(), qr/exited on signal|\[alert\]/, 'no worker died');
stop_nginx();
}

# 3. Reload (HUP) and graceful quit with queries in flight lose none of them.
# (Under valgrind the queries and the waits are stretched, so that the
# requests are in flight, not still in the listen queue, at the signal.)
my $slow_s = stretch(1);
$port = nginx_start(<<"HTTP", workers => 1);
upstream database { sqldb_server \$TEST_NGINX_PG_SERVER; }
server {
    listen 127.0.0.1:\$PORT;
    location /slow { sqldb_pass database; sqldb_query "select pg_sleep($slow_s)::text as s, 'done' as tag"; }
    location /echo { sqldb_pass database; sqldb_query "select 'x' as echo"; }
}
HTTP
my @inflight = map { http_send($port, '/slow') } 1 .. 4;
sleep stretch(0.3);
nginx_signal('HUP');
sleep stretch(0.3);
my ($st) = http_get($port, '/echo');
is($st, 200, 'new requests are served after the reload');
is_deeply([map { (http_read($_))[0] } @inflight], [(200) x 4], 'queries in flight during the reload all completed');

@inflight = map { http_send($port, '/slow') } 1 .. 4;
sleep stretch(0.3);
nginx_signal('QUIT');
is_deeply([map { (http_read($_))[0] } @inflight], [(200) x 4], 'queries in flight during a graceful quit all completed');
my $gone = 0;
for (1 .. stretch(50)) { if (nginx_exited()) { $gone = 1; last } sleep 0.1 }
ok($gone, 'nginx then exited');
unlike(nginx_error_log(), qr/exited on signal|\[alert\]/, 'no worker died');

done_testing();
