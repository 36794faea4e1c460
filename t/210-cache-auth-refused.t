# cache_auth with a password from the client ($http_x_redis_password)
# against a real Redis with requirepass: a refused password costs Redis at
# most one connection a second and the log one line a minute (per worker),
# however many requests carry it; for a second after a refusal, its
# requests get 502 at once. Plain requests (cache_pipeline off), shared
# pipelined connections (on) and subscribers (cache_subscribe) alike. The
# right password works at once.
use strict;
use warnings;
use lib 't/lib';
use SseClient;
use GatewayTest qw(nginx_start stop_nginx nginx_error_log start_redis redis_cli wait_until stretch redis_connections);
use HttpClient qw(keepalive_requests);
use Test::More;
use Time::HiRes qw(time);

my $redis = start_redis(password => 'the-right-one');
redis_cli($redis, 'set', 'k', 'value of k');
my $port = nginx_start(<<"EOF", workers => 1);
    upstream red { server 127.0.0.1:$redis->{port}; keepalive 4; }
    server {
        listen 127.0.0.1:\$PORT;
        cache_auth \$http_x_redis_password;
        location /on/ { set \$cache_key \$arg_key; cache_pass red; }
        location /off/ { set \$cache_key \$arg_key; cache_pipeline off; cache_pass red; }
        location /sub { cache_subscribe_heartbeat 1s; cache_subscribe \$arg_channel; cache_pass red; }
        location /pub { cache_publish \$arg_channel; cache_pass red; }
    }
EOF

# The connections Redis accepted, less redis-cli's own (one a call).
my $cli = 0;
sub conns { $cli++; return redis_connections($redis) - $cli }
sub refusals { my $log = shift; return scalar(() = $log =~ /\[error\].*AUTH was refused/g) }

# Requests with wrong passwords, each password 25 times in a row on one
# client connection.
for my $where (qw(on off)) {
    my @pw = map { "wrong-$where-$_" } 1 .. 4;
    my $mark = length nginx_error_log();
    my $before = conns();
    my $t0 = time;
    my @r = map { my $pw = $_; keepalive_requests($port, 10, map { ['GET', "/$where/?key=k", '', { 'X-Redis-Password' => $pw }] } 1 .. 25) } @pw;
    my $secs = time - $t0;
    my $opened = conns() - $before;
    is(scalar(grep { ($_->{status} // 0) == 502 } @r), 100, "cache_pipeline $where: 100 requests with 4 wrong passwords: 502 each");
    # One connection per password, and one more for each second the requests took.
    my $most = 4 * (1 + int $secs);
    cmp_ok($opened, '<=', $most, sprintf("cache_pipeline $where: Redis got %d connections (at most %d in %.1f s)", $opened, $most, $secs));
    cmp_ok($opened, '>=', 4, "cache_pipeline $where: each password was tried");
    my $log = substr(nginx_error_log(), $mark);
    is(refusals($log), 4, "cache_pipeline $where: one error line per password") or diag($log);
    unlike($log, qr/wrong-$where/, 'the log does not show the passwords');
    like($log, qr/AUTH was refused: WRONGPASS.*, by redis 127\.0\.0\.1:$redis->{port} \(password #[0-9a-f]{8}: /, 'it names the server and a tag of the password');
    my $ok = (keepalive_requests($port, 10, ['GET', "/$where/?key=k", '', { 'X-Redis-Password' => 'the-right-one' }]))[0];
    is_deeply([$ok->{status}, $ok->{body}], [200, 'value of k'], "cache_pipeline $where: the right password works at once");
    my $again = (keepalive_requests($port, 10, ['GET', "/$where/?key=k", '', { 'X-Redis-Password' => $pw[-1] }]))[0];
    is($again->{status}, 502, "cache_pipeline $where: a wrong one still gets 502");
}

# A wrong password a second later is tried again (Redis may have been
# given it meanwhile), and still logged once.
{
    my $mark = length nginx_error_log();
    my $before = conns();
    my $pw = { 'X-Redis-Password' => 'later' };
    is((keepalive_requests($port, 10, ['GET', '/on/?key=k', '', $pw]))[0]{status}, 502, 'a new wrong password: 502');
    my $t = time;
    ok(wait_until(sub { (keepalive_requests($port, 10, ['GET', '/on/?key=k', '', $pw]))[0]{status} == 502 && conns() - $before >= 2 }, 5),
        'a second later, it is tried again');
    cmp_ok(time - $t, '>=', 0.9, 'not before');
    is(refusals(substr(nginx_error_log(), $mark)), 1, 'and logged once');
}

# Idle subscribers, each with its own wrong password: one connection each,
# then their streams end; no connection a second per subscriber.
{
    my $mark = length nginx_error_log();
    my $before = conns();
    my @subs = map {
        SseClient::open_sse($port, '/sub?channel=c', 'Connection: close', "X-Redis-Password: idle-$_");
    } 1 .. 20;
    SseClient::pump(\@subs, stretch(5), sub { !grep { !$_->{eof} } @subs });
    # One that comes back at once: 502, no connection.
    my $t = time;
    my $r = (keepalive_requests($port, 10, ['GET', '/sub?channel=c', '', { 'X-Redis-Password' => 'idle-20' }]))[0];
    my $quick = time - $t < 0.5;
    is(scalar(grep { $_->{eof} } @subs), 20, '20 subscribers with wrong passwords: their streams end');
    is(scalar(grep { $_->{buf} =~ /^HTTP\/1\.1 200 / && $_->{buf} !~ /: subscribed/ } @subs), 20, 'unsubscribed');
    SKIP: {
        skip 'the machine was too slow to come back within the second', 1 unless $quick;
        is($r->{status}, 502, 'a subscriber back at once: 502');
    }
    ok(!wait_until(sub { conns() - $before > 20 }, 2.5), 'in 2.5 s Redis got no more than one connection each (' . (conns() - $before) . ')');
    is(refusals(substr(nginx_error_log(), $mark)), 20, 'one error line each');
    # The right password subscribes and hears a publication.
    my @good = (SseClient::open_sse($port, '/sub?channel=c', 'X-Redis-Password: the-right-one'));
    SseClient::pump(\@good, 5, SseClient::subscribed(@good));
    like($good[0]{buf}, qr/: subscribed/, 'the right password subscribes');
    my $pub = (keepalive_requests($port, 10, ['POST', '/pub?channel=c', 'hello', { 'X-Redis-Password' => 'the-right-one' }]))[0];
    is($pub->{status}, 200, 'a publish with it');
    SseClient::pump(\@good, 5, sub { scalar(SseClient::events($good[0])) >= 1 });
    is_deeply([SseClient::events($good[0])], ['c=hello'], 'and the subscriber gets it');
    close $good[0]{s};
}

unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]|exited on signal/, 'no worker trouble');
stop_nginx();
done_testing();
