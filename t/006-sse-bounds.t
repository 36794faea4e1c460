# Event streams cannot exhaust a worker: what waits for the subscribers of
# a source (sqldb_listen, cache_subscribe) is bounded per worker
# (sqldb_listen_buffers_max, cache_subscribe_buffers_max); past the bound
# the subscribers furthest behind are dropped first (an info line each,
# ngx_gateway_subscribers_dropped_total{reason="buffers_max"}), the
# worker's memory stays bounded and falls back, and a subscriber that reads
# gets every event at once. Fanning out costs the same per event however
# far behind the slow subscribers are.
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump events subscribed subscribers);
use GatewayTest qw(http_request wait_until nginx_start stop_nginx nginx_error_log psql stretch start_redis nginx_workers
    proc_status_kb cpu_seconds under_valgrind);
use IO::Socket::INET;
use Socket ();
use Test::More;
use Time::HiRes qw(sleep time);

my $port;
my $worker;
my (@fast, $hwm0, $rss0, @got, $grew, $dropped, $log, @lines, $after);
# (PARTS=13 runs parts 1 and 3 only.)
sub part { !$ENV{PARTS} || index($ENV{PARTS}, $_[0]) >= 0 }
# Under valgrind the same events go the same ways, but the worker's RSS and
# CPU time are valgrind's: those checks skip.
my $vg = "under valgrind: the worker's RSS and CPU time are valgrind's";
sub unless_valgrind (&) {
    my ($check) = @_;
    SKIP: {
        skip $vg, 1 if under_valgrind();
        $check->();
    }
}



# (The servers below listen with sndbuf=32k: the kernel's socket buffers
# would otherwise grow to take megabytes of what a subscriber does not
# read, which is the kernel's memory, bounded per socket; the worker's own
# is what is checked here.)

# A subscriber that never reads, with a small receive window: the worker
# has to keep what it cannot send.
sub slow_sub {
    my ($path) = @_;
    socket(my $s, Socket::PF_INET(), Socket::SOCK_STREAM(), 0) or die $!;
    setsockopt($s, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 4096) or die $!;
    connect($s, Socket::pack_sockaddr_in($port, Socket::inet_aton('127.0.0.1'))) or die $!;
    syswrite($s, "GET $path HTTP/1.1\r\nHost: x\r\n\r\n");
    return $s;
}

# ngx_gateway_subscribers_dropped_total{source=SOURCE,reason=REASON}
sub drops {
    my ($source, $reason) = @_;
    my (undef, $m) = http_request($port, 'GET', '/metrics');
    return $m =~ /^ngx_gateway_subscribers_dropped_total\{source="\Q$source\E",reason="\Q$reason\E"\} (\d+)$/m ? $1 : 0;
}
# Forgets the events a reader has read (keeps the response header and
# what follows the last whole chunk).
sub forget {
    my ($sub) = @_;
    my $buf = $sub->{buf};
    my $at = index($buf, "\r\n\r\n");
    return if $at < 0;
    my $head = substr($buf, 0, $at + 4);
    $at += 4;
    while (1) {
        my $eol = index($buf, "\r\n", $at);
        last if $eol < 0;
        my $n = hex substr($buf, $at, $eol - $at);
        last if $n == 0 || length($buf) < $eol + 2 + $n + 2;
        $at = $eol + 2 + $n + 2;
    }
    $sub->{buf} = $head . substr($buf, $at);
}

# One worker with the http{} body given, and a reader of `$fast_path` that
# takes every event, once it is subscribed.
sub start_with_reader {
    my ($http, $fast_path) = @_;
    $port = nginx_start($http, workers => 1);
    wait_until(sub { ($worker) = nginx_workers() }, 5) or die 'no worker';
    @fast = (open_sse($port, $fast_path));
    pump(\@fast, stretch(5), subscribed(@fast));
}

