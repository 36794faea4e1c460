# cache_target with cache_sentinel: reads from the replicas the Sentinels
# list, writes on the master. A master, two replicas and three Sentinels,
# all real servers; where each GET ran is counted with INFO commandstats on
# each server. A replica that stops answering is left out, so is every
# replica for a lag bound no replica meets; with a replica killed
# prefer-replica still serves, with none usable replica answers 503 with
# Retry-After and prefer-replica reads from the master; nginx -t refuses
# cache_target replica to an upstream without cache_sentinel.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log nginx_conf_test conf_line_of wait_until kill_redis
    redis_cli stretch hold_port start_sentinel_set);
use HttpClient qw(http_request);
use Test::More;
use Time::HiRes qw(sleep time);

my ($master, $replicas, $set) = eval { start_sentinel_set() } or BAIL_OUT($@);
my @replicas = @$replicas;
my @sentinels = @$set;

my $upstream = join '', map { "    server 127.0.0.1:$_->{port};\n" } @sentinels;
my $port = nginx_start(<<"HTTP", workers => 1);
upstream ha {
    cache_sentinel m;
$upstream    keepalive 8;
}
server {
    listen 127.0.0.1:\$PORT;
    cache_connect_timeout 3s;
    cache_read_timeout 1s;
    set \$cache_key /k;
    location /m/ { cache_pass ha; }
    location /r/ { cache_pass ha; cache_target replica; cache_replica_max_lag 3s; }
    location /p/ { cache_pass ha; cache_target prefer-replica; }
    location /tight/ { cache_pass ha; cache_target prefer-replica; cache_replica_max_lag 1ms; }
    location /roff/ { cache_pass ha; cache_target replica; cache_pipeline off; }
    location /moff/ { cache_pass ha; cache_pipeline off; }
    location /slow/ { cache_pass ha; cache_target replica; cache_read_timeout 30s; }
    location /proxy/ { proxy_pass http://ha; }
}
HTTP

# GET calls a server ran since its last CONFIG RESETSTAT.
sub gets {
    my ($r) = @_;
    my ($n) = redis_cli($r, 'INFO', 'commandstats') =~ /^cmdstat_get:calls=(\d+)/m;
    return $n // 0;
}
# The clients of a server that are not Sentinels, replication links, the
# gateway's probes (ROLE) or this test's redis-cli: the connections the
# gateway's requests use.
sub gateway_clients {
    my ($r) = @_;
    return scalar grep { /\bflags=N\b/ && !/\bname=sentinel/ && !/\bcmd=(client\|list|role|NULL)\b/ }
        split /\n/, redis_cli($r, 'CLIENT', 'LIST');
}
sub reset_stats { redis_cli($_, 'CONFIG', 'RESETSTAT') for @_ }
sub get_n {
    my ($path, $n) = @_;
    my %st;
    $st{ (http_request($port, 'GET', $path))[0] }++ for 1 .. $n;
    return join ' ', map { "$_:$st{$_}" } sort keys %st;
}

# 1. A write with cache_target replica goes to the master.
my ($st) = http_request($port, 'PUT', '/r/', 'v');
is($st, 201, 'a PUT to a location of cache_target replica: 201 (a replica would refuse it, READONLY)');
is(redis_cli($master, 'GET', '/k'), 'v', 'the write is on the master');
ok(wait_until(sub { !grep { redis_cli($_, 'GET', '/k') ne 'v' } @replicas }, 5), 'and replicated');
ok(wait_until(sub { (http_request($port, 'GET', '/r/'))[0] == 200 }, 5), 'the replicas are probed and usable');

# (Another module's request to the block would go to a Sentinel.)
($st) = http_request($port, 'GET', '/proxy/');
is($st, 500, 'proxy_pass to the block: 500');
like(nginx_error_log(), qr/\[error\].*upstream "ha" has "cache_sentinel": its servers are Sentinels, and only "cache_pass" can pass to it/,
    'with a line that says why');

# 2. Reads go to the replicas, in turn; cache_target master's to the master.
reset_stats($master, @replicas);
is(get_n('/r/', 40), '200:40', 'cache_target replica: 40 reads');
is(gets($master), 0, 'none ran on the master');
is(gets($replicas[0]) + gets($replicas[1]), 40, 'all on the replicas');
ok(gets($replicas[0]) >= 10 && gets($replicas[1]) >= 10, 'on both (' . gets($replicas[0]) . ' and ' . gets($replicas[1]) . ')');
reset_stats($master, @replicas);
is(get_n('/m/', 20), '200:20', 'the default (master): 20 reads');
is(gets($master), 20, 'on the master');
is(gets($replicas[0]) + gets($replicas[1]), 0, 'none on a replica');
reset_stats($master, @replicas);
is(get_n('/p/', 20), '200:20', 'prefer-replica: 20 reads');
is(gets($replicas[0]) + gets($replicas[1]), 20, 'on the replicas');

# 3. A lag bound no replica meets (1 ms: a replica is known to hold the
# master's writes only as of the last probe round, up to 500 ms ago):
# prefer-replica reads from the master. (A read in the very millisecond of
# a round may still find one within the bound.)
reset_stats($master, @replicas);
is(get_n('/tight/', 10), '200:10', 'prefer-replica with cache_replica_max_lag 1ms: 10 reads');
cmp_ok(gets($master), '>=', 9, 'on the master: no replica is within the bound');

# 4. A replica that stops answering (SIGSTOP) is left out once a probe
# round finds it silent; the reads go to the other one. A read already on
# its way there goes on to the other one then, not after
# cache_read_timeout (30 s in /slow/).
kill 'STOP', $replicas[0]{pid};
my ($worst, @slow) = (0);
for (1 .. 4) {
    my $t = time;
    push @slow, (http_request($port, 'GET', '/slow/'))[0];
    $worst = time - $t if time - $t > $worst;
}
is("@slow", '200 200 200 200', 'a replica stopped: reads in turn still served');
cmp_ok($worst, '<', stretch(5), 'the read sent to it went on to the other replica once a probe found it silent');
sleep(stretch(1.5));
reset_stats($master, $replicas[1]);
is(get_n('/r/', 20), '200:20', 'a replica stopped: 20 reads');
is(gets($replicas[1]), 20, 'all on the other replica');
kill 'CONT', $replicas[0]{pid};
ok(wait_until(sub {
    reset_stats($replicas[0]);
    get_n('/r/', 6);
    gets($replicas[0]) > 0;
}, 10), 'the replica takes reads again once it answers');

# 5. A replica killed: prefer-replica and replica still serve from the other.
kill_redis($replicas[0]);
hold_port($replicas[0]{port});
is(get_n('/p/', 20), '200:20', 'a replica killed: prefer-replica serves');
is(get_n('/r/', 20), '200:20', 'and replica from the other one');

# 6. No usable replica: replica gets 503 with Retry-After (502 with
# cache_pipeline off), prefer-replica reads from the master.
kill 'STOP', $replicas[1]{pid};
sleep(stretch(1.5));
my (undef, undef, $head);
($st, undef, $head) = http_request($port, 'GET', '/r/');
is($st, 503, 'no replica usable: cache_target replica answers 503');
like($head, qr/\r\nRetry-After: 1\b/i, 'with Retry-After');
like(nginx_error_log(), qr/\[error\].*no replica of sentinel set "m" of upstream "ha" is usable now \(cache_target replica\)/, 'and says why');
($st, undef, $head) = http_request($port, 'GET', '/roff/');
is($st, 502, 'cache_pipeline off: 502');
like($head, qr/\r\nRetry-After: 1\b/i, 'with Retry-After too');
reset_stats($master);
is(get_n('/p/', 10), '200:10', 'prefer-replica: 10 reads');
is(gets($master), 10, 'from the master');
($st) = http_request($port, 'PUT', '/r/', 'w');
is($st, 201, 'writes go on');
kill 'CONT', $replicas[1]{pid};

# 7. SENTINEL FAILOVER with reads and writes going on: the Sentinels tell
# +slave and -sdown of the replicas meanwhile, and the replicas are asked
# for again, not the master (a Sentinel that has not heard of the switch
# still names the old one, which says master until it is made a replica):
# the switch is followed once, no acknowledged write is lost, and the old
# master, a replica now, takes reads. With cache_pipeline off, a request
# while no master is confirmed gets 502 with Retry-After, and the
# connections keepalive kept to the old master are closed.
ok(wait_until(sub { redis_cli($replicas[1], 'INFO', 'replication') =~ /master_link_status:up/ }, 10), 'the replica is back in sync');
# (Connections to the master that nginx's keepalive keeps, with
# cache_pipeline off: they go when the master does.)
is(get_n('/moff/', 4), '200:4', 'cache_pipeline off: reads from the master');
cmp_ok(gateway_clients($master), '>=', 1, 'and a connection to it is kept');
ok(wait_until(sub { redis_cli($sentinels[0], 'SENTINEL', 'FAILOVER', 'm') eq 'OK' }, 20), 'SENTINEL FAILOVER');
my (@acked, %seen, @no_retry);
my ($n, $after, $deadline) = (0, 0, time + stretch(30));
while (time < $deadline && $after < 40) {
    $n++;
    my ($w) = http_request($port, 'PUT', "/r/", "f$n");
    push @acked, $n if $w == 201;
    $seen{"PUT $w"}++;
    $seen{ 'GET ' . (http_request($port, 'GET', '/p/'))[0] }++;
    my ($o, undef, $h) = http_request($port, 'GET', '/moff/');
    $seen{"GET off $o"}++;
    push @no_retry, $o if $o != 200 && $h !~ /\r\nRetry-After: 1\b/i;
    # (40 rounds more once the switch is followed, while the Sentinels
    # tell of the replicas.)
    $after++ if $after || nginx_error_log() =~ /switched from/;
}
diag('during the failover: ' . join(', ', map { "$_: $seen{$_}" } sort keys %seen));
ok(wait_until(sub { redis_cli($replicas[1], 'ROLE') =~ /^master/ }, 10), 'the replica was promoted');
my $switches = () = nginx_error_log() =~ /switched from/g;
is($switches, 1, 'the switch is followed once (never back to the old master)');
is(redis_cli($replicas[1], 'GET', '/k'), "f$acked[-1]", 'the last acknowledged write is on the new master');
is(scalar(grep { !/^(PUT 201|GET 200|GET off (200|502))$/ } keys %seen), 0,
    'every read and write succeeded (with cache_pipeline off, 502 while no master is confirmed)');
is("@no_retry", '', 'each 502 says when to ask again (Retry-After)');
ok(wait_until(sub { gateway_clients($master) == 0 }, 5),
    'no connection of the gateway is left on the old master (shared or kept by keepalive)')
    or diag(redis_cli($master, 'CLIENT', 'LIST'));
ok(wait_until(sub {
    reset_stats($master);
    get_n('/r/', 6);
    gets($master) > 0;
}, 15), 'the old master, a replica now, takes reads')
    or diag("old master ROLE: " . redis_cli($master, 'ROLE') . "\nSENTINEL replicas: "
        . redis_cli($sentinels[0], 'SENTINEL', 'REPLICAS', 'm') . "\nerror log:\n" . substr(nginx_error_log(), -3000));
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]|exited on signal/, 'no alert, no crash');
stop_nginx();

