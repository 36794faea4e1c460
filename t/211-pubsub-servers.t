# Pub/sub over an upstream of several Redis servers: the worker's hub
# subscribes on every server of the upstream (one connection to each), so
# a subscriber hears every publish, whichever server the balancer gave it
# to ({"receivers": 1} each time, with hash and with round robin); with a
# server down the others carry on. Event streams name their upstream and
# servers: $upstream_addr, $upstream_status and $upstream_response_time in
# the access log, the upstream label of gateway_status (cache_subscribe
# and sqldb_listen). (A cache_cluster upstream subscribes on one node: the
# cluster carries every PUBLISH to all its nodes; t/204.)
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump events subscribed);
use GatewayTest qw(http_request wait_until nginx_start stop_nginx nginx_error_log start_redis redis_cli kill_redis
    psql pg_server_line stretch redis_numsub);
use Test::More;
use Time::HiRes qw(sleep time);

my @red = map { start_redis() } 1 .. 2;
my ($ra, $rb) = map { "127.0.0.1:$_->{port}" } @red;
my $port;


# How many PUBLISH a server has run.
sub publishes {
    my ($r) = @_;
    my ($n) = redis_cli($r, 'info', 'commandstats') =~ /^cmdstat_publish:calls=(\d+)/m;
    return $n // 0;
}

# The access log's lines for a location.
sub log_lines {
    my ($re) = @_;
    open my $fh, '<', "$GatewayTest::NginxRoot/logs/streams.log" or return ();
    return grep { /$re/ } <$fh>;
}

my $server = pg_server_line('streams');
$port = nginx_start(<<"HTTP", workers => 1);
upstream hashed { hash \$cache_key consistent; server $ra; server $rb; }
upstream rr { server $ra; server $rb; }
upstream db { sqldb_server $server; }
log_format streams '\$uri|\$status|\$upstream_addr|\$upstream_status|\$upstream_response_time';
server {
    listen 127.0.0.1:\$PORT;
    access_log logs/streams.log streams;
    location /hsub { cache_pass hashed; cache_subscribe \$arg_channel; }
    location /hpub { set \$cache_key \$arg_k; cache_pass hashed; cache_publish \$arg_channel; }
    location /rsub { cache_pass rr; cache_subscribe \$arg_channel; }
    location /rpub { cache_pass rr; cache_publish \$arg_channel; }
    location /listen { sqldb_pass db; sqldb_listen \$arg_channel; }
    location = /metrics { access_log off; gateway_status; }
}
HTTP

# 1. hash $cache_key consistent over two servers: twenty publishes with
# keys that the hash spreads over both; the subscriber gets all twenty, in
# order, and each publish counted its receiver.
for my $case (['hash', '/hsub', '/hpub'], ['round robin', '/rsub', '/rpub']) {
    my ($name, $sub, $pub) = @$case;
    my $ch = $name =~ s/ /_/r;
    my @subs = (open_sse($port, "$sub?channel=$ch"));
    pump(\@subs, stretch(5), subscribed(@subs));
    like($subs[0]{buf}, qr/: subscribed/, "$name: subscribed");
    is_deeply([map { redis_numsub($_, $ch) } @red], [1, 1], "$name: the hub subscribed on both servers");
    my @before = map { publishes($_) } @red;
    my @said;
    for my $i (1 .. 20) {
        my ($st, $body) = http_request($port, 'POST', "$pub?channel=$ch&k=key$i", "event $i");
        push @said, "$st $body";
    }
    is_deeply(\@said, [("200 {\"receivers\": 1}\n") x 20], "$name: every publish reached the subscriber");
    my @took = map { publishes($red[$_]) - $before[$_] } 0, 1;
    ok($took[0] > 0 && $took[1] > 0, "$name: the publishes went to both servers (@took)");
    pump(\@subs, stretch(5), sub { events($subs[0]) >= 20 });
    is_deeply([events($subs[0])], [map { "$ch=event $_" } 1 .. 20], "$name: the subscriber got all twenty, in order");
    close $subs[0]{s};
    ok(wait_until(sub { redis_numsub($red[0], $ch) == 0 && redis_numsub($red[1], $ch) == 0 }, 5),
        "$name: UNSUBSCRIBE on both once the subscriber left");
}