# 1. sqldb_listen, one worker, a 4 MB bound: 15 subscribers that never
# read (group a), 30 events, 15 more (group b), then a burst of 300 events
# of 7,900 bytes (2.4 MB for each subscriber, 71 MB for all of them).
my $server = GatewayTest::pg_server_line('bounds');
# The sqldb_listen server of parts 1 and 2, with a worker's bound.
sub listen_http {
    my ($bound) = @_;
    return <<"HTTP";
upstream db { sqldb_server $server; }
sqldb_listen_buffers_max $bound;
server {
    listen 127.0.0.1:\$PORT sndbuf=32k;
    sqldb_listen_heartbeat 60s;
    location /events { sqldb_pass db; sqldb_listen \$arg_channel; }
    location = /metrics { gateway_status; }
}
HTTP
}
if (part(1)) {
start_with_reader(listen_http('4m'), '/events?channel=big&who=fast');
my @a = map { slow_sub("/events?channel=big&who=a$_") } 1 .. 15;
ok(wait_until(sub { subscribers($port, 'sqldb_listen') == 16 }, 10), 'a reader and 15 subscribers that do not read');
my $payload = 'x' x 7900;
psql("select pg_notify('big', i || '$payload') from generate_series(1, 30) i");
pump(\@fast, stretch(10), sub { events($fast[0]) >= 30 });
my @b = map { slow_sub("/events?channel=big&who=b$_") } 1 .. 15;
ok(wait_until(sub { subscribers($port, 'sqldb_listen') == 31 }, 10), '15 more that do not read');
forget($fast[0]);
$hwm0 = proc_status_kb($worker, 'VmHWM');
$rss0 = proc_status_kb($worker, 'VmRSS');
my $t0 = time;
psql("select pg_notify('big', i || '$payload') from generate_series(1, 300) i");
my $sent = time;
pump(\@fast, stretch(20), sub { events($fast[0]) >= 300 });
my $late = time - $sent;
@got = events($fast[0]);
is(scalar(@got), 300, 'the reader gets all 300 events');
is_deeply([map { /^big=(\d+)x/ ? $1 : -1 } @got], [1 .. 300], 'whole, in order');
cmp_ok($late, '<', stretch(3), sprintf('at once (the last %.2f s after the NOTIFY)', $late));
$grew = proc_status_kb($worker, 'VmHWM') - $hwm0;
unless_valgrind { cmp_ok($grew, '<', 24_000, "the worker's peak RSS grew by $grew kB (71 MB went to subscribers that do not read)") };
$dropped = drops('sqldb_listen', 'buffers_max');
cmp_ok($dropped, '>=', 15, "subscribers dropped at the bound: $dropped (the metric)");
$log = nginx_error_log();
@lines = $log =~ /^(.*sqldb: a subscriber \d+ bytes behind is dropped: sqldb_listen_buffers_max \(4194304\) is reached on this worker.*)$/mg;
is(scalar(@lines), $dropped, 'an info line each') and like($lines[0], qr/\[info\]/, 'at info');
my @who = map { /who=(\w)\d+/ ? $1 : '?' } @lines;
my $first_b = (grep { $who[$_] eq 'b' } 0 .. $#who)[0] // scalar(@who);
is(scalar(grep { $_ eq 'a' } @who[0 .. $first_b - 1]), 15, 'those furthest behind (group a) are dropped first: ' . join('', @who));
unlike($log, qr/who=fast.*dropped|dropped.*who=fast/, 'never the reader');
# Memory returns when they go.
close $_ for @a, @b;
ok(wait_until(sub { subscribers($port, 'sqldb_listen') == 1 }, 10), 'the others leave');
unless_valgrind {
    my $fell = wait_until(sub { ($after = proc_status_kb($worker, 'VmRSS')) < $rss0 + 8000 }, 10);
    ok($fell, "the worker's RSS falls back ($rss0 kB before, $after kB after)");
};
diag(sprintf('bound 4m: peak RSS +%d kB, reader late %.3f s, %d dropped', $grew, $late, $dropped));
unlike($log, qr/\[(alert|crit|emerg)\]|exited on signal/, 'no alert, no crash');
close $fast[0]{s};
stop_nginx();

}

# 2. The cost of an event does not grow with how far behind the slow
# subscribers are: 100 subscribers that never read, then six batches of
# 2,500 small events (so that nobody is dropped: 900 kB for each in the
# end, 90 MB for all of them, under a bound of 256 MB), each read whole by a reader before the next. The worker's CPU time
# for a batch is the same at the end, with 12,500 events waiting for each
# slow subscriber, as at the start: the cheapest of the last three
# batches costs less than twice the median of the first three (a walk of
# what waits, per event, would make every later batch about three times
# as dear; a batch's time also varies with how PostgreSQL's notifications
# happen to be cut into packets, and with the machine's other work, which
# only ever adds to it: hence the median, and the cheapest).
if (part(2)) {
start_with_reader(listen_http('256m'), '/events?channel=many');
my $n = 2500;
my @slow = map { slow_sub("/events?channel=many&who=s$_") } 1 .. 100;
ok(wait_until(sub { subscribers($port, 'sqldb_listen') == 101 }, 10), '100 subscribers that do not read');
my (@cost, @late);
for my $batch (1 .. 6) {
    forget($fast[0]);
    my $cpu0 = cpu_seconds($worker);
    psql("select pg_notify('many', '$batch.' || i || 'yyyyyyyyyyyyyyyyyyyy') from generate_series(1, $n) i");
    my $at = time;
    pump(\@fast, stretch(60), sub { events($fast[0]) >= $n });
    push @late, time - $at;
    push @cost, cpu_seconds($worker) - $cpu0;
    is(scalar(events($fast[0])), $n, "batch $batch: the reader gets all $n events");
}
is(drops('sqldb_listen', 'behind') + drops('sqldb_listen', 'buffers_max'), 0, 'nobody is dropped');
my $median = sub { (sort { $a <=> $b } @_)[1] };
my ($early, $later) = ($median->(@cost[0 .. 2]), (sort { $a <=> $b } @cost[3 .. 5])[0]);
diag(sprintf('worker CPU per batch of %d events: %s s; reader late: %s s', $n,
    join(' ', map { sprintf '%.2f', $_ } @cost), join(' ', map { sprintf '%.2f', $_ } @late)));
# (At least a clock tick for the first ones, so that the ratio means something.)
my $ratio = $later / ($early || 0.01);
unless_valgrind {
    cmp_ok($ratio, '<', 2, sprintf('an event costs the same with 12,500 waiting as with none: %.1fx (%.2f s, %.2f s)',
        $ratio, $early, $later));
};
cmp_ok((sort { $b <=> $a } @late)[0], '<', stretch(5), 'the reader has each batch within 5 s of the NOTIFYs');
close $_ for @slow;
ok(wait_until(sub { subscribers($port, 'sqldb_listen') == 1 }, 10), 'the slow ones leave');
close $fast[0]{s};
stop_nginx();

}

# 3. cache_subscribe, one worker, a 4 MB bound: 20 subscribers that never
# read, 40 messages of 256 KB (200 MB for all of them).
if (part(3)) {
my $redis = start_redis();
my $rport = $redis->{port};
start_with_reader(<<"HTTP", '/sub?channel=big&who=fast');
upstream red { server 127.0.0.1:$rport; }
cache_subscribe_buffers_max 4m;
server {
    listen 127.0.0.1:\$PORT sndbuf=32k;
    cache_subscribe_heartbeat 60s;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location = /metrics { gateway_status; }
}
HTTP
my @slow = map { slow_sub("/sub?channel=big&who=s$_") } 1 .. 20;
ok(wait_until(sub { subscribers($port, 'cache_subscribe') == 21 }, 10), 'a reader and 20 subscribers that do not read');
$hwm0 = proc_status_kb($worker, 'VmHWM');
$rss0 = proc_status_kb($worker, 'VmRSS');
my $big = 'z' x (256 * 1024);
my $rc = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $rport) or die $!;
forget($fast[0]);
for my $i (1 .. 40) {
    my $msg = "$i$big";
    print $rc "*3\r\n\$7\r\nPUBLISH\r\n\$3\r\nbig\r\n\$" . length($msg) . "\r\n$msg\r\n";
    pump(\@fast, stretch(10), sub { events($fast[0]) >= $i });
}
close $rc;
@got = events($fast[0]);
is_deeply([map { /^big=(\d+)(z+)$/ && length($2) == 262144 ? $1 : -1 } @got], [1 .. 40], 'the reader gets all 40 messages, whole, in order');
$grew = proc_status_kb($worker, 'VmHWM') - $hwm0;
unless_valgrind { cmp_ok($grew, '<', 24_000, "the worker's peak RSS grew by $grew kB (200 MB went to subscribers that do not read)") };
$dropped = drops('cache_subscribe', 'buffers_max');
cmp_ok($dropped, '>=', 10, "subscribers dropped at the bound: $dropped (the metric)");
$log = nginx_error_log();
@lines = $log =~ /^(.*\[info\].*cache: a subscriber \d+ bytes behind is dropped: cache_subscribe_buffers_max \(4194304\) is reached on this worker.*)$/mg;
is(scalar(@lines), $dropped, 'an info line each');
close $_ for @slow;
ok(wait_until(sub { subscribers($port, 'cache_subscribe') == 1 }, 10), 'the others leave');
unless_valgrind {
    my $fell = wait_until(sub { ($after = proc_status_kb($worker, 'VmRSS')) < $rss0 + 8000 }, 10);
    ok($fell, "the worker's RSS falls back ($rss0 kB before, $after kB after)");
};
diag(sprintf('cache, bound 4m: peak RSS +%d kB, %d dropped', $grew, $dropped));
unlike($log, qr/\[(alert|crit|emerg)\]|exited on signal/, 'no alert, no crash');
close $fast[0]{s};
stop_nginx();
}
done_testing();
