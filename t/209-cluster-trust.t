# cache_cluster: only the upstream's configured servers say what the cluster
# is. A real Redis Cluster of three masters (with a password) sits behind a
# configured seed that is scripted (so that its map can name a hostile node
# beside the real masters, and leave a real master out until a
# "resharding"). The hostile node redirects to a victim (a listener of this
# test that records every byte) and would map every slot to it: the victim
# gets nothing, not even AUTH; the client gets 502; one log line names the
# victim; later requests still go to the real masters. A node that answers
# garbage makes the next request ask the seed for a new map. cache_stream
# refuses the same redirection for a stream (the stream ends). A real master
# that the map did not know is followed once the seed's map names it.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw($RedisServer $RedisCli nginx_start stop_nginx nginx_error_log start_redis redis_cli free_port wait_until key_slot redis_connections listen_socket);
use HttpClient qw(keepalive_requests);
use FakeRedis;
use SseClient qw(open_sse pump body subscribed);
use Test::More;
use IO::Socket::INET;
use POSIX ();
use File::Temp qw(tempdir);

my $tmp = tempdir('ngx-gateway-trust-XXXXXX', TMPDIR => 1, CLEANUP => 1);

# The victim: accepts connections and writes down every byte it gets.
sub start_victim {
    my $l = listen_socket(16);
    my $file = "$tmp/victim";
    open my $fh, '>', $file or die $!;
    close $fh;
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if (!$pid) {
        setpgrp(0, 0);
        $SIG{CHLD} = 'IGNORE';
        while (my $c = $l->accept) {
            my $child = fork;
            if (defined $child && !$child) {
                open my $out, '>>', $file or POSIX::_exit(1);
                syswrite $out, "connection\n";
                while (sysread($c, my $chunk, 65536)) { syswrite $out, $chunk }
                POSIX::_exit(0);
            }
            close $c;
        }
        POSIX::_exit(0);
    }
    my $port = $l->sockport;
    close $l;
    return { port => $port, pid => $pid, file => $file };
}
my @victims;
END { kill 'KILL', -$_->{pid} for @victims }

sub victim_got {
    my ($v) = @_;
    open my $fh, '<', $v->{file} or return '';
    local $/;
    return <$fh> // '';
}

# The real cluster.
my $secret = 'trust-secret';
my @nodes = map {
    start_redis(password => $secret, args => ['--cluster-enabled', 'yes', '--cluster-config-file', '$dir/nodes.conf',
        '--cluster-node-timeout', 1000, '--cluster-port', free_port()])
} 1 .. 3;
my $create = `$RedisCli -a $secret --no-auth-warning --cluster create @{[ map { "127.0.0.1:$_->{port}" } @nodes ]} --cluster-replicas 0 --cluster-yes 2>&1`;
like($create, qr/All 16384 slots covered/, 'redis-cli made the cluster') or diag($create);
ok(wait_until(sub { !grep { redis_cli($_, 'cluster', 'info') !~ /cluster_state:ok/ } @nodes }, 20), 'cluster_state:ok');

