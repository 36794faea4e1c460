# The cache gateway on nginx's upstream machinery: keepalive connections
# really reused (Redis's own counters), hash over three servers, expiry,
# a value of 10 MiB streamed both ways.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(periodic_bytes nginx_start stop_nginx nginx_error_log http_send_request http_read start_redis redis_cli redis_connections);
use Test::More;
use Time::HiRes qw(sleep);

my @r = map { start_redis() } 1 .. 3;

# (status, body) of one request, read for up to 30 s.
sub request { my ($port, $method, $path, $body) = @_; http_read(http_send_request($port, $method, $path, $body), 30) }

my $port = nginx_start(<<"HTTP");
upstream one { server 127.0.0.1:$r[0]{port}; keepalive 4; }
upstream nokeep { server 127.0.0.1:$r[0]{port}; }
upstream three {
    hash \$cache_key consistent;
    server 127.0.0.1:$r[0]{port};
    server 127.0.0.1:$r[1]{port};
    server 127.0.0.1:$r[2]{port};
    keepalive 8;
}
server {
    listen 127.0.0.1:\$PORT;
    client_max_body_size 20m;
    location /k/ { set \$cache_key \$uri; set \$cache_exptime \$arg_ttl; cache_pass one; }
    location /n/ { set \$cache_key \$uri; cache_pipeline off; cache_pass nokeep; }
    location /p/ { set \$cache_key \$uri; cache_pass nokeep; }
    location /h/ { set \$cache_key \$uri; cache_pass three; }
}
HTTP

# 1. keepalive: twenty requests, one connection (Redis counts them).
my $before = redis_connections($r[0]);
my @codes = map { (request($port, 'GET', "/k/miss$_"))[0] } 1 .. 20;
is_deeply(\@codes, [(404) x 20], 'twenty misses');
# (redis-cli INFO counts as a connection itself.)
is(redis_connections($r[0]) - $before - 1, 1, "over one reused connection");
$before = redis_connections($r[0]);
@codes = map { (request($port, 'GET', "/n/miss$_"))[0] } 1 .. 5;
is(redis_connections($r[0]) - $before - 1, 5, "cache_pipeline off, without keepalive: a connection each");
# Pipelined (the default), the worker's connection to the server is
# shared whatever the upstream's keepalive line says.
$before = redis_connections($r[0]);
@codes = map { (request($port, 'GET', "/p/miss$_"))[0] } 1 .. 5;
is_deeply(\@codes, [(404) x 5], 'five misses, pipelined');
is(redis_connections($r[0]) - $before - 1, 0, "on the connection already open to that server");

# 2. hash $cache_key consistent over three servers.
for my $i (1 .. 60) {
    my ($st) = request($port, 'PUT', "/h/key$i", "value $i");
    die "PUT failed: $st" unless $st == 201;
}
my @sizes = map { redis_cli($_, 'DBSIZE') } @r;
is($sizes[0] + $sizes[1] + $sizes[2], 60, 'sixty keys stored');
ok((grep { $_ > 5 } @sizes) == 3, "spread over the three servers (@sizes)");
my $all = 1;
for my $i (1 .. 60) {
    my ($st, $body) = request($port, 'GET', "/h/key$i");
    $all &&= $st == 200 && $body eq "value $i";
}
ok($all, 'each key is read back from the server it went to');

# 3. $cache_exptime sets the expiry (seconds).
is((request($port, 'PUT', '/k/ttl?ttl=100', 'lives'))[0], 201, 'stored with an expiry');
my $ttl = redis_cli($r[0], 'TTL', '/k/ttl');
ok($ttl > 90 && $ttl <= 100, "Redis has its TTL ($ttl)");
is((request($port, 'PUT', '/k/short?ttl=1', 'brief'))[0], 201, 'stored for one second');
sleep 1.6;
is((request($port, 'GET', '/k/short'))[0], 404, 'gone after it expired');
is(redis_cli($r[0], 'TTL', '/k/forever'), -2, 'no key yet');
request($port, 'PUT', '/k/forever', 'x');
is(redis_cli($r[0], 'TTL', '/k/forever'), -1, 'without $cache_exptime: no expiry');

# 4. 10 MiB of every byte value, in and out.
my $big = periodic_bytes(10 * 1024 * 1024, 256, sub { $_[0] % 256 });
is((request($port, 'PUT', '/k/big', $big))[0], 201, '10 MiB stored') or diag(nginx_error_log());
is(redis_cli($r[0], 'STRLEN', '/k/big'), length $big, 'Redis holds all of it');
my ($st, $body) = request($port, 'GET', '/k/big');
is($st, 200, '10 MiB read');
ok($body eq $big, 'byte for byte') or diag('got ' . length($body) . ' bytes');
# And then the connection is still good for the next request.
($st, $body) = request($port, 'GET', '/k/ttl');
is($body, 'lives', 'the next request on the kept connection is fine');

unlike(nginx_error_log(), qr/\[alert\]|\[crit\]|exited on signal|\[error\]|uninitialized/, 'no error, no crash, no uninitialized-variable noise');
stop_nginx();
done_testing();