# 2. The stream's access-log line and its count name the upstream and the
# servers it heard.
my $at = time;
my @subs = (open_sse($port, '/hsub?channel=logged'));
pump(\@subs, stretch(5), subscribed(@subs));
sleep 1.2;
close $subs[0]{s};
my $lasted = time - $at;
my @lines;
ok(wait_until(sub { @lines = log_lines(qr{^/hsub\|}); @lines >= 2 }, 5), 'the streams are logged');
chomp(my $line = $lines[-1] // '');
my ($uri, $status, $addr, $ustatus, $utime) = split /\|/, $line;
is($status, 200, 'the stream: 200');
is(join(',', sort split /, /, $addr // ''), join(',', sort $ra, $rb), "\$upstream_addr: both servers ($addr)");
is($ustatus, '200, 200', '$upstream_status: 200 for each');
my @t = split /, /, $utime // '';
ok(@t == 2 && !(grep { !/^\d+\.\d{3}$/ || $_ < 1.0 || $_ > $lasted + 1 } @t),
    "\$upstream_response_time: how long the stream lasted ($utime, $lasted s)") or diag($line);
my $metrics = (http_request($port, 'GET', '/metrics'))[1];
like($metrics, qr/^ngx_gateway_cache_requests_total\{upstream="hashed",command="SUBSCRIBE",status="200"\} [1-9]\d*$/m,
    'counted under its upstream');
unlike($metrics, qr/^ngx_gateway_cache_requests_total\{upstream="",command="SUBSCRIBE"/m, 'and not under upstream=""');

# sqldb_listen likewise.
@subs = (open_sse($port, '/listen?channel=ch'));
pump(\@subs, stretch(5), subscribed(@subs));
like($subs[0]{buf}, qr/: subscribed/, 'sqldb_listen: subscribed');
close $subs[0]{s};
ok(wait_until(sub { @lines = log_lines(qr{^/listen\|}); @lines >= 1 }, 5), 'sqldb_listen: logged');
chomp($line = $lines[-1] // '');
(undef, $status, $addr, $ustatus, $utime) = split /\|/, $line;
like($addr // '', qr/^\S+:\d+$/, "sqldb_listen: \$upstream_addr names its server ($addr)");
is($ustatus, '200', 'sqldb_listen: $upstream_status 200');
like($utime // '', qr/^\d+\.\d{3}$/, 'sqldb_listen: $upstream_response_time');
$metrics = (http_request($port, 'GET', '/metrics'))[1];
like($metrics, qr/^ngx_gateway_sqldb_requests_total\{upstream="db",status="200"\} [1-9]\d*$/m,
    'sqldb_listen: counted under its upstream');
unlike($metrics, qr/^ngx_gateway_sqldb_requests_total\{upstream="",status="200"\}/m, 'sqldb_listen: not under upstream=""');

# 3. A server goes down: the subscriber stays, and hears every publish the
# other one takes (the balancer skips the dead one).
@subs = (open_sse($port, '/rsub?channel=down'));
pump(\@subs, stretch(5), subscribed(@subs));
kill_redis($red[1]);
ok(wait_until(sub { nginx_error_log() =~ /\[error\].*cache: the subscribing connection to \Q$rb\E of upstream "rr" was lost/ }, 5),
    'the lost connection is logged, with its server');
my @said;
for my $i (1 .. 6) {
    my ($st, $body) = http_request($port, 'POST', "/rpub?channel=down", "after $i");
    push @said, "$st $body";
}
is_deeply(\@said, [("200 {\"receivers\": 1}\n") x 6], 'every publish went to the live server, and reached the subscriber');
pump(\@subs, stretch(5), sub { events($subs[0]) >= 6 });
is_deeply([events($subs[0])], [map { "down=after $_" } 1 .. 6], 'the subscriber got them all');
unlike($subs[0]{buf}, qr/event: reconnect/, 'and no reconnect: the live server never went away');
close $subs[0]{s};

unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]|exited on signal/, 'no alert, no crash');
stop_nginx();
done_testing();