# Which real master serves each slot (from CLUSTER NODES).
my @real_owner;
for (split /\n/, redis_cli($nodes[0], 'cluster', 'nodes')) {
    my ($id, $addr, $flags, @rest) = split ' ';
    next unless $flags =~ /master/;
    my ($port) = $addr =~ /:(\d+)@/;
    for my $r (@rest[5 .. $#rest]) {
        my ($a, $b) = $r =~ /^(\d+)(?:-(\d+))?$/ or next;
        $real_owner[$_] = $port for $a .. ($b // $a);
    }
}
is(scalar(grep { defined } @real_owner), 16384, 'every slot has a real master');
my ($m1, $m2, $m3) = map { $_->{port} } @nodes;
my %by_port = map { ($_->{port} => $_) } @nodes;

# Keys: one slot for the hostile node, one for the node that answers
# garbage; keys of the real masters (m3's for the resharding).
my $hostile_key = 'hostile-key';
my $garbage_key = 'garbage-key';
my %special = (key_slot($hostile_key) => 1, key_slot($garbage_key) => 1);
sub keys_of {
    my ($port, $n) = @_;
    my @k;
    for my $i (0 .. 100_000) {
        my $k = "k$port-$i";
        push @k, $k if $real_owner[key_slot($k)] == $port && !$special{ key_slot($k) };
        last if @k == $n;
    }
    return @k;
}
my @keys = (keys_of($m1, 3), keys_of($m2, 3));
my ($m3_key) = keys_of($m3, 1);
redis_cli($by_port{$m3}, 'set', $m3_key, 'on the third master');

my $victim = start_victim();
push @victims, $victim;

# The hostile node: every command it does not have to answer otherwise is
# redirected to the victim; its map would send every slot there.
my $hostile = FakeRedis->start(sub {
    my ($conn, $n, $cmd, @args) = @_;
    $cmd = uc $cmd;
    return (['send', "+OK\r\n"]) if $cmd eq 'AUTH' || $cmd eq 'ASKING';
    return (['send', '$' . length($args[0]) . "\r\n$args[0]\r\n"]) if $cmd eq 'PING' && @args;
    return (['send', "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n\$9\r\n127.0.0.1\r\n:$victim->{port}\r\n\$2\r\nid\r\n"])
        if $cmd eq 'CLUSTER';
    return (['send', '-MOVED ' . key_slot($args[0] // '') . " 127.0.0.1:$victim->{port}\r\n"]);
});
# A node that answers garbage.
my $garbage = FakeRedis->start(sub {
    my ($conn, $n, $cmd, @args) = @_;
    $cmd = uc $cmd;
    return (['send', "+OK\r\n"]) if $cmd eq 'AUTH';
    return (['send', '$' . length($args[0]) . "\r\n$args[0]\r\n"]) if $cmd eq 'PING' && @args;
    return (['send', "%%% not RESP\r\n"]);
});

# The configured seed: serves no slot itself; its map is the real one, with
# the hostile and the garbage nodes for a slot each, and (until the
# resharding) the third master's slots shown as the first's.
my $with_m3 = 0;
sub seed_map {
    my @owner = @real_owner;
    @owner = map { $_ == $m3 ? $m1 : $_ } @owner unless $with_m3;
    $owner[ key_slot($hostile_key) ] = $hostile->port;
    $owner[ key_slot($garbage_key) ] = $garbage->port;
    return @owner;
}
my $seed = FakeRedis->start(sub {
    my ($conn, $n, $cmd, @args) = @_;
    $cmd = uc $cmd;
    $with_m3 = -e "$tmp/resharded";
    my @owner = seed_map();
    return (['send', "+OK\r\n"]) if $cmd eq 'AUTH' || $cmd eq 'ASKING';
    return (['send', '$' . length($args[0]) . "\r\n$args[0]\r\n"]) if $cmd eq 'PING' && @args;
    if ($cmd eq 'CLUSTER') {
        my @ranges;
        for my $s (0 .. 16383) {
            if (@ranges && $ranges[-1][2] == $owner[$s]) { $ranges[-1][1] = $s }
            else { push @ranges, [$s, $s, $owner[$s]] }
        }
        return (['send', '*' . @ranges . "\r\n" . join '', map {
            "*3\r\n:$_->[0]\r\n:$_->[1]\r\n*3\r\n\$9\r\n127.0.0.1\r\n:$_->[2]\r\n\$2\r\nid\r\n"
        } @ranges]);
    }
    my $slot = key_slot($args[0] // '');
    return (['send', "-MOVED $slot 127.0.0.1:$owner[$slot]\r\n"]);
});
my $sp = $seed->port;

my $port = nginx_start(<<"EOF");
    upstream trusted {
        cache_cluster on;
        server 127.0.0.1:$sp;
        keepalive 8;
    }
    server {
        listen 127.0.0.1:\$PORT;
        cache_auth $secret;
        add_header X-Node \$upstream_addr always;
        location /on/ { set \$cache_key \$arg_key; cache_pass trusted; }
        location /off/ { set \$cache_key \$arg_key; cache_pipeline off; cache_pass trusted; }
        location /st/ { cache_pass trusted; cache_stream \$arg_key; }
    }
EOF

sub req { return keepalive_requests($port, 10, @_) }
sub nodes_of { my $r = shift; return $r->{headers}{'x-node'} // '-' }
sub commands_of { my ($fake, $re) = @_; return scalar grep { /^\d+: $re/ } $fake->log_lines }

# The hostile node, with both settings of cache_pipeline (the first
# requests: the map comes from the seed).
redis_cli($by_port{ $real_owner[key_slot($_)] }, 'set', $_, "value of $_") for @keys;
{
    my $mark = length nginx_error_log();
    my @r = req(['GET', "/on/?key=$hostile_key"], ['PUT', "/on/?key=$hostile_key", 'the client\'s secret body'],
        ['GET', "/off/?key=$hostile_key"], ['PUT', "/off/?key=$hostile_key", 'the client\'s secret body'],
        ['GET', "/on/?key=$hostile_key"], ['GET', "/on/?key=$keys[0]"]);
    is_deeply([map { $_->{status} } @r[0 .. 4]], [502, 502, 502, 502, 502], 'a redirection to a node of no trusted map: 502');
    is_deeply([map { nodes_of($_) } @r[0 .. 4]], [("127.0.0.1:$sp, 127.0.0.1:" . $hostile->port) x 5],
        'each: the seed (a new map), then the hostile node (the map names it), not further');
    is(victim_got($victim), '', 'the victim got no connection and no byte (no AUTH, no command, no body)');
    is(commands_of($hostile, 'CLUSTER'), 0, 'the hostile node was never asked for the map');
    my $log = substr(nginx_error_log(), $mark);
    my @lines = $log =~ /^.*refused to follow.*$/mg;
    is(scalar @lines, 1, 'one log line for five refused redirections') or diag($log);
    like($lines[0] // '', qr/\[error\].*cache: refused to follow "MOVED \d+ 127\.0\.0\.1:$victim->{port}" from redis cluster node 127\.0\.0\.1:\d+: 127\.0\.0\.1:$victim->{port} is not a node of the cluster map/,
        'it names the refused address');
    is($r[5]{status}, 200, 'the next request on the connection gets its own answer');
    my @after = req(map { ['GET', "/on/?key=$_"] } @keys, @keys);
    is(scalar(grep { $after[$_]{status} == 200 && $after[$_]{body} eq "value of $keys[$_ % @keys]"
        && nodes_of($after[$_]) =~ /(^|, )127\.0\.0\.1:$real_owner[key_slot($keys[$_ % @keys])]$/ } 0 .. $#after), scalar @after,
        'later requests go to the real masters');
    is(victim_got($victim), '', 'and the victim still got nothing');
}

# cache_stream: the stream of a key in the hostile node's slot is read
# there (the seed's map names it), and its MOVED to the victim is not
# followed: the stream ends, one error line names the answer, the victim
# gets nothing; a key of a real master streams on.
{
    my $mark = length nginx_error_log();
    # (A key of the second master: the seed's map names it; keys_of's names
    # with a suffix, so that no string value is in the way.)
    my ($sk) = map { "$_-stream" } grep { $real_owner[key_slot("$_-stream")] == $m2 } map { "s$_" } 1 .. 1000;
    my $good = open_sse($port, "/st/?key=$sk");
    pump([$good], 10, subscribed($good));
    like($good->{buf}, qr/: subscribed/, 'cache_stream: a key of a real master is read');
    my $bad = open_sse($port, "/st/?key=$hostile_key");
    # (The response ends: its last chunk; the connection may stay.)
    my $ended = sub { $bad->{eof} || $bad->{buf} =~ /\r\n0\r\n\r\n\z/ };
    pump([$bad], 10, $ended);
    ok($ended->(), 'cache_stream: a redirection to a node of no trusted map ends the stream');
    unlike(body($bad), qr/^id: /m, 'with no entry');
    is(victim_got($victim), '', 'the victim got no connection and no byte');
    like(substr(nginx_error_log(), $mark), qr/\[error\].*answered "MOVED \d+ 127\.0\.0\.1:$victim->{port}" for a stream; the streams of slot \d+ end/,
        'one error line names the answer');
    my $id = redis_cli($by_port{ $real_owner[key_slot($sk)] }, 'xadd', $sk, '*', 'data', 'still here');
    chomp $id;
    pump([$good], 10, sub { body($good) =~ /^id: \Q$id\E$/m });
    like(body($good), qr/^id: \Q$id\E\ndata: still here$/m, 'the real master\'s stream goes on');
    close $_->{s} for $good, $bad;
    redis_cli($by_port{ $real_owner[key_slot($sk)] }, 'del', $sk);
}

# Stores and reads through the seed.
my @put = req(map { ['PUT', "/on/?key=$_", "value of $_"] } reverse @keys);
is_deeply([map { $_->{status} } @put], [(201) x @keys], 'PUT through the configured seed: stored on the real masters');
my @got = req(map { ['GET', "/off/?key=$_"] } @keys);
is(scalar(grep { $got[$_]{status} == 200 && $got[$_]{body} eq "value of $keys[$_]"
    && nodes_of($got[$_]) eq "127.0.0.1:$real_owner[key_slot($keys[$_])]" } 0 .. $#keys), scalar @keys,
    'GET: each from its master, straight (the map from the seed)');

# A node that answers garbage: the next request refreshes the map from the seed.
{
    my @warm = req(['GET', "/on/?key=$keys[1]"], ['GET', "/on/?key=$keys[1]"]);
    is(nodes_of($warm[1]), "127.0.0.1:$real_owner[key_slot($keys[1])]", 'with an up-to-date map, a request goes straight to its master');
    my $asked = commands_of($seed, 'CLUSTER');
    my @r = req(['GET', "/on/?key=$garbage_key"], ['GET', "/on/?key=$keys[1]"]);
    is($r[0]{status}, 502, 'a node that answers garbage: 502');
    is_deeply([$r[1]{status}, nodes_of($r[1])], [200, "127.0.0.1:$sp, 127.0.0.1:$real_owner[key_slot($keys[1])]"],
        'the next request asks the seed for a new map first');
    is(commands_of($seed, 'CLUSTER') - $asked, 1, 'one CLUSTER SLOTS');
}

# A real master that the seed's map does not name yet is refused, and gets
# nothing; once the map names it (a resharding), MOVED to it is followed.
{
    my $before = redis_connections($by_port{$m3});
    my $mark = length nginx_error_log();
    my @r = req(['GET', "/on/?key=$m3_key"], ['GET', "/off/?key=$m3_key"]);
    is_deeply([map { $_->{status} } @r], [502, 502], 'a master of no trusted map: 502');
    is(redis_connections($by_port{$m3}) - $before, 1, 'it got no connection from nginx (one: redis-cli\'s)');
    like(substr(nginx_error_log(), $mark), qr/refused to follow "MOVED \d+ 127\.0\.0\.1:$m3" from redis cluster node 127\.0\.0\.1:$m1: 127\.0\.0\.1:$m3 is not/,
        'logged, with its address');
    # An up-to-date map (the refusal left it out of date) that does not name it.
    my @warm = req(['GET', "/on/?key=$keys[0]"], ['GET', "/on/?key=$keys[0]"]);
    is(nodes_of($warm[1]), "127.0.0.1:$real_owner[key_slot($keys[0])]", 'the map is up to date');
    open my $f, '>', "$tmp/resharded" or die $!;
    close $f;
    @r = req(['GET', "/on/?key=$m3_key"], ['GET', "/off/?key=$m3_key"], ['GET', "/on/?key=$m3_key"]);
    is_deeply([map { "$_->{status} $_->{body}" } @r], [('200 on the third master') x 3], 'after the resharding: read from the third master');
    is(nodes_of($r[0]), "127.0.0.1:$m1, 127.0.0.1:$sp, 127.0.0.1:$m3", 'MOVED to a node the map did not know: the seed is asked, then it is followed');
    is(nodes_of($r[2]), "127.0.0.1:$m3", 'then straight');
}

my $log = nginx_error_log();
unlike($log, qr/\[alert\]|\[crit\]|exited on signal/, 'no worker trouble');
stop_nginx();
done_testing();
