# Large values with cache_auth: RESET after a GET made Redis close the
# connection while megabytes of the value were still queued (it is then
# unauthenticated), cutting values short or answering 502. An
# authenticated GET's connection is closed after its value instead of
# being reset and kept; stores and deletes are reset as before. Found by
# outside testing.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(periodic_bytes http_request nginx_start stop_nginx nginx_error_log start_redis redis_cli);
use IO::Socket::INET;
use Test::More;

my $redis = start_redis(password => 'pw x');
my $port = nginx_start(<<"HTTP", workers => 2);
upstream r { server 127.0.0.1:$redis->{port}; keepalive 8; }
server {
    listen 127.0.0.1:\$PORT;
    client_max_body_size 20m;
    location /a/ { set \$cache_key \$uri; cache_auth "pw x"; cache_pass r; }
    location /n/ { set \$cache_key \$uri; cache_pass r; }
}
HTTP

my $value = periodic_bytes(10 * 1024 * 1024, 256, sub { ($_[0] * 7919) % 256 }, 1);
my ($st) = http_request($port, 'PUT', '/a/big', $value);
is($st, 201, 'PUT of 10 MiB with cache_auth');

# Six GETs at once, each on its own connection.
my @s = map {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
    binmode $s;
    print $s "GET /a/big HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    $s;
} 1 .. 6;
my @got = map {
    my $s = $_;
    local $/;
    my $resp = <$s> // '';
    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($code) = ($head // '') =~ m{^HTTP/\S+ (\d+)};
    [$code // 0, length($body // ''), ($body // '') eq $value];
} @s;
is_deeply([map { "$_->[0] $_->[1]" } @got], [("200 " . length $value) x 6], 'six GETs at once: each the whole 10 MiB');
is(scalar(grep { $_->[2] } @got), 6, 'byte for byte');

# The authenticated connections are not kept: a request without
# cache_auth on the same upstream is refused by Redis, never served
# on a connection left authenticated.
($st) = http_request($port, 'GET', '/n/big');
is($st, 502, 'no cache_auth afterwards: NOAUTH (502), no connection left authenticated');
like(nginx_error_log(), qr/PING was refused: NOAUTH/, 'Redis said NOAUTH');
# Stores and deletes still reset and keep their connection.
($st) = http_request($port, 'PUT', '/a/small', 'x');
is($st, 201, 'a small PUT');
($st) = http_request($port, 'DELETE', '/a/small');
is($st, 204, 'DELETE');
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal|prematurely closed/, 'no value cut short, no alert');
stop_nginx();

done_testing();
