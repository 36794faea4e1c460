# Pipelining: when every pooled connection is busy, requests queue onto
# them (libpq pipeline mode) and each gets its own result, in order; an
# error stays with its request; a client that leaves does not disturb the
# others.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql rds rds_rows stretch);
use Test::More;
use Time::HiRes qw(sleep);

sub twice { rds_rows([['twice', 23]], [[2 * $_[0]]]) }

my $port = nginx_start(<<'HTTP');
upstream database {
    sqldb_server $TEST_NGINX_PG_SERVER;
    sqldb_keepalive max=1;
    sqldb_pipeline on;
}
server {
    listen 127.0.0.1:$PORT;
    location /i { sqldb_pass database; sqldb_query "select '$arg_i'::int * 2 as twice"; }
    location /const { sqldb_pass database; sqldb_query "select 'constant' as c"; }
    location /bad { sqldb_pass database; sqldb_query "select 1 / ('$arg_i'::int - '$arg_i'::int) as boom"; }
    location /slow { sqldb_pass database; sqldb_query "select pg_sleep(0.5)::text as s, '$arg_i' as i"; }
    location /two { sqldb_pass database; sqldb_query "select 1 as a; select '$arg_i' as b"; }
    location /count { sqldb_pass database; sqldb_query "select count(*)::int as n from pg_stat_activity where application_name = 'ngx_gateway'"; }
}
HTTP


# 0. At start-up, requests queue on the connection being opened instead of
# each opening one of their own.
my @first = map { [$_, http_send($port, "/i?i=$_")] } 1 .. 20;
my $first_ok = 1;
for my $s (@first) {
    my ($i, $sock) = @$s;
    my ($st, $body) = http_read($sock);
    $first_ok &&= $st == 200 && $body eq twice($i);
}
ok($first_ok, '20 requests at start-up each got their own result');
my ($st0, $body0) = http_get($port, '/count');
is($body0, rds_rows([['n', 23]], [[1]]), 'from the one connection opened for them');

# 1. Many at once over one connection, each with its own result.
my @socks = map { [$_, http_send($port, "/i?i=$_")] } 1 .. 40;
my $all_right = 1;
for my $s (@socks) {
    my ($i, $sock) = @$s;
    my ($st, $body) = http_read($sock);
    $all_right &&= ($st == 200 && $body eq twice($i));
}
ok($all_right, '40 concurrent requests each got their own result');
my ($st, $body) = http_get($port, '/count');
is($body, rds_rows([['n', 23]], [[1]]), 'over one database connection');

# 2. A failing query in the pipeline affects only its own request.
@socks = map { my $bad = $_ % 3 == 0; [$_, $bad, http_send($port, ($bad ? '/bad' : '/i') . "?i=$_")] } 1 .. 30;
my ($good_ok, $bad_ok) = (1, 1);
for my $s (@socks) {
    my ($i, $bad, $sock) = @$s;
    my ($st, $body) = http_read($sock);
    if ($bad) { $bad_ok &&= $st == 500 } else { $good_ok &&= ($st == 200 && $body eq twice($i)) }
}
ok($bad_ok, 'the failing requests got 500');
ok($good_ok, 'every other request in the same pipeline got its own result');
like(nginx_error_log(), qr/division by zero/, 'the error is logged');

# 3. Prepared and unnamed statements mix in one pipeline.
@socks = map { [$_, http_send($port, $_ % 2 ? "/i?i=$_" : '/const')] } 1 .. 20;
my $mixed = 1;
for my $s (@socks) {
    my ($i, $sock) = @$s;
    my ($st, $body) = http_read($sock);
    $mixed &&= $st == 200 && $body eq ($i % 2 ? twice($i) : rds('c', 'constant'));
}
ok($mixed, 'prepared and unnamed statements interleave');

# 4. A client that leaves: the others behind it still get their results.
my $gone = http_send($port, '/slow?i=gone');
sleep stretch(0.1);
@socks = map { [$_, http_send($port, "/i?i=$_")] } 1 .. 5;
close $gone;
my $rest = 1;
for my $s (@socks) {
    my ($i, $sock) = @$s;
    my ($st, $body) = http_read($sock);
    $rest &&= $st == 200 && $body eq twice($i);
}
ok($rest, 'requests queued behind an abandoned one complete');

# 5. Several statements need a connection of their own; they still work
# while pipelined requests run.
@socks = map { [$_, http_send($port, $_ % 2 ? "/two?i=$_" : "/i?i=$_")] } 1 .. 10;
my $both = 1;
for my $s (@socks) {
    my ($i, $sock) = @$s;
    my ($st, $body) = http_read($sock);
    $both &&= $st == 200 && $body eq ($i % 2 ? rds('b', $i) : twice($i));
}
ok($both, 'simple-protocol and pipelined requests side by side');

# 6. With pipelining off, requests beyond the pool open their own connections.
# (The queries and the wait for them are stretched under valgrind.)
stop_nginx();
my $slow_s = stretch(0.5);
$port = nginx_start(<<"HTTP");
upstream database {
    sqldb_server \$TEST_NGINX_PG_SERVER;
    sqldb_keepalive max=1;
    sqldb_pipeline off;
}
server {
    listen 127.0.0.1:\$PORT;
    location /slow { sqldb_pass database; sqldb_query "select pg_sleep($slow_s)::text as s"; }
    location /count { sqldb_pass database; sqldb_query "select count(*)::int as n from pg_stat_activity where application_name = 'ngx_gateway' and state = 'active' and query = 'select pg_sleep($slow_s)::text as s'"; }
}
HTTP
@socks = map { http_send($port, '/slow') } 1 .. 3;
sleep stretch(0.25);
($st, $body) = http_get($port, '/count');
is($body, rds_rows([['n', 23]], [[3]]), 'three slow queries on three connections')
    or diag(psql("select pid, state, backend_start, query_start, query from pg_stat_activity where application_name = 'ngx_gateway'"));
is_deeply([map { (http_read($_))[0] } @socks], [200, 200, 200], 'all complete');

unlike(nginx_error_log(), qr/\[alert\]|exited on signal/, 'no alert, no crash');
stop_nginx();
done_testing();
