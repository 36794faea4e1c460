# A master that refuses writes while too few replicas are in step with it
# (min-replicas-to-write, real servers): the refusal (-NOREPLICAS) is an
# answer to ask again later, 503 with Retry-After (502 with Retry-After
# with cache_pipeline off), one error line that says why; nothing was
# written, reads go on, and once a replica is in step the writes are
# taken, on the same connections.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log start_redis redis_cli kill_redis wait_until);
use HttpClient qw(http_request);
use Test::More;

my $master = start_redis();
redis_cli($master, 'SET', $_, 'r') for '/k/read', '/off/read';
redis_cli($master, 'CONFIG', 'SET', 'min-replicas-max-lag', '10');
redis_cli($master, 'CONFIG', 'SET', 'min-replicas-to-write', '1');

my $port = nginx_start(<<"HTTP");
upstream one { server 127.0.0.1:$master->{port}; keepalive 4; }
server {
    listen 127.0.0.1:\$PORT;
    location /k/ { set \$cache_key \$uri; cache_pass one; }
    location /off/ { set \$cache_key \$uri; cache_pipeline off; cache_pass one; }
}
HTTP

# 1. No replica: writes are refused, reads are served.
my ($st, $body, $head) = http_request($port, 'PUT', '/k/a', 'v1');
is($st, 503, 'a write the master refuses (NOREPLICAS): 503');
like($head, qr/\r\nRetry-After: 1(\r|$)/i, 'with Retry-After');
like(nginx_error_log(), qr/\[error\].*NOREPLICAS.*fewer replicas than its min-replicas-to-write are in step/,
    'one error line says why');
is(redis_cli($master, 'EXISTS', '/k/a'), '0', 'nothing was written');
($st, undef, $head) = http_request($port, 'DELETE', '/k/read');
is($st, 503, 'a DELETE too');
is(redis_cli($master, 'GET', '/k/read'), 'r', 'and the key is still there');
($st, $body) = http_request($port, 'GET', '/k/read');
is("$st $body", '200 r', 'a read on the same connection is served');
($st, undef, $head) = http_request($port, 'PUT', '/off/a', 'v1');
is($st, 502, 'cache_pipeline off: 502');
like($head, qr/\r\nRetry-After: 1(\r|$)/i, 'with Retry-After too');
($st, $body, $head) = http_request($port, 'GET', '/off/read');
is("$st $body", '200 r', 'and a read after it is served');
unlike($head, qr/Retry-After/i, 'without Retry-After');

# 2. A replica in step: the same writes are taken.
my $replica = start_redis(args => ['--replicaof', '127.0.0.1', $master->{port}, '--repl-diskless-sync-delay', '0']);
ok(wait_until(sub { redis_cli($master, 'INFO', 'replication') =~ /min_slaves_good_slaves:1/ }, 20),
    'a replica is in step');
($st, undef, $head) = http_request($port, 'PUT', '/k/a', 'v2');
is($st, 201, 'now the write is taken: 201');
unlike($head, qr/Retry-After/i, 'without Retry-After');
is(redis_cli($master, 'GET', '/k/a'), 'v2', 'on the master');
ok(wait_until(sub { redis_cli($replica, 'GET', '/k/a') eq 'v2' }, 10), 'and on the replica');
is((http_request($port, 'PUT', '/off/a', 'v3'))[0], 201, 'cache_pipeline off: 201');

# 3. The replica gone: refused again once the master counts it out.
kill_redis($replica);
ok(wait_until(sub { (http_request($port, 'PUT', '/k/b', 'x'))[0] == 503 }, 20),
    'the replica gone: the writes are refused again');
is(redis_cli($master, 'EXISTS', '/k/b'), '0', 'and not written');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]|exited on signal/, 'no alert, no crash');
stop_nginx();

done_testing();
