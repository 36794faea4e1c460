# cache_subscribe and cache_publish: Redis pub/sub as server-sent events.
# A POST to a cache_publish location publishes its body and answers with
# PUBLISH's count; every subscriber of every worker gets every message, in
# order; one subscribing connection per worker and server, SUBSCRIBE /
# UNSUBSCRIBE as channels gain and lose subscribers, closed when nobody is
# left; a killed connection comes back (event: reconnect); with one of two
# servers down, the other carries the subscription; cache_auth; a hostile
# server; metrics; a reload; nginx -t. (Several servers: t/211.)
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump events subscribed subscribers metric);
use FakeRedis;
use GatewayTest qw(periodic_bytes conf_line_of http_request wait_until nginx_start stop_nginx nginx_signal nginx_error_log start_redis redis_cli
    free_port under_valgrind stretch redis_numsub tls_files nginx_workers proc_status_kb workers_idle_ok);
use IO::Socket::INET;
use Socket ();
use File::Temp qw(tempdir);
use Test::More;
use Time::HiRes qw(sleep time);

my $redis = start_redis();
my $rport = $redis->{port};
my $port;


# The subscribing connections Redis has (of nginx: those of no name).
sub pubsub_clients {
    my ($r) = @_;
    return scalar grep { /\bsub=[1-9]/ && /\bcmd=(subscribe|unsubscribe)\b/ } split /\n/, redis_cli($r // $redis, 'client', 'list');
}

sub publish {
    my ($ch, $body) = @_;
    return http_request($port, 'POST', "/pub?channel=$ch", $body);
}

$port = nginx_start(<<"HTTP", workers => 2);
upstream red { server 127.0.0.1:$rport; }
server {
    listen 127.0.0.1:\$PORT;
    cache_subscribe_heartbeat 1s;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /fixed { cache_pass 127.0.0.1:$rport; cache_subscribe news:Sports; }
    location /pub { cache_pass red; cache_publish \$arg_channel; }
    location /hsub { cache_pass red; cache_subscribe \$http_x_channel; }
    location /hpub { cache_pass red; cache_publish \$http_x_channel; }
    location = /metrics { gateway_status; }
}
HTTP

# The status of a request with an X-Channel header.
sub status_with_channel {
    my ($method, $path, $channel) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
    print $s "$method $path HTTP/1.1\r\nHost: x\r\nX-Channel: $channel\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx";
    local $/;
    my $resp = <$s> // '';
    return $resp =~ m{^HTTP/1\.1 (\d+)} ? $1 : 0;
}

# 1. Six subscribers over both workers, twenty messages published through
# the gateway and with redis-cli: each gets all of them, in order, and
# nothing of another channel.
my @subs = map { open_sse($port, '/sub?channel=news') } 1 .. 6;
pump(\@subs, 5, subscribed(@subs));
like($subs[0]{buf}, qr{^HTTP/1\.1 200 }, 'status 200');
like($subs[0]{buf}, qr{Content-Type: text/event-stream}i, 'text/event-stream');
like($subs[0]{buf}, qr{Cache-Control: no-cache}i, 'not cached');
is(scalar(grep { $_->{buf} =~ /: subscribed/ } @subs), 6, 'six subscribers are on');
# (": subscribed" comes once Redis confirmed the SUBSCRIBE: nothing
# published from then on is missed.)
ok(redis_numsub($redis, 'news') >= 1, 'redis has the subscriptions');
my $workers = redis_numsub($redis, 'news');
cmp_ok($workers, '<=', 2, "one subscribing connection per worker ($workers)");
# While nothing is published, the workers hold the subscribing connections
# and the subscribers (a heartbeat each second) without spending CPU.
workers_idle_ok('two idle workers with six subscribers', sub { pump(\@subs, shift) });
my @receivers;
for my $i (1 .. 20) {
    if ($i == 7) {
        my ($st, $body, $h) = publish('news', "line one\nline two\r\nline three");
        push @receivers, $body;
        is($st, 200, 'a publish: 200');
        like($h, qr{Content-Type: application/json}i, 'as JSON');
    } elsif ($i % 5 == 0) {
        redis_cli($redis, 'publish', 'news', "m$i");
    } else {
        my (undef, $body) = publish('news', "m$i");
        push @receivers, $body;
    }
    publish('other', 'not for them') if $i == 3;
}
is_deeply([sort { $a cmp $b } keys %{ { map { ($_ => 1) } @receivers } }], ["{\"receivers\": $workers}\n"],
    'each publish answers with the subscriptions that got it (one per worker)');
my @want = map { $_ == 7 ? 'news=line one|line two|line three' : "news=m$_" } 1 .. 20;
pump(\@subs, 10, sub { !grep { scalar(events($_)) < 20 } @subs });
is_deeply([events($_)], \@want, 'a subscriber gets every message, in order') for @subs;

# 2. Heartbeats (every second here).
pump(\@subs, stretch(3), sub { !grep { $_->{buf} !~ /: heartbeat\n\n/ } @subs });
is(scalar(grep { $_->{buf} =~ /: heartbeat\n\n/ } @subs), scalar(@subs), 'comment lines keep the stream alive (every subscriber)');

# 3. Redis drops the subscribing connections: the subscribers hear of it
# and the messages after it arrive.
redis_cli($redis, 'client', 'kill', 'type', 'pubsub');
pump(\@subs, 6, sub { !grep { !grep { $_ eq 'reconnect=' } events($_) } @subs });
is(scalar(grep { my @e = events($_); grep { $_ eq 'reconnect=' } @e } @subs), 6, 'every subscriber is told of the reconnect');
like(nginx_error_log(), qr/\[error\].*cache: the subscribing connection to 127\.0\.0\.1:$rport of upstream "red" was lost: upstream prematurely closed connection; trying again every 1000 ms/,
    'one error line says the connection was lost');
ok(wait_until(sub { redis_numsub($redis, 'news') == $workers }, 5), 'it subscribes again');
publish('news', 'after');
pump(\@subs, 5, sub { !grep { (events($_))[-1] ne 'news=after' } @subs });
is(scalar(grep { (events($_))[-1] eq 'news=after' } @subs), 6, 'messages after the reconnect arrive');

# 4. A literal channel of any visible characters, its letter case kept.
my @fixed = (open_sse($port, '/fixed'));
pump(\@fixed, 3, subscribed(@fixed));
ok(wait_until(sub { redis_numsub($redis, 'news:Sports') >= 1 }, 5), 'subscribed to news:Sports');
redis_cli($redis, 'publish', 'news:Sports', 'cased');
redis_cli($redis, 'publish', 'news:sports', 'not this one');
pump(\@fixed, 3, sub { scalar(events($fixed[0])) >= 1 });
is_deeply([events($fixed[0])], ['news:Sports=cased'], 'the channel as written');

# 5. Subscribers that leave are removed at once: the gauge, the events
# counted, and nobody subscribed in Redis.
close $_->{s} for @subs;
ok(wait_until(sub { redis_numsub($redis, 'news') == 0 }, 3), 'UNSUBSCRIBE once the last subscriber left');
ok(wait_until(sub { subscribers($port, 'cache_subscribe') == 1 }, 3), 'the subscribers gauge counts the one left');
my $sent = metric($port, 'events_sent_total', 'cache_subscribe');
cmp_ok($sent, '>=', 6 * 22 + 1, "events counted ($sent)");
my (undef, $m) = http_request($port, 'GET', '/metrics');
my $published = 0;
$published += $1 while $m =~ /^ngx_gateway_cache_requests_total\{upstream="red",command="PUBLISH",status="200"\} (\d+)$/mg;
is($published, 18, 'publishes counted by command and status');

# 6. A reload ends the streams of the old workers at once.
my $t0 = time;
nginx_signal('HUP');
pump(\@fixed, 5, sub { $fixed[0]{eof} });
ok($fixed[0]{eof}, 'a reload ends the stream');
cmp_ok(time - $t0, '<', stretch(3), 'at once');
like($fixed[0]{buf}, qr/0\r\n\r\n$/, 'with the end of the chunked body (not cut)');
ok(wait_until(sub { pubsub_clients() == 0 }, 3), 'no subscribing connection once nobody listens');

# 7. Client mistakes, and what a publish location takes.
is(status_with_channel('GET', '/hsub', 'a b'), 400, 'a channel with a space: 400');
like(nginx_error_log(), qr/\[info\].*cache: channel "a b" is not 1 to 256 visible ASCII characters/, 'logged at info');
my ($st) = http_request($port, 'GET', '/sub?channel=' . ('x' x 257));
is($st, 400, 'a channel of 257 bytes: 400');
($st) = http_request($port, 'GET', '/sub');
is($st, 400, 'no channel: 400');
($st) = http_request($port, 'POST', '/sub?channel=a', 'x');
is($st, 405, 'POST to a subscribe location: 405');
($st) = http_request($port, 'GET', '/pub?channel=a');
is($st, 405, 'GET to a publish location: 405');
($st) = http_request($port, 'PUT', '/pub?channel=a', 'x');
is($st, 405, 'PUT to a publish location: 405');
is(status_with_channel('POST', '/hpub', "a\tb"), 400, 'publish to a channel with a tab: 400');
is(status_with_channel('POST', '/hpub', "caf\xc3\xa9"), 400, 'publish to a channel that is not ASCII: 400');
my ($pst, $pbody) = publish('nobody', '');
is("$pst $pbody", "200 {\"receivers\": 0}\n", 'an empty body to a channel of no subscriber');
# A body larger than the client body buffer (in a temp file), whole.
my @big = (open_sse($port, '/sub?channel=big'));
pump(\@big, 3, subscribed(@big));
ok(wait_until(sub { redis_numsub($redis, 'big') == 1 }, 5), 'subscribed to big');
my $payload = periodic_bytes(300_000, 26, sub { 65 + $_[0] % 26 }, 1);
($pst) = publish('big', $payload);
is($pst, 200, 'a 300 kB publish');
pump(\@big, 5, sub { scalar(events($big[0])) >= 1 });
is_deeply([events($big[0])], ["big=$payload"], 'arrives whole');
close $big[0]{s};
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
stop_nginx();

# 8. With one worker: UNSUBSCRIBE after the last subscriber of a channel,
# the other channel goes on; the connection closes after the last of all.
$port = nginx_start(<<"HTTP", workers => 1);
upstream red { server 127.0.0.1:$rport; }
server {
    listen 127.0.0.1:\$PORT;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /pub { cache_pass red; cache_publish \$arg_channel; }
}
HTTP
@subs = map { open_sse($port, '/sub?channel=one') } 1 .. 3;
my @other = map { open_sse($port, '/sub?channel=two') } 1 .. 3;
pump([@subs, @other], 5, subscribed(@subs, @other));
ok(wait_until(sub { redis_numsub($redis, 'one') == 1 && redis_numsub($redis, 'two') == 1 }, 5), 'one connection subscribes to both');
is(pubsub_clients(), 1, 'one subscribing connection');
(undef, $pbody) = publish('one', 'x');
is($pbody, "{\"receivers\": 1}\n", 'three subscribers of one worker: one receiver in Redis');
close $_->{s} for @subs;
ok(wait_until(sub { redis_numsub($redis, 'one') == 0 }, 3), 'UNSUBSCRIBE once the last subscriber of a channel left');
publish('two', 'still here');
pump(\@other, 5, sub { !grep { (events($_))[-1] // '' ne 'two=still here' } @other });
is(scalar(grep { (events($_))[-1] // '' eq 'two=still here' } @other), 3, 'the other channel goes on');
close $_->{s} for @other;
ok(wait_until(sub { pubsub_clients() == 0 }, 3), 'the connection closes once nobody listens');
stop_nginx();

# 9. The first server is down: the connection to the second one carries
# the subscription (the one to the first is tried again every second).
my $closed = free_port();
$port = nginx_start(<<"HTTP", workers => 1);
upstream red { server 127.0.0.1:$closed; server 127.0.0.1:$rport; }
server { listen 127.0.0.1:\$PORT; location /sub { cache_pass red; cache_subscribe \$arg_channel; } }
HTTP
@subs = (open_sse($port, '/sub?channel=turn'));
pump(\@subs, 3, subscribed(@subs));
ok(wait_until(sub { redis_numsub($redis, 'turn') == 1 }, 5), 'subscribed through the second server');
like(nginx_error_log(), qr/\[error\].*cache: the subscribing connection to 127\.0\.0\.1:$closed of upstream "red" failed: connect\(\) failed \(111: Connection refused\); trying again every 1000 ms/,
    'the first one refused, logged');
redis_cli($redis, 'publish', 'turn', 'arrived');
pump(\@subs, 3, sub { scalar(events($subs[0])) >= 1 });
is_deeply([events($subs[0])], ['turn=arrived'], 'messages arrive');
close $subs[0]{s};
stop_nginx();

# 10. cache_auth: the password goes once, when the connection opens; a
# wrong one is an error line, and ends the streams of its subscribers.
my $locked = start_redis(password => 's3cret');
$port = nginx_start(<<"HTTP", workers => 1);
server {
    listen 127.0.0.1:\$PORT;
    location /sub { cache_pass 127.0.0.1:$locked->{port}; cache_auth s3cret; cache_subscribe \$arg_channel; }
    location /bad { cache_pass 127.0.0.1:$locked->{port}; cache_auth wrong; cache_subscribe \$arg_channel; }
    location /pub { cache_pass 127.0.0.1:$locked->{port}; cache_auth s3cret; cache_publish \$arg_channel; }
}
HTTP
@subs = map { open_sse($port, '/sub?channel=secret') } 1 .. 2;
pump(\@subs, 3, subscribed(@subs));
ok(wait_until(sub { redis_numsub($locked, 'secret') == 1 }, 5), 'subscribed with the password');
(undef, $pbody) = publish('secret', 'hush');
is($pbody, "{\"receivers\": 1}\n", 'a publish with the password');
pump(\@subs, 3, sub { !grep { scalar(events($_)) < 1 } @subs });
is_deeply([map { events($_) } @subs], ['secret=hush', 'secret=hush'], 'both subscribers get it');
my @bad = (open_sse($port, '/bad?channel=secret'));
# (The stream's last chunk: the client's connection is kept.)
sub ended { my $s = shift; return $s->{eof} || $s->{buf} =~ /\r\n0\r\n\r\n\z/ }
pump(\@bad, 3, sub { ended($bad[0]) });
ok(wait_until(sub { nginx_error_log() =~ /\[error\].*cache: AUTH was refused: WRONGPASS.*, by redis \S+ of upstream "127\.0\.0\.1:$locked->{port}" \(subscribing\); its subscriptions end/ }, 5),
    'a wrong password: an error line');
ok(ended($bad[0]), 'and the stream ends');
is(redis_numsub($locked, 'secret'), 1, 'and no subscription with it');
close $_->{s} for @subs, @bad;
stop_nginx();

# 11. A hostile server: bytes that are not RESP, a message of another
# kind, a connection cut mid-reply. Each costs the connection (an error
# line, then another try), never the worker.
my $script = sub {
    my ($conn, $n, @cmd) = @_;
    return () unless uc($cmd[0]) eq 'SUBSCRIBE';
    return (['send', "*3\r\n\$9\r\nsubscribe\r\n\$1\r\nh\r\n:1\r\n*3\r\n\$7\r\nmessage\r\n\$1\r\nh\r\n\$2\r\nok\r\n"],
        ['send', "*3\r\n\$7\r\nmessage\r\n\$1\r\nh\r\n\$4\r\nd\r\nr\r\n"], ['send', "garbage\r\n"]) if $conn == 1;
    return (['send', "*3\r\n\$7\r\nmessage\r\n\$1\r\nh\r\n:5\r\n"]) if $conn == 2;
    return (['send', "*3\r\n\$7\r\nmessage\r\n\$1\r\nh\r\n\$100\r\nabc"], ['close']) if $conn == 3;
    return (['send', "*3\r\n\$9\r\nsubscribe\r\n\$1\r\nh\r\n:1\r\n*3\r\n\$7\r\nmessage\r\n\$1\r\nh\r\n\$4\r\nlast\r\n"]);
};
my $fake = FakeRedis->start($script);
$port = nginx_start(<<"HTTP", workers => 1);
server { listen 127.0.0.1:\$PORT; location /sub { cache_pass 127.0.0.1:@{[ $fake->port ]}; cache_subscribe h; } }
HTTP
@subs = (open_sse($port, '/sub'));
pump(\@subs, 8, sub { grep { $_ eq 'h=last' } events($subs[0]) });
is_deeply([events($subs[0])], ['h=ok', 'h=d|r', 'reconnect=', 'h=last'],
    'the good messages, then one reconnect once a connection works again');
my $log = nginx_error_log();
like($log, qr/was lost: redis sent bytes that are not RESP/, 'garbage: an error line');
like($log, qr/was lost: redis sent a "message" array to a subscribing connection/, 'an integer payload: an error line');
like($log, qr/was lost: upstream prematurely closed connection/, 'cut mid-reply: an error line');
unlike($log, qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
close $subs[0]{s};
stop_nginx();

# 12. Clients that leave, or do not read, during a burst; large messages;
# memory. One worker, so that its RSS tells.
$port = nginx_start(<<"HTTP", workers => 1);
upstream red { server 127.0.0.1:$rport; }
upstream locked { server 127.0.0.1:$locked->{port}; }
server {
    listen 127.0.0.1:\$PORT;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /wrong { cache_pass locked; cache_auth wrong; cache_subscribe_heartbeat 1s; cache_subscribe w; }
    location /pub { cache_pass red; cache_publish \$arg_channel; client_max_body_size 8m; }
    location = /metrics { gateway_status; }
}
HTTP
my ($worker) = nginx_workers();
# (a) 100 subscribers reset their connections in the middle of a burst of
# 4,000 messages: the worker stays responsive, each is dropped once.
my @gone = map { open_sse($port, '/sub?channel=burst') } 1 .. 100;
pump(\@gone, 5, subscribed(@gone));
my $burst = join '', map { "PUBLISH burst " . ('m' x 500) . "$_\r\n" } 1 .. 2000;
my $rc = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $rport) or die $!;
print $rc $burst;
for my $g (@gone) {
    setsockopt($g->{s}, Socket::SOL_SOCKET(), Socket::SO_LINGER(), pack('ii', 1, 0));
    close $g->{s};
}
print $rc $burst;
my $t = time;
my ($mst) = http_request($port, 'GET', '/metrics');
is($mst, 200, 'the worker answers during the burst');
cmp_ok(time - $t, '<', stretch(4), 'at once');
ok(wait_until(sub { subscribers($port, 'cache_subscribe') == 0 }, 5), 'every subscriber that left is removed');
my $drops = () = nginx_error_log() =~ /cache: a subscriber that cannot take events/g;
cmp_ok($drops, '<=', 100, "each dropped once at most ($drops lines)");
close $rc;
# (b) A subscriber that reads 20 MB of events: the worker's memory stays flat.
my @reader = (open_sse($port, '/sub?channel=flow'));
pump(\@reader, 3, subscribed(@reader));
my $before = proc_status_kb($worker, 'VmRSS');
my $payload10k = 'p' x 10_000;
my $flow = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $rport) or die $!;
my $sent_flow = 0;
for my $round (1 .. 20) {
    print $flow join '', map { "PUBLISH flow $payload10k\r\n" } 1 .. 100;
    $sent_flow += 100;
    pump(\@reader, 5, sub { (() = $reader[0]{buf} =~ /event: flow/g) >= $sent_flow });
    $reader[0]{buf} = '' if $round < 20;    # (what was read is not kept)
    $sent_flow = 0 if $round < 20;
}
is(scalar(() = $reader[0]{buf} =~ /event: flow\ndata: p{10000}\n\n/g), 100, 'a reading subscriber gets everything');
my $grew = proc_status_kb($worker, 'VmRSS') - $before;
SKIP: {
    skip 'a memory bound: valgrind keeps freed blocks out of use for a while (its freelist), so the worker grows', 1
        if under_valgrind();
    cmp_ok($grew, '<', 8000, "20 MB streamed, the worker grew by $grew kB");
}
close $reader[0]{s};
# (c) A subscriber that does not read is dropped once more than 1 MB has
# waited for it for a second, and its connection closed; another one that
# reads gets 3 MB messages whole (an event is never cut).
socket(my $stuck, Socket::PF_INET(), Socket::SOCK_STREAM(), 0) or die $!;
setsockopt($stuck, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 4096) or die $!;
connect($stuck, Socket::pack_sockaddr_in($port, Socket::inet_aton('127.0.0.1'))) or die $!;
syswrite($stuck, "GET /sub?channel=heavy HTTP/1.1\r\nHost: x\r\n\r\n");
my @heavy = (open_sse($port, '/sub?channel=heavy'));
pump(\@heavy, 3, subscribed(@heavy));
ok(wait_until(sub { subscribers($port, 'cache_subscribe') == 2 }, 3), 'both subscribed');
my $big = periodic_bytes(3_000_000, 26, sub { 97 + $_[0] % 26 }, 1);
for my $i (1 .. 3) {
    my ($pst) = publish('heavy', "$i$big");
    is($pst, 200, "a 3 MB publish ($i)") or last;
    pump(\@heavy, 10, sub { scalar(events($heavy[0])) >= $i });
}
is_deeply([map { length } events($heavy[0])], [map { length("heavy=$_$big") } 1 .. 3], 'the reader gets three 3 MB events whole');
# (One that has taken nothing for a second is dropped at the next event.)
sleep 1.2;
publish('heavy', 'one more');
ok(wait_until(sub { subscribers($port, 'cache_subscribe') == 1 }, 5), 'the one that does not read is dropped');
like(nginx_error_log(), qr/\[info\].*cache: a subscriber that cannot take events \(gone, or more than 1048576 bytes behind\) is dropped/,
    'with an info line');
close $stuck;
close $heavy[0]{s};
# (d) A password Redis refuses: the stream opens and ends, with no
# ": subscribed" and no "reconnect" event (nothing was ever subscribed).
my @wrong = (open_sse($port, '/wrong'));
pump(\@wrong, 3.5, sub { ended($wrong[0]) });
like($wrong[0]{buf}, qr{^HTTP/1\.1 200 }, 'the stream opens');
ok(ended($wrong[0]), 'and ends');
unlike($wrong[0]{buf}, qr/: subscribed/, 'it says it is not subscribed');
unlike($wrong[0]{buf}, qr/event: reconnect/, 'and tells of no reconnect');
close $wrong[0]{s};
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
# (e) A publish answer is not a range of anything.
my $ps = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
print $ps "POST /pub?channel=x HTTP/1.1\r\nHost: x\r\nRange: bytes=0-3\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx";
my $pr = do { local $/; <$ps> };
like($pr, qr{^HTTP/1\.1 200 .*\{"receivers": 0\}}s, 'Range is not applied to a publish');
unlike($pr, qr/Accept-Ranges/i, 'and not offered');
close $ps;
stop_nginx();

# 13. TLS (cache_ssl): the subscribing connection verifies the server as
# the location's requests do; a server of another authority or another
# name is an error line, and nothing is subscribed.
my $d = tls_files();
my $tredis = start_redis(tls => { cert => "$d/server.crt", key => "$d/server.key", ca => "$d/ca.crt" });
my $tls = $tredis->{tls_port};
$port = nginx_start(<<"HTTP", workers => 1);
upstream tls_red { server 127.0.0.1:$tls; }
upstream other_ca { server 127.0.0.1:$tls; }
upstream wrong_name { server 127.0.0.1:$tls; }
server {
    listen 127.0.0.1:\$PORT;
    cache_ssl on;
    cache_ssl_verify on;
    cache_ssl_trusted_certificate $d/ca.crt;
    cache_ssl_name localhost;
    cache_ssl_server_name on;
    location /sub { cache_pass tls_red; cache_subscribe \$arg_channel; }
    location /pub { cache_pass tls_red; cache_publish \$arg_channel; }
    location /other { cache_pass other_ca; cache_ssl_trusted_certificate $d/other.crt; cache_subscribe o; }
    location /name { cache_pass wrong_name; cache_ssl_name elsewhere; cache_subscribe n; }
}
HTTP
@subs = map { open_sse($port, '/sub?channel=sealed') } 1 .. 2;
pump(\@subs, 3, subscribed(@subs));
ok(wait_until(sub { redis_numsub($tredis, 'sealed') == 1 }, 5), 'subscribed over TLS');
like(redis_cli($tredis, 'client', 'list'), qr/\bsub=1\b/, 'the subscribing connection is there');
for my $i (1 .. 3) {
    my ($pst, $pbody) = publish('sealed', "tls $i" . ($i == 2 ? "\nsecond line" : ''));
    is("$pst $pbody", "200 {\"receivers\": 1}\n", "publish $i over TLS");
}
redis_cli($tredis, 'publish', 'sealed', 'from redis-cli');
pump(\@subs, 5, sub { !grep { scalar(events($_)) < 4 } @subs });
is_deeply([events($_)], ['sealed=tls 1', 'sealed=tls 2|second line', 'sealed=tls 3', 'sealed=from redis-cli'],
    'every message, in order, over TLS') for @subs;
redis_cli($tredis, 'client', 'kill', 'type', 'pubsub');
pump(\@subs, 6, sub { !grep { !grep { $_ eq 'reconnect=' } events($_) } @subs });
ok(wait_until(sub { redis_numsub($tredis, 'sealed') == 1 }, 5), 'a new TLS handshake after the connection was killed');
redis_cli($tredis, 'publish', 'sealed', 'again');
pump(\@subs, 5, sub { !grep { (events($_))[-1] ne 'sealed=again' } @subs });
is(scalar(grep { (events($_))[-1] eq 'sealed=again' } @subs), 2, 'messages arrive after it');
my @other_ca = (open_sse($port, '/other'));
my @wrong_name = (open_sse($port, '/name'));
pump([@other_ca, @wrong_name], 3, subscribed(@other_ca, @wrong_name));
ok(wait_until(sub { nginx_error_log() =~ /subscribing connection to \S+ of upstream "other_ca" failed: upstream SSL certificate verify error/ }, 5),
    'another authority: an error line');
ok(wait_until(sub { nginx_error_log() =~ /subscribing connection to \S+ of upstream "wrong_name" failed: upstream SSL certificate does not match "elsewhere"/ }, 5),
    'another name: an error line');
is(redis_numsub($tredis, 'o') + redis_numsub($tredis, 'n'), 0, 'and nothing subscribed through them');
close $_->{s} for @subs, @other_ca, @wrong_name;
ok(wait_until(sub { pubsub_clients($tredis) == 0 }, 3), 'the TLS connection closes once nobody listens');
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
stop_nginx();

# 14. nginx -t
for my $case (
    ['location /a { cache_subscribe c; }', qr/"cache_subscribe" needs "cache_pass" in the same location in \S+nginx\.conf:\d+/, qr/cache_subscribe c;/],
    ['location /a { cache_publish c; }', qr/"cache_publish" needs "cache_pass" in the same location in \S+nginx\.conf:\d+/, qr/cache_publish c;/],
    ['location /a { cache_pass red; cache_subscribe c; cache_subscribe d; }', qr/"cache_subscribe" directive is duplicate in .*nginx\.conf:\d+/],
    ['location /a { cache_pass red; cache_subscribe c; cache_publish d; }', qr/"cache_publish" and "cache_subscribe" in one location in .*nginx\.conf:\d+/],
    ['location /a { cache_pass red; cache_subscribe "a b"; }', qr/invalid channel "a b" in "cache_subscribe" directive .* in .*nginx\.conf:\d+/],
    ['location /a { cache_pass $arg_u; cache_subscribe c; }', qr/"cache_subscribe" needs "cache_pass" to name an upstream or an address, not a variable in \S+nginx\.conf:\d+/,
        qr/cache_subscribe c;/],
    ['location /a { cache_pass red; cache_subscribe c; cache_subscribe_heartbeat 0; }', qr/cache_subscribe_heartbeat/],
    ['server_name x; location /a { cache_pass red; cache_publish c; } location /b { cache_subscribe c; cache_pass red; }', qr/^started$/],
  )
{
    my ($loc, $want, $line) = @$case;
    # (The locations on a line of their own: the line named is the
    # directive's, not the end of the http block's.)
    my $err = eval {
        my $p = nginx_start("upstream red { server 127.0.0.1:$rport; }\nserver { listen 127.0.0.1:\$PORT;\n$loc\n}");
        http_request($p, 'GET', '/');
        stop_nginx();
        'started';
    } // $@;
    like($err, $want, "nginx -t: $loc");
    like(conf_line_of($err), $line, "and names the directive's line") if $line;
}

done_testing();
