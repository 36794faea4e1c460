# A confirmed master turned into a replica behind the Sentinels' back
# (REPLICAOF sent to it directly, naming one of its own replicas): a master
# set "m" of real servers and three Sentinels. The next write gets
# -READONLY; the gateway takes the confirmation back and asks the
# Sentinels again, who still name that server, whose ROLE now says slave:
# no master is confirmed, and writes get 503 with Retry-After after
# cache_connect_timeout, none waiting longer. A Sentinel finds a master
# that says it is a replica down after down-after-milliseconds and two
# INFO periods (SENTINEL DEBUG info-period 300 here, instead of 10 s), and
# fails over; the gateway follows the switch, and writes are acknowledged
# again on the new master, which has every write acknowledged before and
# after. The log shows each step.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log wait_until redis_cli stretch start_sentinel_set
    sentinels_new_master redis_missing timed_request);
use HttpClient qw(http_request);
use Test::More;
use Time::HiRes qw(time);

my ($master, $replicas, $set) = eval { start_sentinel_set() } or BAIL_OUT($@);
my @sentinels = @$set;
my %by_port = map { ($_->{port} => $_) } $master, @$replicas;
my $old = $master->{port};

# (SENTINEL DEBUG: Redis 7 and Valkey.)
for my $s (@sentinels) {
    is(redis_cli($s, 'SENTINEL', 'DEBUG', 'info-period', 300), 'OK', "Sentinel $s->{port} reads INFO every 300 ms");
}

my $upstream = join '', map { "    server 127.0.0.1:$_->{port};\n" } @sentinels;
my $port = nginx_start(<<"HTTP", workers => 1);
upstream ha {
    cache_sentinel m;
$upstream}
server {
    listen 127.0.0.1:\$PORT;
    cache_connect_timeout 1s;
    cache_read_timeout 2s;
    location /kv/ { set \$cache_key \$uri; cache_pass ha; }
}
HTTP

my @acked;
my @before = map { "b$_" } 1 .. 30;
my @st = map { (timed_request($port, 'PUT', "/kv/$_", 'v'))[0] } @before;
is_deeply(\@st, [(201) x 30], '30 writes on the master the Sentinels name');
push @acked, @before;
like(nginx_error_log(), qr/\[notice\].*master of sentinel set "m" of upstream "ha" is 127\.0\.0\.1:$old\b/, 'it is confirmed');

# The master follows its first replica now (which has its writes: it
# continues from there). The Sentinels are not told.
my $first = $replicas->[0]{port};
ok(wait_until(sub { redis_cli($replicas->[0], 'INFO', 'replication') =~ /master_repl_offset:(\d+)/
    && $1 == (redis_cli($master, 'INFO', 'replication') =~ /master_repl_offset:(\d+)/)[0] }, 5),
    'the replica has every write of the master');
my $t0 = time;
is(redis_cli($master, 'REPLICAOF', '127.0.0.1', $first), 'OK', 'REPLICAOF sent to the master');
like(redis_cli($master, 'ROLE'), qr/^slave\n127\.0\.0\.1\n$first\n/, 'it says it is a replica now');

# Writes until the gateway followed a switch, and 20 after it.
my (%seen, @during, $longest, $retry_after_missing, $switched_at);
$longest = 0;
my ($n, $after) = (0, 0);
my $deadline = time + stretch(30);
while (time < $deadline && $after < 20) {
    $n++;
    my ($s, $head, $took) = timed_request($port, 'PUT', "/kv/w$n", $n);
    $seen{$s}++;
    $longest = $took if $took > $longest;
    push @acked, "w$n" if $s == 201;
    push @during, [$n, $s];
    $retry_after_missing++ if $s == 503 && $head !~ /\r\nRetry-After: 1\b/i;
    if (!$switched_at && nginx_error_log() =~ /switched from 127\.0\.0\.1:$old to/) {
        $switched_at = time;
    }
    $after++ if $switched_at;
}
diag(sprintf('writes: %s; longest %.2f s; the switch %.1f s after REPLICAOF',
    join(', ', map { "$_: $seen{$_}" } sort keys %seen), $longest, ($switched_at // time) - $t0));
ok($switched_at, 'the gateway followed a switch');
my $log = nginx_error_log();
like($log, qr/\[warn\].*READONLY.*from redis 127\.0\.0\.1:$old\b/, 'a write got READONLY from the old master');
like($log, qr/\[info\].*the master 127\.0\.0\.1:$old of sentinel set "m" of upstream "ha": it cannot take writes \(READONLY\); asking the Sentinels again/,
    'its confirmation is taken back, and the Sentinels asked again');
like($log, qr/\[info\].*127\.0\.0\.1:$old, named master of sentinel set "m" of upstream "ha", is not confirmed: ROLE says "slave"/,
    'they name it still, and ROLE says it is a replica: not confirmed');
like($log, qr/\[error\].*no master of sentinel set "m" of upstream "ha" was confirmed within 1000 ms \(cache_connect_timeout\)/,
    'meanwhile writes wait for a master, then give up');
is(scalar(grep { !/^(201|503)$/ } keys %seen), 0, 'every write got 201 or 503');
cmp_ok($seen{503} // 0, '>=', 1, 'some writes got 503 while no master was confirmed');
ok(!$retry_after_missing, 'each 503 with Retry-After: 1');
cmp_ok($longest, '<', stretch(2.5), 'none waited longer than cache_connect_timeout (1 s), and a margin');
# Once the switch is followed, every write is acknowledged.
my @late = grep { $_->[1] != 201 } @during[-19 .. -1];
is(scalar(@late), 0, 'the writes after the switch got 201');

my $new = sentinels_new_master($old, @sentinels);
isnt($new, $old, 'the Sentinels failed over');
diag("the Sentinels promoted $new; the old master had been made a replica of $first");
like($log, qr/\[notice\].*master of sentinel set "m" of upstream "ha" switched from 127\.0\.0\.1:$old to 127\.0\.0\.1:$new\b/,
    'to the server they promoted');
my $sentinel_log = do { local (@ARGV, $/) = ("$sentinels[0]{dir}/sentinel.log"); <> };
like($sentinel_log, qr/\+sdown master m 127\.0\.0\.1 $old\b/, 'a Sentinel found the master that said it is a replica down');
like(redis_cli($by_port{$new}, 'ROLE'), qr/^master/, 'the new master says so');
my @lost = redis_missing($by_port{$new}, @acked);
is(scalar(@lost), 0, 'every write acknowledged, before and after, is on the new master (' . scalar(@acked) . ')')
    or diag("missing: @lost");

# The old master ends a replica of the new one (the Sentinels set it so);
# writes go on with no READONLY.
ok(wait_until(sub { redis_cli($master, 'ROLE') =~ /^slave\n127\.0\.0\.1\n$new\n/ }, 20),
    'the old master follows the new one');
my $mark = length nginx_error_log();
@st = map { (timed_request($port, 'PUT', "/kv/z$_", 'v'))[0] } 1 .. 10;
is_deeply(\@st, [(201) x 10], 'writes go on');
unlike(substr(nginx_error_log(), $mark), qr/READONLY/, 'none went to the old master');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]|exited on signal/, 'no alert, no crash');
stop_nginx();

done_testing();
