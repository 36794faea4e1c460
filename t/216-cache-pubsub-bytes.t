# cache_subscribe, bounded in bytes: a hostile reply of many tiny elements
# on the subscribing connection, in small pieces, is scanned once (linear
# in its bytes) and costs the worker little, and only that connection.
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump);
use GatewayTest qw(http_request nginx_start nginx_error_log start_redis redis_cli stretch nginx_workers proc_status_kb);
use FakeRedis;
use Test::More;
use Time::HiRes qw(sleep time);

my $redis = start_redis();
my $rport = $redis->{port};

# A Redis that confirms the subscription, then sends `*N` and N empty
# statuses (just under the message bound in what they would hold).
my $tiny = 230_000;
my $fake = FakeRedis->start(sub {
    my ($conn, $n, $cmd, @args) = @_;
    return () unless uc $cmd eq 'SUBSCRIBE';
    my $all = "*$tiny\r\n" . ("+\r\n" x $tiny);
    return (['send', "*3\r\n\$9\r\nsubscribe\r\n\$" . length($args[0]) . "\r\n$args[0]\r\n:1\r\n"],
        map { (['send', substr($all, $_ * 4096, 4096)], ['sleep', 0.002]) } 0 .. int(length($all) / 4096));
});

my $port = nginx_start(<<"HTTP", workers => 1);
upstream red { server 127.0.0.1:$rport; }
upstream fake { server 127.0.0.1:@{[ $fake->port ]}; }
server {
    listen 127.0.0.1:\$PORT;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /fsub { cache_pass fake; cache_subscribe c; }
    location /kv/ { set \$cache_key \$uri; cache_pass red; }
}
HTTP
my ($worker) = nginx_workers();
redis_cli($redis, 'set', '/kv/plain', 'hello');

sub get_ms {
    my $t0 = time;
    my ($status) = http_request($port, 'GET', '/kv/plain');
    return ($status, 1000 * (time - $t0));
}

sub cpu_ms {
    open my $f, '<', "/proc/$worker/stat" or return 0;
    my @f = split ' ', (split /\)/, scalar <$f>)[1];
    return ($f[11] + $f[12]) * 10;
}

# 1. A hostile reply, in 4 kB pieces: each piece is looked at once (the
# whole reply was parsed again at each read: some 100 ms of the worker's
# time per reply, and more the finer the pieces), the connection is closed
# (and made again, to get the same), the worker's memory stays under the
# bound of a message, and other requests do not wait.
{
    my ($hwm0, $cpu0) = (proc_status_kb($worker, 'VmHWM'), cpu_ms());
    my $f = open_sse($port, '/fsub');
    my ($worst, $served) = (0, 0);
    my $until = time + stretch(20);
    while (time < $until && grep({ /SUBSCRIBE/ } $fake->log_lines) < 3) {
        pump([$f], 0.2);
        my ($status, $ms) = get_ms();
        $served++ if $status == 200;
        $worst = $ms if $ms > $worst;
    }
    close $f->{s};
    my ($hwm, $cpu) = (proc_status_kb($worker, 'VmHWM'), cpu_ms() - $cpu0);
    my $sent = grep { /SUBSCRIBE/ } $fake->log_lines;
    ok($sent >= 2, "the hostile reply was sent, and again after the connection was made again ($sent times)");
    cmp_ok($cpu / ($sent || 1), '<', stretch(50), "each costs the worker little time (${cpu} ms of CPU for $sent)");
    cmp_ok($hwm - $hwm0, '<', 20_000, "and less than 20 MB of memory (peak RSS +@{[ $hwm - $hwm0 ]} kB)");
    cmp_ok($served, '>', 3, "GETs are served meanwhile ($served)");
    cmp_ok($worst, '<', stretch(500), sprintf('the slowest took %.0f ms', $worst));
    like(nginx_error_log(), qr/subscribing connection to 127\.0\.0\.1:\d+ of upstream "fake".*redis sent an array that is not a message/,
        'the connection is closed, saying why');
}

done_testing();
