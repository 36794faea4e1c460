# cache_sentinel: a master, two replicas and three Sentinels, all real
# servers ($RedisServer --sentinel, so that TEST_REDIS_SERVER=valkey-server
# runs the same against Valkey). Discovery; SENTINEL FAILOVER by hand under
# load; the master killed under write and read load (acknowledged writes
# missing afterwards, requests that hung); a Sentinel down; a master cut off
# (stopped) and back as a replica, not written to; nginx -t's refusals.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw($RedisServer nginx_start stop_nginx nginx_error_log nginx_conf_test conf_line_of wait_until
    start_redis kill_redis redis_cli free_port stretch hold_port start_sentinel_set stop_sentinel workers_idle_ok
    sentinels_new_master redis_missing);
use HttpClient qw(http_request);
use File::Temp qw(tempdir);
use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(time);

my @sentinels;

# Each Sentinel knows the replicas and the others before anything is forced.
my ($master, $replicas, $set) = eval { start_sentinel_set() } or BAIL_OUT($@);
my @replicas = @$replicas;
push @sentinels, @$set;
my %by_port = map { ($_->{port} => $_) } $master, @replicas;

my $upstream = join '', map { "    server 127.0.0.1:$_->{port};\n" } @sentinels;
my $port = nginx_start(<<"HTTP", workers => 2);
upstream ha {
    cache_sentinel m;
$upstream}
server {
    listen 127.0.0.1:\$PORT;
    cache_connect_timeout 8s;
    cache_read_timeout 3s;
    location /kv/ { set \$cache_key \$uri; cache_pass ha; }
    location /off/ { set \$cache_key \$uri; cache_pass ha; cache_pipeline off; }
    location = /metrics { gateway_status; }
}
HTTP

# 1. Discovery.
my ($st) = http_request($port, 'PUT', '/kv/a', 'one');
is($st, 201, 'a PUT goes to the master the Sentinels name');
is(redis_cli($master, 'GET', '/kv/a'), 'one', 'and is on it');
my $body;
($st, $body) = http_request($port, 'GET', '/kv/a');
is("$st $body", '200 one', 'a GET');
like(nginx_error_log(), qr/\[notice\].*master of sentinel set "m" of upstream "ha" is 127\.0\.0\.1:$master->{port}/,
    'a notice names the master');
ok(wait_until(sub { (http_request($port, 'GET', '/off/a'))[0] == 404 }, 5), 'cache_pipeline off too (404: its own key)');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]/, 'no alert');
# At rest, the workers hold their watch of each Sentinel (SUBSCRIBE) and
# their connections to the master without spending CPU.
workers_idle_ok('two idle workers watching three Sentinels', sub { sleep shift });

# A load of writes and reads; each PUT's value is its number. Returns the
# statuses seen, the keys acknowledged, and the longest request (s), each
# request timed on its own.
sub load_until {
    my ($done, $prefix, $seconds) = @_;
    my (%statuses, @acked);
    my $longest = 0;
    my $deadline = time + stretch($seconds);
    my ($n, $after) = (0, 0);
    while (time < $deadline) {
        $n++;
        my $t = time;
        my ($s, undef, $head) = http_request($port, 'PUT', "/kv/$prefix$n", $n);
        my $t2 = time;
        my ($g) = http_request($port, 'GET', "/kv/$prefix" . ($n - 1 || 1));
        for my $took ($t2 - $t, time - $t2) {
            $longest = $took if $took > $longest;
        }
        $statuses{"PUT $s"}++;
        $statuses{"GET $g"}++;
        push @acked, "$prefix$n" if $s == 201;
        if ($s == 503) { like($head, qr/\r\nRetry-After: 1\b/i, '503 with Retry-After') if !$statuses{retry}++ }
        # 30 rounds more once the switch is done.
        $after++ if $done->();
        last if $after > 30;
    }
    return (\%statuses, \@acked, $longest);
}

