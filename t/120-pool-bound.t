# sqldb_keepalive max bounds the connections of a worker with pipelining on,
# whatever the requests: streams and queries of several statements (which
# need a connection alone) wait their turn on a busy connection instead of
# opening more; plain queries keep pipelining. Every request is answered.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read psql pg_sessions stretch);
use Test::More;
use Time::HiRes qw(sleep time);

my $server = GatewayTest::pg_server_line('bound');

my $port = nginx_start(<<"HTTP");
upstream database {
    sqldb_server $server;
    sqldb_keepalive max=2;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_result_timeout 30s;
    location /stream {
        sqldb_pass database;
        sqldb_stream on;
        sqldb_output csv;
        sqldb_query "select g, pg_sleep(0.1)::text as s from generate_series(1, 2) g";
    }
    location /several { sqldb_pass database; sqldb_output value; sqldb_query "select pg_sleep(0.1); select 'two'"; }
    location /plain { sqldb_pass database; sqldb_output value; sqldb_query "select pg_sleep(0.05)::text || 'plain'"; }
}
HTTP

my @paths = ((map { '/stream' } 1 .. 6), (map { '/several' } 1 .. 4), (map { '/plain' } 1 .. 6));
my @socks = map { [$_, http_send($port, $_)] } @paths;
# Watch the server side while they run.
my $most = 0;
my $deadline = time + stretch(3);
while (time < $deadline) {
    my $n = pg_sessions('bound');
    $most = $n if $n > $most;
    sleep 0.05;
}
my %want = ('/stream' => "g,s\r\n1,\r\n2,\r\n", '/several' => 'two', '/plain' => 'plain');
my $answered = 0;
for my $s (@socks) {
    my ($path, $sock) = @$s;
    my ($status, $body) = http_read($sock, 30);
    $body //= '';
    # Streamed bodies are chunked: take the chunk data out.
    if ($path eq '/stream') {
        my $data = '';
        while ($body =~ s/^([0-9a-fA-F]+)\r\n//) {
            my $len = hex $1;
            last if $len == 0;
            $data .= substr($body, 0, $len, '');
            $body =~ s/^\r\n//;
        }
        $body = $data;
    }
    $answered++ if ($status // 0) == 200 && $body eq $want{$path};
    is($status, 200, "$path answered") or diag($body);
}
is($answered, scalar @paths, 'every request got its whole answer');
ok($most <= 2, "at most 2 connections at the server (saw $most)");
cmp_ok($most, '>=', 1, 'the watch saw the connections');
unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]/, 'no alert');

stop_nginx();
done_testing();
