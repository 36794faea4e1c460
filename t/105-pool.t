# The pool over time and under pressure: idle timeout, connections killed
# by the server while idle, overflow=reject, single mode.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql rds rds_rows stretch pg_sessions
    wait_until);
use Test::More;
use Time::HiRes qw(sleep);

# The gateway's sessions once they are $want, or as many as there are
# after 8 s.
sub wait_for {
    my ($want) = @_;
    my $n;
    wait_until(sub { ($n = pg_sessions('ngx_gateway')) == $want }, 8);
    return $n;
}

sub start_idle {
    my ($idle) = @_;
    return nginx_start(<<"HTTP");
upstream database {
    sqldb_server \$TEST_NGINX_PG_SERVER;
    sqldb_keepalive max=4 idle_timeout=$idle;
}
server {
    listen 127.0.0.1:\$PORT;
    location /echo { sqldb_pass database; sqldb_query "select 'x' as echo"; }
    location /pid { sqldb_pass database; sqldb_query "select pg_backend_pid()::text as pid"; }
    location /suicide { sqldb_pass database; sqldb_query "select pg_terminate_backend(pg_backend_pid())"; }
}
HTTP
}

# 1. Idle connections close after idle_timeout. (Two seconds: time enough
# to see the connection in the pool first, on a busy machine too.)
my $port = start_idle('2s');
my ($status) = http_get($port, '/echo');
is($status, 200, 'request served');
is(pg_sessions('ngx_gateway'), 1, 'its connection stays in the pool');
is(wait_for(0), 0, 'and closes after the idle timeout');

# 2. pg_terminate_backend of the pooled connections: noticed while idle,
# never handed to a request. (A long idle_timeout: on a busy machine a short
# one could close them before the server does.)
stop_nginx();
$port = start_idle('60s');
my ($pooled, $terminated, @s) = (0, 0);
for (1 .. 5) {
    @s = map { http_send($port, '/echo') } 1 .. 3;
    my @got = map { (http_read($_))[0] } @s;
    $pooled = pg_sessions('ngx_gateway');
    $terminated = psql("select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity"
        . " where application_name = 'ngx_gateway'");
    last if $terminated > 0 && "@got" eq '200 200 200';
}
cmp_ok($pooled, '>=', 1, "three concurrent requests served, $pooled connections pooled");
cmp_ok($terminated, '>=', 1, "$terminated pooled connections terminated by the server");
sleep stretch(0.3);
my @codes = map { (http_get($port, '/echo'))[0] } 1 .. 5;
is_deeply(\@codes, [(200) x 5], 'requests after pg_terminate_backend all succeed');
like(nginx_error_log(), qr/sqldb: idle connection to \S+ closed by the server/, 'the closed idle connections were noticed');
unlike(nginx_error_log(), qr/\[error\]/, 'no request saw an error');

# 3. A connection terminated between two requests, with no time for the
# idle handler to run first: the gateway finds it closed before it sends a
# query on it, and takes a fresh one. (pg_terminate_backend waits here until
# the backend is gone; a query sent in the instant before the server closes
# is never sent again, and gets 502.)
my ($st, $body) = http_get($port, '/pid');
my ($pid) = $body =~ /(\d+)\x00$/;
psql("select pg_terminate_backend($pid, 5000)");
($st) = http_get($port, '/echo');
is($st, 200, 'request right after the kill succeeds') or diag(nginx_error_log());

# 3b. A query that ends its own session: the connection dies under it
# without an answer; a query that was sent is never sent again: 502, no
# hang, no loop.
($st) = http_get($port, '/suicide', 5);
is($st, 502, 'a query that kills its own backend: 502');
# Whether the server's FATAL message or the end of the connection is read
# first depends on timing: either is a clear reason.
like(nginx_error_log(), qr/\[error\].*sqldb: connection lost: (FATAL: terminating connection due to administrator command \(SQLSTATE 57P01\)|server closed the connection unexpectedly) while.*GET \/suicide/,
    'the reason is logged');
($st) = http_get($port, '/echo');
is($st, 200, 'and the next request is served');
stop_nginx();

# 4. overflow=reject without pipelining: 503 when every connection is busy.
# (The slow query and the wait for it to start are stretched under valgrind.)
my $slow_s = stretch(0.8);
$port = nginx_start(<<"HTTP");
upstream database {
    sqldb_server \$TEST_NGINX_PG_SERVER;
    sqldb_keepalive max=1 overflow=reject;
    sqldb_pipeline off;
}
server {
    listen 127.0.0.1:\$PORT;
    location /slow { sqldb_pass database; sqldb_query "select pg_sleep($slow_s)::text as s"; }
    location /echo { sqldb_pass database; sqldb_query "select 'x' as echo"; }
}
HTTP
my $slow = http_send($port, '/slow');
sleep stretch(0.2);
($st) = http_get($port, '/echo');
is($st, 503, 'second request while the only connection is busy: 503');
like(nginx_error_log(), qr/sqldb: all 1 connections to upstream "database" are busy/, 'logged');
is((http_read($slow))[0], 200, 'the busy one completes');
($st) = http_get($port, '/echo');
is($st, 200, 'then the connection serves again');
stop_nginx();

# 5. overflow=ignore (default) without pipelining: more connections than max
# when needed, only max kept.
$port = nginx_start(<<'HTTP');
upstream database {
    sqldb_server $TEST_NGINX_PG_SERVER;
    sqldb_keepalive max=2;
    sqldb_pipeline off;
}
server {
    listen 127.0.0.1:$PORT;
    location /slow { sqldb_pass database; sqldb_query "select pg_sleep(0.3)::text as s"; }
}
HTTP
@s = map { http_send($port, '/slow') } 1 .. 5;
is_deeply([map { (http_read($_))[0] } @s], [(200) x 5], 'five concurrent requests over a pool of two');
is(wait_for(2), 2, 'two connections stay pooled');
stop_nginx();

# 6. mode=single: any idle connection serves, whichever server it goes to.
$port = nginx_start(<<'HTTP');
upstream database {
    sqldb_server $TEST_NGINX_PG_SERVER;
    sqldb_server unix:$TEST_NGINX_PG_SOCKET_DIR port=$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER "password=$TEST_NGINX_PG_PASSWORD";
    sqldb_keepalive max=2 mode=single;
}
server {
    listen 127.0.0.1:$PORT;
    location /echo { sqldb_pass database; sqldb_query "select 'x' as echo"; add_header X-Addr $upstream_addr; }
}
HTTP
@codes = map { (http_get($port, '/echo'))[0] } 1 .. 6;
is_deeply(\@codes, [(200) x 6], 'six sequential requests');
is(pg_sessions('ngx_gateway'), 1, 'served by one pooled connection although round robin alternates');
stop_nginx();

unlike(nginx_error_log(), qr/\[alert\]|exited on signal/, 'no alert, no crash');
done_testing();