# What a switch may cost a client, as cache.md promises it with
# cache_connect_timeout 8s and the retries of cache_next_upstream (error
# and timeout): no request fails, none waits longer than $bound seconds
# ($bound: 8 s, and cache_read_timeout before it for a master that stopped
# answering, and a second), and a read misses (404) only a write that a
# replica had not received when it was promoted (at most one).
sub answered_check {
    my ($what, $seen, $longest, $bound) = @_;
    diag("$what: " . join(', ', map { "$_: $seen->{$_}" } sort keys %$seen) . sprintf('; longest request %.2f s', $longest));
    my @bad = grep { !/^(PUT 201|GET 200|GET 404)$/ } keys %$seen;
    is("@bad", '', "$what: every write got 201 and every read 200 or 404 (no 5xx, none unanswered)");
    cmp_ok($seen->{'GET 404'} // 0, '<=', 1, "$what: a read misses at most the one write a replica had not received");
    cmp_ok($longest, '<', stretch($bound), "$what: no request waited $bound s or longer");
}


# Every write acknowledged before a failover and after the gateway followed
# it is on the new master. So are those acknowledged during it: from the
# moment a Sentinel selects the replica to promote, no request goes to the
# old master (they wait for the promoted one); at most one may be missing,
# a write the old master took in the last moment before the replica
# stopped reading it. (Unless the Sentinels failed over more than once: a
# second failover may promote a server that had not synced from the first
# one's master, which loses writes whatever a client does; it is shown.)
sub before_writes {
    my ($prefix) = @_;
    my @k = map { "$prefix$_" } 1 .. 50;
    my @st = map { (http_request($port, 'PUT', "/kv/$_", 'v'))[0] } @k;
    is_deeply(\@st, [(201) x 50], "50 writes before the failover ($prefix)");
    return @k;
}
sub window_check {
    my ($what, $on, $before, $acked, $during, $began) = @_;
    is(scalar(redis_missing($on, @$before)), 0, "$what: every write acknowledged before it is on the new master");
    my @after = @$acked[-30 .. -1];
    is(scalar(redis_missing($on, @after)), 0, "$what: every write acknowledged after the switch is on it");
    my @lost = redis_missing($on, @$acked);
    diag("$what: " . scalar(@lost) . " of " . scalar(@$acked) . " writes acknowledged during the switch are not on the new master"
        . sprintf(" (%g failovers)", (began() - ($began // 0)) / 2));
    my $failovers = (began() - $began) / 2;
    if ($during && $failovers > 1) {
        diag("$what: the Sentinels failed over $failovers times");
    } elsif ($during) {
        cmp_ok(scalar(@lost), '<=', 1, "$what: the writes acknowledged during the switch are on the new master");
    }
}

sub switches { () = nginx_error_log() =~ /switched from/g }
# Failovers begun, as each worker heard of them.
sub began { () = nginx_error_log() =~ /a failover of sentinel set "m" of upstream "ha" began/g }

# 2. SENTINEL FAILOVER by hand, under load.
my $old = $master->{port};
my @before = before_writes('bf');
my $began = began();
redis_cli($sentinels[1], 'SENTINEL', 'FAILOVER', 'm');
my ($seen, $acked, $longest) = load_until(sub { switches() >= 2 }, 'f', 30);
my $new = sentinels_new_master($old, @sentinels);
isnt($new, $old, 'the Sentinels promoted a replica');
like(nginx_error_log(), qr/\[notice\].*master of sentinel set "m" of upstream "ha" switched from 127\.0\.0\.1:$old to 127\.0\.0\.1:$new/,
    'each worker says so at notice');
cmp_ok(scalar(@$acked), '>', 30, 'writes went on');
answered_check('SENTINEL FAILOVER', $seen, $longest, 9);
window_check('SENTINEL FAILOVER', $by_port{$new}, \@before, $acked, 'during', $began);
like(nginx_error_log(), qr/\[notice\].*a failover of sentinel set "m" of upstream "ha" began: requests wait for the new master/,
    'each worker says when a failover begins');
($st) = http_request($port, 'PUT', '/kv/after', 'x');
is($st, 201, 'a write after the switch');
is(redis_cli($by_port{$new}, 'GET', '/kv/after'), 'x', 'on the new master');
(undef, $body) = http_request($port, 'GET', '/metrics');
like($body, qr/ngx_gateway_cache_sentinel_switches_total\{upstream="ha",set="m"\} 2\b/, 'switches counted (each worker)');
like($body, qr/ngx_gateway_cache_sentinel_master\{upstream="ha",set="m",master="127\.0\.0\.1:$new"\} 2\b/,
    'the current master of both workers');
like($body, qr/master="127\.0\.0\.1:$old"\} 0\b/, 'the old one of none');

# 3. The master killed under load.
$old = $new;
kill_redis($by_port{$old});
hold_port($old);
my $t0 = time;
($seen, $acked, $longest) = load_until(sub { switches() >= 4 }, 'k', 40);
$new = sentinels_new_master($old, @sentinels);
isnt($new, $old, 'a replica took over from the killed master');
diag(sprintf('master killed: %.1f s in all', time - $t0));
# (scaling.md: with the master killed under load no request failed.)
answered_check('master killed', $seen, $longest, 9);
my @lost = redis_missing($by_port{$new}, @$acked);
diag("acknowledged writes missing on the new master: " . scalar(@lost) . " of " . scalar(@$acked) . " (@lost)");
# (Asynchronous replication: a write acknowledged in the last moment before
# the kill may not have reached the replica; on loopback that is rare.)
cmp_ok(scalar(@lost), '<=', 1, 'acknowledged writes are on the new master (but at most the last)');
is(scalar(redis_missing($by_port{$new}, @$acked[-30 .. -1])), 0, 'every write acknowledged after the switch is on it');

# 4. A Sentinel down: the others are asked, and a switch is still followed.
my $stopped = shift @sentinels;
stop_sentinel($stopped);
($st) = http_request($port, 'PUT', '/kv/s', 'y');
is($st, 201, 'writes go on with a Sentinel down');
$old = $new;
@before = before_writes('bs');
$began = began();
# (Once a replica has every write of the master, ROLE says: a replica still
# in its first sync after the kill above would be promoted without them.
# The Sentinel refuses, NOGOODSLAVE, until it sees a replica it can use.)
ok(wait_until(sub {
    my ($role, $offset, @replicas) = split /\n/, redis_cli($by_port{$old}, 'ROLE');
    my @offsets = @replicas[map { 3 * $_ + 2 } 0 .. int(@replicas / 3) - 1];
    $role eq 'master' && grep({ $_ >= $offset } @offsets);
}, 20), 'a replica of the master has its writes');
ok(wait_until(sub { redis_cli($sentinels[0], 'SENTINEL', 'FAILOVER', 'm') eq 'OK' }, 20),
    'a failover with one Sentinel down begins');
($seen, $acked, $longest) = load_until(sub { switches() >= 6 }, 's', 30);
$new = sentinels_new_master($old, @sentinels);
isnt($new, $old, 'failed over with one Sentinel down');
window_check('FAILOVER, a Sentinel down', $by_port{$new}, \@before, $acked, 'during', $began);
answered_check('FAILOVER, a Sentinel down', $seen, $longest, 9);
ok(wait_until(sub { nginx_error_log() =~ /\[notice\].*sentinel 127\.0\.0\.1:\d+ of upstream "ha" cannot be reached/ }, 5),
    'a notice for the Sentinel that cannot be reached');

# 5. The master cut off (stopped), a replica promoted; it comes back as a
# replica and is not written to.
$old = $new;
kill 'STOP', $by_port{$old}{pid};
($seen, $acked, $longest) = load_until(sub { switches() >= 8 }, 'p', 40);
$new = sentinels_new_master($old, @sentinels);
isnt($new, $old, 'a replica took over from the stopped master');
# (The request the stopped master held waits cache_read_timeout, 3 s, then
# goes on to the new master: 3 + 8 + 1 s at most.)
answered_check('master stopped', $seen, $longest, 12);
@lost = redis_missing($by_port{$new}, @$acked);
diag("master stopped: acknowledged writes missing on the new master: " . scalar(@lost) . " of " . scalar(@$acked) . " (@lost)");
cmp_ok(scalar(@lost), '<=', 1, 'master stopped: acknowledged writes are on the new master (but at most the last)');
is(scalar(redis_missing($by_port{$new}, @$acked[-30 .. -1])), 0, 'master stopped: every write acknowledged after the switch is on it');
kill 'CONT', $by_port{$old}{pid};
ok(wait_until(sub { redis_cli($by_port{$old}, 'ROLE') =~ /^slave/ }, 20), 'the old master came back as a replica');
my $mark = length nginx_error_log();
my @w = map { (http_request($port, 'PUT', "/kv/late$_", $_))[0] } 1 .. 20;
is_deeply(\@w, [(201) x 20], 'writes after it came back');
is(scalar(redis_missing($by_port{$new}, map { "late$_" } 1 .. 20)), 0, 'on the new master');
unlike(substr(nginx_error_log(), $mark), qr/READONLY/, 'none went to the old master (no READONLY)');
# (The Sentinel stopped in section 4 is still down, through a switch and
# many questions: each worker told it once.)
my $told = () = nginx_error_log() =~ /\[notice\].*sentinel 127\.0\.0\.1:$stopped->{port} of upstream "ha" cannot be reached/g;
cmp_ok($told, '<=', 2, "the Sentinel down is told once per worker, not at each try ($told)");
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]|exited on signal/, 'no alert, no crash');
stop_nginx();

# 6. nginx -t.
my $s1 = $sentinels[0]{port};
my @bad_conf = (
    [qq{upstream x { cache_sentinel m; }\nserver { listen 127.0.0.1:\$PORT; location / { set \$cache_key a; cache_pass x; } }},
        qr/no servers are inside upstream|"cache_sentinel" in upstream "x" with no "server" lines/, 'cache_sentinel m;'],
    [qq{upstream x { cache_cluster on; cache_sentinel m; server 127.0.0.1:$s1; }\nserver { listen 127.0.0.1:\$PORT; }},
        qr/"cache_sentinel" and "cache_cluster on" in one upstream block/, 'cache_sentinel m;'],
    [qq{server { listen 127.0.0.1:\$PORT; location / { cache_sentinel m; } }},
        qr/"cache_sentinel" directive is not allowed here/, 'cache_sentinel m;'],
    [qq{upstream x { cache_sentinel_auth pw; server 127.0.0.1:$s1; }\nserver { listen 127.0.0.1:\$PORT; }},
        qr/"cache_sentinel_auth" without "cache_sentinel"/, 'cache_sentinel_auth pw;'],
    [qq{upstream x { keepalive 4; cache_sentinel m; server 127.0.0.1:$s1; }\nserver { listen 127.0.0.1:\$PORT; }},
        qr/"cache_sentinel" must come before "keepalive"/, 'cache_sentinel m;'],
);
for my $c (@bad_conf) {
    my ($http, $re, $line) = @$c;
    eval { nginx_start($http) };
    my $out = nginx_conf_test();
    like($out, $re, "nginx -t: $re");
    like(conf_line_of($out), qr/\Q$line\E/, '... naming the directive\'s line');
    stop_nginx();
}

done_testing();