# 8. nginx -t.
my $s1 = $sentinels[0]{port};
for my $c (
    ["upstream plain { server 127.0.0.1:$master->{port}; }\nserver { listen 127.0.0.1:\$PORT; set \$cache_key a;\n"
        . "location / { cache_target replica;\ncache_pass plain; } }",
        qr/"cache_target replica" needs "cache_pass" to name an upstream of "cache_sentinel"/, 'cache_pass plain;'],
    ["server { listen 127.0.0.1:\$PORT; set \$cache_key a; cache_target prefer-replica;\n"
        . "location / { cache_pass \$arg_u; } }",
        qr/"cache_target prefer-replica" needs "cache_pass" to name an upstream of "cache_sentinel"/, 'cache_pass $arg_u;'],
    ["server { listen 127.0.0.1:\$PORT; location / { cache_target standby; } }",
        qr/invalid value "standby" in "cache_target" directive/, 'cache_target standby;'],
    ["upstream s { cache_sentinel m;\nserver 127.0.0.1:$s1;\nserver 127.0.0.1:1 backup; }\n"
        . "server { listen 127.0.0.1:\$PORT; location / { set \$cache_key a; cache_pass s; } }",
        qr/"backup" in the "server 127\.0\.0\.1:1" line of upstream "s", an upstream of "cache_sentinel"/, 'cache_sentinel m;'],
    ["upstream s { cache_sentinel m;\nserver 127.0.0.1:$s1 weight=3; }\n"
        . "server { listen 127.0.0.1:\$PORT; location / { set \$cache_key a; cache_pass s; } }",
        qr/"weight=" in the "server 127\.0\.0\.1:$s1" line of upstream "s"/, 'cache_sentinel m;'],
    ["upstream s { cache_sentinel m;\nserver 127.0.0.1:$s1 down; }\n"
        . "server { listen 127.0.0.1:\$PORT; location / { set \$cache_key a; cache_pass s; } }",
        qr/"down" in the "server 127\.0\.0\.1:$s1" line of upstream "s"/, 'cache_sentinel m;'],
    ["upstream s { cache_sentinel m;\nserver unix:/tmp/no-such-sentinel.sock; }\n"
        . "server { listen 127.0.0.1:\$PORT; location / { set \$cache_key a; cache_pass s; } }",
        qr/"cache_sentinel" in upstream "s" with no "server" lines of an IP address/, 'cache_sentinel m;'],
) {
    my ($http, $re, $line) = @$c;
    eval { nginx_start($http) };
    my $out = nginx_conf_test();
    like($out, $re, "nginx -t: $re");
    like(conf_line_of($out), qr/\Q$line\E/, '... naming the line');
    stop_nginx();
}

done_testing();
