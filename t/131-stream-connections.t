# Who can hold the pool: streams hold at most sqldb_stream_connections of
# their upstream's connections in a worker (by default half of
# sqldb_keepalive max), so that slow readers of a streamed location cannot
# starve the other requests of the upstream. With one worker and the default
# pool (max=10), 50 clients that read a little of a large stream and then
# stall hold 5 connections; a plain location on the same upstream is served
# (200) within its timeout, several times in a row; a stream past the bound
# waits its turn (and goes out when a stream ends), or gets 503 with
# overflow=reject; a stream read fully gets all its rows.
use strict;
use warnings;
use lib 't/lib';
use HttpClient qw(unchunk);
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql wait_until stretch pg_sessions);
use Socket qw(PF_INET SOCK_STREAM SOL_SOCKET SO_RCVBUF pack_sockaddr_in inet_aton);
use IO::Handle;
use Test::More;
use Time::HiRes qw(sleep time);

my $app = 'streambound';
my $server = GatewayTest::pg_server_line($app);
my $plain_timeout = 5;

# Each row is about 1 KB: 100,000 rows are 100 MB, far more than the
# socket buffers between the backend and a client that stalls.
my $rows = q{select g, repeat('x', 1000) as pad from generate_series(1, $arg_n::int) g};
my $port = nginx_start(<<"HTTP", workers => 1);
upstream database { sqldb_server $server; }
upstream nopipe {
    sqldb_server $server;
    sqldb_pipeline off;
}
upstream rejecting {
    sqldb_server $server;
    sqldb_keepalive max=2 overflow=reject;
}
server {
    listen 127.0.0.1:\$PORT;
    location /stream { sqldb_pass database; sqldb_stream on; sqldb_output csv; sqldb_query "$rows"; }
    location /stream1 {
        sqldb_pass database;
        sqldb_stream on;
        sqldb_stream_connections 1;
        sqldb_output csv;
        sqldb_query "$rows";
    }
    location /plain {
        sqldb_pass database;
        sqldb_result_timeout ${plain_timeout}s;
        sqldb_output value;
        sqldb_query "select 'plain'";
    }
    location /nopipe/stream {
        sqldb_pass nopipe;
        sqldb_stream on;
        sqldb_stream_connections 1;
        sqldb_output csv;
        sqldb_query "$rows";
    }
    location /reject/stream { sqldb_pass rejecting; sqldb_stream on; sqldb_output csv; sqldb_query "$rows"; }
    location /reject/plain { sqldb_pass rejecting; sqldb_output value; sqldb_query "select 'plain'"; }
}
HTTP

# A client with a small receive buffer that sends its request, reads at
# most a little of the answer, and then stops reading (it stays connected).
sub slow_reader {
    my ($path) = @_;
    socket(my $s, PF_INET, SOCK_STREAM, 0) or die "socket: $!";
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, 4096) or die "setsockopt: $!";
    connect($s, pack_sockaddr_in($port, inet_aton('127.0.0.1'))) or die "connect: $!";
    $s->autoflush(1);
    print $s "GET $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    return $s;
}

# Reads what has arrived, up to $max bytes, waiting at most $wait seconds.
sub read_some {
    my ($s, $max, $wait) = @_;
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    return '' unless select(my $rout = $rin, undef, undef, $wait) > 0;
    sysread($s, my $buf, $max);
    return $buf // '';
}

# The gateway's sessions that run a stream's query now.
sub streaming { psql("select count(*) from pg_stat_activity where application_name = '$app' and state = 'active' and query like '%repeat%'") + 0 }

