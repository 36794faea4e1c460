# The cache gateway on nginx's upstream machinery: keepalive connections
# really reused (Redis's own counters), hash over three servers, expiry,
# a value of 10 MiB streamed both ways; error replies are answers, not
# failures of the server (max_fails), and a replica that answers READONLY
# is passed over without being marked failed, so that it serves once it
# is promoted.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(periodic_bytes nginx_start stop_nginx nginx_error_log http_send_request http_read start_redis redis_cli redis_connections
    kill_redis wait_until);
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

# 5. An error reply (WRONGTYPE: a GET of a hash) is Redis's answer, not a
# failure of the server: with two healthy servers and nginx's default
# max_fails=1, two such GETs disable neither, with either cache_pipeline;
# the next requests are served (a miss: 404), not "no live upstreams".
for my $r (@r[0, 1]) {
    redis_cli($r, 'HSET', $_, 'f', 'v') for '/w/hash', '/wn/hash';
}
$port = nginx_start(<<"HTTP");
upstream pair {
    server 127.0.0.1:$r[0]{port};
    server 127.0.0.1:$r[1]{port};
}
server {
    listen 127.0.0.1:\$PORT;
    location /w/ { set \$cache_key \$uri; cache_pass pair; }
    location /wn/ { set \$cache_key \$uri; cache_pipeline off; cache_pass pair; }
}
HTTP
for my $loc ('/w/', '/wn/') {
    my @st = map { (request($port, 'GET', "${loc}hash"))[0] } 1 .. 2;
    is_deeply(\@st, [502, 502], "$loc: two GETs of a hash: 502 (WRONGTYPE)");
    @st = map { (request($port, 'GET', "${loc}miss$_"))[0] } 1 .. 4;
    is_deeply(\@st, [(404) x 4], "$loc: then both servers still serve (404 for a miss, not 502)");
}
like(nginx_error_log(), qr/\[error\].*WRONGTYPE/, "Redis's words are in the error log");
unlike(nginx_error_log(), qr/temporarily disabled|no live upstreams/, 'no server was disabled');
stop_nginx();

# 6. Failover to a promoted backup: the primary is killed (-9), its
# replica, the backup, answers writes with READONLY until it is promoted
# (REPLICAOF NO ONE). READONLY passes the request on without marking the
# replica failed: reads are served by it meanwhile, and reads and writes
# succeed as soon as it is a master, not after fail_timeout.
{
    my $primary = start_redis();
    my $replica = start_redis(args => ['--replicaof', '127.0.0.1', $primary->{port}]);
    ok(wait_until(sub { redis_cli($replica, 'INFO', 'replication') =~ /master_link_status:up/ }, 10),
        'the replica follows the primary');
    $port = nginx_start(<<"HTTP");
upstream failover {
    server 127.0.0.1:$primary->{port};
    server 127.0.0.1:$replica->{port} backup;
}
server {
    listen 127.0.0.1:\$PORT;
    location /f/ { set \$cache_key \$uri; cache_pass failover; }
    location /fn/ { set \$cache_key \$uri; cache_pipeline off; cache_pass failover; }
}
HTTP
    is((request($port, 'PUT', "$_/before", 'kept'))[0], 201, "$_: stored on the primary") for '/f', '/fn';
    ok(wait_until(sub { redis_cli($replica, 'GET', '/fn/before') eq 'kept' }, 5), 'and replicated');
    kill_redis($primary);
    for my $loc ('/f', '/fn') {
        is((request($port, 'PUT', "$loc/during", 'x'))[0], 502, "$loc: a write while the backup is a replica: 502");
        my ($st, $body) = request($port, 'GET', "$loc/before");
        is("$st $body", '200 kept', "$loc: reads go on, from the replica");
    }
    like(nginx_error_log(), qr/READONLY/, 'READONLY is logged');
    redis_cli($replica, 'REPLICAOF', 'NO', 'ONE');
    for my $loc ('/f', '/fn') {
        is((request($port, 'PUT', "$loc/after", 'new'))[0], 201, "$loc: a write right after the promotion: 201");
        my ($st, $body) = request($port, 'GET', "$loc/after");
        is("$st $body", '200 new', "$loc: and it is read back");
    }
    is(redis_cli($replica, 'GET', '/f/after'), 'new', 'the promoted server holds it');
    my @disabled = nginx_error_log() =~ /temporarily disabled/g;
    cmp_ok(scalar(@disabled), '<=', 1, 'only the killed primary was disabled');
    stop_nginx();
}
done_testing();