# Plain requests, one after another: each one's status and time.
sub plain_in_a_row {
    my ($path, $n) = @_;
    my @got;
    for (1 .. $n) {
        my $t0 = time;
        my ($st, $body) = http_get($port, $path, $plain_timeout + 5);
        push @got, [$st // 0, $body // '', time - $t0];
    }
    return @got;
}

# 50 slow readers on the streamed location.
my @slow = map { slow_reader('/stream?n=100000') } 1 .. 50;
read_some($_, 1024, 0.05) for @slow;
ok(wait_until(sub { streaming() >= 5 }, 10), 'the slow readers\' streams run');
# Give the other 45 time to find a connection, if they could.
sleep 0.5;
is(streaming(), 5, 'streams hold 5 connections: half of the default max=10');

my @plain = plain_in_a_row('/plain', 6);
is_deeply([map { "$_->[0] $_->[1]" } @plain], [('200 plain') x 6], 'a plain location on the same upstream: 200, six times in a row');
my ($slowest) = sort { $b <=> $a } map { $_->[2] } @plain;
cmp_ok($slowest, '<', stretch($plain_timeout), sprintf('each well within its timeout (slowest %.2f s)', $slowest));
cmp_ok(pg_sessions($app), '<=', 10, 'the pool stays within max=10 at the server');
is(streaming(), 5, 'the streams still hold 5 (the waiting ones took none)');

# The clients leave: their queries are cancelled, the connections come back.
close $_ for @slow;
ok(wait_until(sub { streaming() == 0 }, 15), 'the slow readers left: no stream runs');

# A stream read fully gets all its rows.
my ($st, $body) = http_get($port, '/stream?n=2000', 30);
my @lines = split /\r\n/, unchunk($body // '');
is($st, 200, 'a stream read fully: 200');
is(scalar @lines, 2001, 'with all its rows (and the header line)');
is($lines[-1], '2000,' . ('x' x 1000), 'the last one whole');

# Past its bound a stream waits its turn, and goes out when a stream ends:
# one slow reader holds the one connection the location allows, the next
# stream (read fully) waits; the slow reader leaves, the waiting stream
# completes. (With pipelining off too.)
my $holder;
for my $path ('/stream1', '/nopipe/stream') {
    ok(wait_until(sub { streaming() == 0 }, 15), "$path: nothing streams");
    $holder = slow_reader("$path?n=100000");
    read_some($holder, 1024, 0.05);
    ok(wait_until(sub { streaming() == 1 }, 10), "$path: sqldb_stream_connections 1: one stream holds a connection");
    my $waiting = http_send($port, "$path?n=500");
    sleep 0.3;    # (time to take a second connection, if it could)
    is(streaming(), 1, "$path: the next stream waits (no second connection)");
    is_deeply([map { "$_->[0] $_->[1]" } plain_in_a_row('/plain', 2)], [('200 plain') x 2], 'plain requests meanwhile: 200');
    close $holder;
    ($st, $body) = http_read($waiting, 30);
    is($st, 200, "$path: the stream that waited: 200 once the first left");
    @lines = split /\r\n/, unchunk($body // '');
    is(scalar @lines, 501, "$path: with all its rows");
}

# overflow=reject: a stream past its bound (half of max=2: 1) gets 503.
ok(wait_until(sub { streaming() == 0 }, 15), 'nothing streams');
$holder = slow_reader('/reject/stream?n=100000');
read_some($holder, 1024, 0.05);
ok(wait_until(sub { streaming() == 1 }, 10), 'overflow=reject: one stream holds a connection');
($st) = http_get($port, '/reject/stream?n=10');
is($st, 503, 'overflow=reject: the next stream gets 503');
is_deeply([map { "$_->[0] $_->[1]" } plain_in_a_row('/reject/plain', 3)], [('200 plain') x 3], 'plain requests on that upstream: 200')
    or diag(join "\n", grep { /sqldb|503/ } split /\n/, nginx_error_log());
close $holder;
ok(wait_until(sub { streaming() == 0 }, 15), 'the holder left');
($st, $body) = http_get($port, '/reject/stream?n=10', 30);
is($st, 200, 'then a stream is served');

unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]/, 'no alert');
stop_nginx();
done_testing();
