# cache_cluster: the cache gateway in front of a real Redis Cluster (six
# redis-server processes on loopback, three masters with a replica each,
# made by redis-cli --cluster create). Keys go to the master of their slot
# ($upstream_addr names it); a slot migrated while requests run (ASK, then
# MOVED), a manual failover and a killed master are followed; a seventh
# node that takes a slot is used without a reload; the next request on the
# same connection always gets its own answer.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw($RedisServer $RedisCli periodic_bytes nginx_start stop_nginx nginx_error_log start_redis kill_redis redis_cli free_port stretch wait_until key_slot redis_numsub);
use HttpClient qw(keepalive_requests);
use FakeRedis;
use SseClient;
use Test::More;
use Time::HiRes qw(sleep time);
use POSIX ();
use File::Temp qw(tempdir);

# A key of a given slot.
sub key_in_slot {
    my ($slot, $prefix) = @_;
    for my $i (0 .. 1_000_000) { return "$prefix$i" if key_slot("$prefix$i") == $slot }
    die "no key for slot $slot";
}

my $node_timeout = 1000;
sub cluster_node {
    return start_redis(args => ['--cluster-enabled', 'yes', '--cluster-config-file', '$dir/nodes.conf',
        '--cluster-node-timeout', $node_timeout, '--cluster-port', free_port()]);
}

my @nodes = map { cluster_node() } 1 .. 6;
my %by_port = map { ($_->{port} => $_) } @nodes;
my $create = `$RedisCli --cluster create @{[ map { "127.0.0.1:$_->{port}" } @nodes ]} --cluster-replicas 1 --cluster-yes 2>&1`;
like($create, qr/All 16384 slots covered/, 'redis-cli made the cluster') or diag($create);

sub wait_ok {
    my @which = @_;
    return wait_until(sub { !grep { redis_cli($_, 'cluster', 'info') !~ /cluster_state:ok/ } @which }, 20);
}
ok(wait_ok(@nodes), 'cluster_state:ok on all six nodes');

# cluster_state:ok can come before every node has heard which nodes are
# replicas: until then a replica still looks like a master (without
# slots) to the others. Wait until each of the six sees three of each.
sub roles_known {
    my @which = @_;
    my $seen = sub {
        my $nodes = redis_cli(shift, 'cluster', 'nodes');
        my $m = () = $nodes =~ /^\S+ \S+ \S*master(?!\S*fail)/mg;
        my $s = () = $nodes =~ /^\S+ \S+ \S*slave(?!\S*fail)/mg;
        return $m == 3 && $s == 3;
    };
    return wait_until(sub { !grep { !$seen->($_) } @which }, 20);
}
ok(roles_known(@nodes), 'each node sees three masters and three replicas');

# The cluster as a node sees it: id => { port, master (bool), of (master id) }.
sub nodes_seen {
    my ($r) = @_;
    my %n;
    for (split /\n/, redis_cli($r, 'cluster', 'nodes')) {
        my ($id, $addr, $flags, $of) = split ' ';
        my ($port) = $addr =~ /:(\d+)@/;
        $n{$id} = { id => $id, port => $port, master => ($flags =~ /master/ && $flags !~ /fail/) ? 1 : 0,
            of => $of, failed => $flags =~ /fail/ ? 1 : 0 };
    }
    return \%n;
}

sub owner_port {
    my ($key, @masters) = @_;
    my @have = grep { redis_cli($_, 'get', $key) !~ /^(MOVED|ASK)/ } @masters;
    return @have == 1 ? $have[0]{port} : "(@{[ map { $_->{port} } @have ]})";
}

sub masters { my $n = nodes_seen(shift); return map { $by_port{ $_->{port} } } grep { $_->{master} } values %$n }

my $seed = $nodes[0]{port};
my $port = nginx_start(<<"EOF");
    upstream redis_cluster {
        cache_cluster on;
        server 127.0.0.1:$seed;
        keepalive 8;
    }
    upstream redis_other_seed {
        server 127.0.0.1:$nodes[1]{port};
        cache_cluster on;
    }
    upstream redis_all_seeds {
        cache_cluster on;
@{[ map { "        server 127.0.0.1:$_->{port};\n" } @nodes ]}        keepalive 8;
    }
    upstream redis_two_seeds {
        cache_cluster on;
        server 127.0.0.1:$seed;
        server 127.0.0.1:$nodes[1]{port};
    }
    server {
        listen 127.0.0.1:\$PORT;
        location /kv/ {
            set \$cache_key \$arg_key;
            set \$cache_exptime \$arg_ttl;
            add_header X-Node \$upstream_addr always;
            cache_pass redis_cluster;
        }
        location /var/ {
            set \$cache_key \$arg_key;
            set \$up redis_other_seed;
            add_header X-Node \$upstream_addr always;
            cache_pass \$up;
        }
        location /all/ {
            set \$cache_key \$arg_key;
            cache_pass redis_all_seeds;
        }
        location /db/ {
            set \$cache_key \$arg_key;
            set \$cache_db \$arg_db;
            cache_pass redis_cluster;
        }
        location /sub { cache_pass redis_two_seeds; cache_subscribe \$arg_channel; }
        location /pub { cache_pass redis_cluster; cache_publish \$arg_channel; }
        location = /metrics { gateway_status; }
    }
EOF

sub req { my @r = keepalive_requests($port, 10, @_); return wantarray ? @r : $r[0] }
sub last_node { my ($r) = @_; my $a = $r->{headers}{'x-node'} // ''; $a =~ s/.*,\s*//; return $a }

# Keys spread over the three masters, each on the master of its slot.
my @masters = masters($nodes[0]);
is(scalar @masters, 3, 'three masters');
my %owners;
my $stored = 0;
for my $i (0 .. 29) {
    my $r = req(['PUT', "/kv/?key=key$i", "value $i"]);
    $stored++ if ($r->{status} // 0) == 201;
}
is($stored, 30, 'PUT: 30 keys stored through the cluster');
my ($right, $named) = (0, 0);
for my $i (0 .. 29) {
    my $owner = owner_port("key$i", @masters);
    $owners{$owner}++;
    $right++ if redis_cli($by_port{$owner} // $nodes[0], 'get', "key$i") eq "value $i";
    my $r = req(['GET', "/kv/?key=key$i"]);
    $named++ if ($r->{status} // 0) == 200 && $r->{body} eq "value $i" && last_node($r) eq "127.0.0.1:$owner";
}
is($right, 30, 'each key is on the master that owns its slot');
is(scalar(keys %owners), 3, 'the keys are spread over all three masters') or diag(explain \%owners);
is($named, 30, 'GET: each value, and $upstream_addr names the owning master');

# Pub/sub: the cluster passes every PUBLISH to all its nodes, so the hub
# subscribes on one node (of two seeds); what is published on each master (redis-cli)
# and through cache_publish reaches the subscriber.
{
    my @subs = (SseClient::open_sse($port, '/sub?channel=cl'));
    SseClient::pump(\@subs, stretch(5), SseClient::subscribed(@subs));
    like($subs[0]{buf}, qr/: subscribed/, 'pub/sub: subscribed');
    my $on = 0;
    $on += redis_numsub($_, 'cl') for @nodes;
    is($on, 1, 'pub/sub: one subscribing connection in the whole cluster');
    redis_cli($_, 'publish', 'cl', "on $_->{port}") for @masters;
    my $r = req(['POST', '/pub?channel=cl', 'through the gateway']);
    is($r->{status}, 200, 'pub/sub: cache_publish on the cluster');
    SseClient::pump(\@subs, stretch(5), sub { SseClient::events($subs[0]) >= 4 });
    is_deeply([sort(SseClient::events($subs[0]))], [sort(map({ "cl=on $_->{port}" } @masters), 'cl=through the gateway')],
        'pub/sub: the subscriber got what was published on each master, and through the gateway');
    close $subs[0]{s};
}

# Connections to the nodes are kept (keepalive compares the node's address).
{
    my $conns = sub { my $t = 0; $t += (redis_cli($_, 'info', 'stats') =~ /total_connections_received:(\d+)/)[0] for @masters; $t };
    my $before = $conns->();
    req(map { ['GET', "/kv/?key=key$_"] } 0 .. 29);
    req(map { ['GET', "/kv/?key=key$_"] } 0 .. 29);
    my $opened = $conns->() - $before - 3;    # (redis-cli's own)
    ok($opened <= 3, "60 requests over three masters opened $opened connections");
}

# HEAD, POST.
is(req(['POST', '/kv/?key=posted', 'by post'])->{status}, 201, 'POST stores');
my $head = req(['HEAD', '/kv/?key=posted']);
is_deeply([$head->{status}, $head->{headers}{'content-length'}, $head->{body}], [200, 7, ''], 'HEAD: the length, no body');

# DELETE, misses.
my @d = req(['DELETE', '/kv/?key=key1'], ['DELETE', '/kv/?key=key1'], ['GET', '/kv/?key=key1'], ['GET', '/kv/?key=key2']);
is_deeply([map { $_->{status} } @d], [204, 404, 404, 200], 'DELETE 204, then 404; GET 404 after it');
is($d[3]{body}, 'value 2', 'and the next request on the connection gets its own answer');

# Hash tags: one slot, one node.
my @tagged = map { req(['PUT', "/kv/?key={user42}.$_", $_]) } qw(name mail city);
my %tag_nodes = map { (last_node($_) => 1) } @tagged;
is(scalar(keys %tag_nodes), 1, 'keys with one hash tag go to one node');
is(owner_port('{user42}.mail', @masters), (keys %tag_nodes)[0] =~ s/.*://r, 'the node that owns the tag\'s slot');

# $cache_exptime.
req(['PUT', '/kv/?key=ttl-key&ttl=100', 'x']);
my $ttl = redis_cli($by_port{ owner_port('ttl-key', @masters) }, 'ttl', 'ttl-key');
ok($ttl > 0 && $ttl <= 100, "\$cache_exptime sets the expiry ($ttl)");

# $cache_db: a cluster has database 0 only.
my $db = req(['GET', '/db/?key=key3&db=1']);
is($db->{status}, 400, '$cache_db 1 on a cluster: 400');
like(nginx_error_log(), qr/\[info\].*"\$cache_db" is 1, but a Redis Cluster has database 0 only/, 'logged at info');
is(req(['GET', '/db/?key=key3&db=0'])->{status}, 200, '$cache_db 0 is fine');
like(req(['GET', '/metrics'])->{body}, qr/^ngx_gateway_cache_requests_total\{upstream="",command="GET",status="400"\} 1$/m,
    'the 400 is counted (found by outside testing: it was not)');

# cache_pass $variable naming a cluster block whose keepalive-free seeds work alike.
my $v = req(['GET', '/var/?key=key4']);
is_deeply([$v->{status}, $v->{body}], [200, 'value 4'], 'cache_pass $variable to a cluster block');

# A value of 1 MiB, binary.
my $big = periodic_bytes(1 << 20, 256, sub { $_[0] % 256 });
is(req(['PUT', '/kv/?key=big', $big])->{status}, 201, 'a 1 MiB value stored');
my $gb = req(['GET', '/kv/?key=big']);
ok($gb->{status} == 200 && $gb->{body} eq $big, 'and streamed back whole');

# A slot migrated while requests run: ASK for the keys moved, then MOVED.
{
    my $src = $by_port{ owner_port('{mig}0', @masters) };
    my ($dst) = grep { $_ != $src } @masters;
    my $slot = key_slot('{mig}0');
    my $ids = nodes_seen($nodes[0]);
    my %id_of = map { ($_->{port} => $_->{id}) } values %$ids;
    my @keys = map { "{mig}$_" } 0 .. 9;
    req(map { ['PUT', "/kv/?key=$_", "m-$_"] } @keys);
    # Requests that run all along, from another process.
    my $tmp = tempdir('ngx-gateway-cluster-load-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my $load = fork;
    die "fork: $!" unless defined $load;
    if (!$load) {
        my ($total, $bad) = (0, 0);
        until (-e "$tmp/stop") {
            for my $r (keepalive_requests($port, 10, map { ['GET', "/kv/?key=$_"] } @keys)) {
                $total++;
                $bad++ unless ($r->{status} // 0) == 200 && $r->{body} =~ /^m-\{mig\}\d$/;
            }
        }
        open my $f, '>', "$tmp/counts" or POSIX::_exit(1);
        print $f "$total $bad";
        close $f;
        POSIX::_exit(0);
    }
    redis_cli($dst, 'cluster', 'setslot', $slot, 'importing', $id_of{ $src->{port} });
    redis_cli($src, 'cluster', 'setslot', $slot, 'migrating', $id_of{ $dst->{port} });
    my ($fails, $asked) = (0, 0);
    for my $k (@keys) {
        my $out = redis_cli($src, 'migrate', '127.0.0.1', $dst->{port}, $k, 0, 5000);
        # Every key, moved or not yet, through one client connection.
        my @r = req((map { ['GET', "/kv/?key=$_"] } @keys), ['GET', '/kv/?key=key5']);
        diag(join ' | ', map { $_->{headers}{'x-node'} // '-' } @r) if $ENV{CLUSTER_DEBUG};
        for my $i (0 .. $#keys) {
            $asked++ if ($r[$i]{headers}{'x-node'} // '') eq "127.0.0.1:$src->{port}, 127.0.0.1:$dst->{port}";
            next if ($r[$i]{status} // 0) == 200 && $r[$i]{body} eq "m-$keys[$i]";
            $fails++;
            diag("$keys[$i] after migrating $k: " . explain($r[$i])) if $fails < 4;
        }
        $fails++ unless ($r[-1]{status} // 0) == 200 && $r[-1]{body} eq 'value 5';
    }
    # A new key of the slot during the migration goes to the target (ASK).
    my $new = req(['PUT', '/kv/?key={mig}new', 'fresh']);
    $fails++ unless ($new->{status} // 0) == 201;
    is($fails, 0, 'while the slot migrates, every request gets its own right answer');
    is($asked, 55, "keys already moved are followed by ASK to the target ($asked times)");
    like(redis_cli($src, 'get', '{mig}new'), qr/^ASK/, 'the source does not have the new key');
    # The slot now belongs to the target: every node is told.
    redis_cli($_, 'cluster', 'setslot', $slot, 'node', $id_of{ $dst->{port} }) for $dst, $src, @masters;
    my @r = req(map { ['GET', "/kv/?key=$_"] } @keys);
    is(scalar(grep { ($_->{status} // 0) == 200 } @r), 10, 'after SETSLOT NODE: all 10 keys read');
    # (The requests running meanwhile may have followed MOVED first.)
    like($r[0]{headers}{'x-node'}, qr/^(127\.0\.0\.1:$src->{port}, )?127\.0\.0\.1:$dst->{port}$/,
        'the first request follows MOVED to the new owner');
    unlike(nginx_error_log(), qr/\[error\]/, 'redirections log no error');
    is($r[-1]{headers}{'x-node'}, "127.0.0.1:$dst->{port}", 'at once: the map learned the move');
    is(redis_cli($dst, 'get', '{mig}new'), 'fresh', 'the key stored after ASK is on the target');
    open my $stop, '>', "$tmp/stop" or die $!;
    close $stop;
    waitpid($load, 0);
    my ($total, $bad) = split ' ', do { open my $f, '<', "$tmp/counts" or die $!; local $/; <$f> };
    ok($total >= 100, "requests ran all along the migration ($total)");
    is($bad, 0, 'and none of them failed');
}

# Poll GET of a key until it succeeds after a master's replica is promoted.
sub follow_failover {
    my ($name, $key, $want, $replica, $promote) = @_;
    my ($promoted, $served, $served_by);
    my $deadline = time + 30;
    $promote->();
    while (time < $deadline) {
        if (!$promoted && redis_cli($replica, 'role') =~ /^master/) { $promoted = time }
        my $r = req(['GET', "/kv/?key=$key"]);
        if (($r->{status} // 0) == 200 && $r->{body} eq $want && $promoted && last_node($r) eq "127.0.0.1:$replica->{port}") {
            $served = time;
            $served_by = last_node($r);
            last;
        }
        sleep 0.05;
    }
    ok($promoted, "$name: the replica was promoted");
    ok($served && $served - $promoted <= stretch(2), sprintf("$name: requests succeed again within 2 s of the promotion (%.2f s)",
        ($served // 99) - ($promoted // 0)));
    is($served_by, "127.0.0.1:$replica->{port}", "$name: served by the promoted replica");
    return $promoted;
}

# GETs of some keys from four processes, until stopped: each writes the
# time of its last answer that was not the value.
sub start_load {
    my ($where, @keys) = @_;
    my $tmp = tempdir('ngx-gateway-cluster-load-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my @kids = map {
        my $c = $_;
        my $pid = fork;
        die "fork: $!" unless defined $pid;
        if (!$pid) {
            my ($last_bad, $total) = (0, 0);
            until (-e "$tmp/stop") {
                my @r = keepalive_requests($port, 10, map { ['GET', "$where?key=$_"] } @keys);
                for my $i (0 .. $#keys) {
                    $total++;
                    $last_bad = time unless ($r[$i]{status} // 0) == 200 && $r[$i]{body} eq "value " . ($keys[$i] =~ s/^key//r);
                }
            }
            open my $f, '>', "$tmp/$c" or POSIX::_exit(1);
            print $f "$last_bad $total";
            close $f;
            POSIX::_exit(0);
        }
        $pid
    } 1 .. 4;
    return { tmp => $tmp, kids => \@kids };
}

# Stops the load: (the time of the last failure, the requests made).
sub stop_load {
    my ($load) = @_;
    open my $stop, '>', "$load->{tmp}/stop" or die $!;
    close $stop;
    waitpid($_, 0) for @{ $load->{kids} };
    my ($last_bad, $total) = (0, 0);
    for my $c (1 .. 4) {
        open my $f, '<', "$load->{tmp}/$c" or next;
        my ($b, $t) = split ' ', scalar <$f>;
        $last_bad = $b if $b > $last_bad;
        $total += $t;
    }
    return ($last_bad, $total);
}

# A manual failover.
{
    my $ids = nodes_seen($nodes[0]);
    my $m = $by_port{ owner_port('key7', masters($nodes[0])) };
    my ($mid) = map { $_->{id} } grep { $_->{port} == $m->{port} } values %$ids;
    my ($rep) = map { $by_port{ $_->{port} } } grep { ($_->{of} // '') eq $mid } values %$ids;
    redis_cli($m, 'wait', 1, 2000);
    follow_failover('manual failover', 'key7', 'value 7', $rep, sub { redis_cli($rep, 'cluster', 'failover') });
}

# A killed master.
{
    ok(wait_ok(grep { $_->{pid} } @nodes), 'cluster_state:ok again');
    my $ids = nodes_seen($nodes[0]);
    my @masters_now = masters($nodes[0]);
    my $m = $by_port{ owner_port('key8', @masters_now) };
    my ($mid) = map { $_->{id} } grep { $_->{port} == $m->{port} } values %$ids;
    my ($rep) = map { $by_port{ $_->{port} } } grep { ($_->{of} // '') eq $mid && !$_->{failed} } values %$ids;
    redis_cli($m, 'wait', 1, 2000);
    # Under load, through a block that lists every node as a seed: while
    # the master is down the seeds answer CLUSTERDOWN, an error reply that
    # must not disable them (found by outside testing: the seeds counted it
    # as their failure, and the slots were 502 until about 7 s after the
    # promotion, while no seed was left to give the new map).
    my @its = grep { owner_port($_, @masters_now) == $m->{port} } map { "key$_" } 0, 2 .. 29;
    my $load = start_load('/all/', @its);
    sleep 0.5;
    my $promoted = follow_failover('killed master', 'key8', 'value 8', $rep, sub { kill_redis($m); $m->{pid} = 0 });
    # Two seconds after the promotion and more.
    sleep 0.1 while time < ($promoted // 0) + stretch(3);
    my ($last_bad, $total) = stop_load($load);
    ok($total > 100, "killed master: GETs of its keys ran all along ($total)");
    ok($promoted && $last_bad - $promoted <= stretch(2), sprintf(
        'killed master, under load, six seeds: GETs of its slots succeed within 2 s of the promotion (the last failure %.2f s after it)',
        $last_bad - ($promoted // 0)));
    like(nginx_error_log(), qr/\[error\].*connect\(\) failed .* upstream: "redis:\/\/127\.0\.0\.1:$m->{port}"/,
        'the dead master is logged as a connect() failure');
}

# A seventh node, given a slot: used without a reload.
{
    my $live = (grep { $_->{pid} } @nodes)[0];
    my $n7 = cluster_node();
    $by_port{ $n7->{port} } = $n7;
    my $add = `$RedisCli --cluster add-node 127.0.0.1:$n7->{port} 127.0.0.1:$live->{port} 2>&1`;
    like($add, qr/New node added correctly/, 'redis-cli added a seventh node') or diag($add);
    my $deadline = time + 20;
    sleep 0.1 while time < $deadline && (keys %{ nodes_seen($n7) } < 7 || redis_cli($n7, 'cluster', 'info') !~ /cluster_state:ok/);
    my $key = 'newnode-key';
    my $slot = key_slot($key);
    req(['PUT', "/kv/?key=$key", 'on the new node']);
    my @ms = masters($live);
    my $src = $by_port{ owner_port($key, @ms) };
    my %id_of = map { ($_->{port} => $_->{id}) } values %{ nodes_seen($live) };
    my $n7id = redis_cli($n7, 'cluster', 'myid');
    redis_cli($n7, 'cluster', 'setslot', $slot, 'importing', $id_of{ $src->{port} });
    redis_cli($src, 'cluster', 'setslot', $slot, 'migrating', $n7id);
    redis_cli($src, 'migrate', '127.0.0.1', $n7->{port}, $key, 0, 5000);
    redis_cli($_, 'cluster', 'setslot', $slot, 'node', $n7id) for $n7, $src, @ms;
    my @r = req(['GET', "/kv/?key=$key"], ['GET', "/kv/?key=$key"], ['GET', '/kv/?key=key9']);
    is_deeply([map { $_->{status} } @r], [200, 200, 200], 'the key moved to the new node is read');
    is($r[1]{body}, 'on the new node', 'with its value');
    is($r[1]{headers}{'x-node'}, "127.0.0.1:$n7->{port}", 'from the new node, learned with no reload');
    is($r[2]{body}, 'value 9', 'and the next request gets its own answer');
}

my $log = nginx_error_log();
unlike($log, qr/\[alert\]|\[crit\]|exited on signal/, 'no worker trouble');
unlike($log, qr/redirected the request more than/, 'no redirect loop');
stop_nginx();

# Errors: a seed that is no cluster node, a seed that refuses.
{
    my $plain = start_redis();
    my $closed = free_port();
    my $p = nginx_start(<<"EOF");
    upstream not_cluster { cache_cluster on; server 127.0.0.1:$plain->{port}; }
    upstream refusing { cache_cluster on; server 127.0.0.1:$closed; }
    server {
        listen 127.0.0.1:\$PORT;
        location /plain/ { set \$cache_key \$arg_key; cache_pass not_cluster; }
        location /refused/ { set \$cache_key \$arg_key; cache_pass refusing; }
    }
EOF
    my @r = keepalive_requests($p, 10, ['GET', '/plain/?key=a'], ['GET', '/refused/?key=a']);
    is($r[0]{status}, 502, 'a seed without cluster support: 502');
    like(nginx_error_log(), qr/\[error\].*cache: CLUSTER SLOTS was refused: ERR This instance has cluster support disabled/,
        'and the reason in the log');
    is($r[1]{status}, 502, 'a seed that refuses: 502');
    stop_nginx();
}

# A second cluster, of three masters with a password and TLS (tls-cluster:
# nodes announce their TLS ports to TLS clients): cache_auth and cache_ssl
# reach every master.
{
    my $d = tempdir('ngx-gateway-cluster-tls-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $d;
    my $openssl = sub { system("openssl @_ >>$d/openssl.log 2>&1") == 0 or die "openssl @_ failed\n" };
    $openssl->("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=cluster-ca -keyout $d/ca.key -out $d/ca.crt");
    open my $ext, '>', "$d/server.ext" or die $!;
    print $ext "subjectAltName = DNS:localhost\n";
    close $ext;
    $openssl->("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost -keyout $d/server.key -out $d/server.csr");
    $openssl->("x509 -req -in $d/server.csr -CA $d/ca.crt -CAkey $d/ca.key -CAcreateserial -days 2 -out $d/server.crt -extfile $d/server.ext");
    chmod 0644, glob("$d/*");
    my @tls = map {
        start_redis(password => 'cluster-secret', tls => { cert => "$d/server.crt", key => "$d/server.key", ca => "$d/ca.crt" },
            args => ['--cluster-enabled', 'yes', '--cluster-config-file', '$dir/nodes.conf', '--cluster-node-timeout', $node_timeout,
                '--cluster-port', free_port(), '--tls-cluster', 'yes', '--masterauth', 'cluster-secret'])
    } 1 .. 3;
    my $made = `$RedisCli -a cluster-secret --no-auth-warning --cluster create @{[ map { "127.0.0.1:$_->{port}" } @tls ]} --cluster-replicas 0 --cluster-yes 2>&1`;
    like($made, qr/All 16384 slots covered/, 'TLS cluster: made') or diag($made);
    ok(wait_ok(@tls), 'TLS cluster: cluster_state:ok');
    my %tls_port = map { ($_->{port} => $_->{tls_port}) } @tls;
    my %by_tls = map { ($_->{tls_port} => $_) } @tls;
    my $p = nginx_start(<<"EOF");
    upstream tls_cluster {
        cache_cluster on;
        server 127.0.0.1:$tls[0]{tls_port};
        keepalive 4;
    }
    server {
        listen 127.0.0.1:\$PORT;
        location /kv/ {
            set \$cache_key \$arg_key;
            add_header X-Node \$upstream_addr always;
            cache_auth cluster-secret;
            cache_ssl on;
            cache_ssl_verify on;
            cache_ssl_trusted_certificate $d/ca.crt;
            cache_ssl_name localhost;
            cache_pass tls_cluster;
        }
    }
EOF
    # The first request learns the map from the seed; a key the seed does
    # not serve is then redirected (MOVED), its body (300 KB, in a
    # temporary file) sent again, whole.
    my ($far) = grep { owner_port($_, @tls) != $tls[0]{port} } map { "far$_" } 0 .. 20;
    my $body = periodic_bytes(300_001, 256, sub { ($_[0] * 7) % 256 });
    my $first = (keepalive_requests($p, 10, ['PUT', "/kv/?key=$far", $body]))[0];
    is($first->{status}, 201, 'TLS cluster: the first request, redirected, stores');
    my $far_port = $tls_port{ owner_port($far, @tls) };
    is($first->{headers}{'x-node'}, "127.0.0.1:$tls[0]{tls_port}, 127.0.0.1:$far_port", 'TLS cluster: from the seed to the owner');
    ok(redis_cli($by_tls{$far_port}, 'strlen', $far) == length $body
        && redis_cli($by_tls{$far_port}, 'get', $far) eq $body, 'TLS cluster: the whole body, once');
    my @put = keepalive_requests($p, 10, map { ['PUT', "/kv/?key=tkey$_", "tls $_"] } 0 .. 11);
    is(scalar(grep { ($_->{status} // 0) == 201 } @put), 12, 'TLS cluster: 12 keys stored');
    my @get = keepalive_requests($p, 10, map { ['GET', "/kv/?key=tkey$_"] } 0 .. 11);
    my ($right, %seen) = (0);
    for my $i (0 .. 11) {
        my $owner = owner_port("tkey$i", @tls);
        $right++ if ($get[$i]{status} // 0) == 200 && $get[$i]{body} eq "tls $i"
            && last_node($get[$i]) eq "127.0.0.1:$tls_port{$owner}";
        $seen{$owner}++;
    }
    is($right, 12, 'TLS cluster: each key read from its master, over TLS, by its TLS port');
    is(scalar(keys %seen), 3, 'TLS cluster: on all three masters');
    unlike(nginx_error_log(), qr/\[(error|alert|crit)\]/, 'TLS cluster: no error logged');
    stop_nginx();
}

# Cluster nodes that misbehave (scripted): redirections in a loop, a map
# that is no map, a redirection to a host name. Each gets 502 and one
# error-log line; the next request on the same client connection gets its
# own answer.
{
    my $tmp = tempdir('ngx-gateway-cluster-fake-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my %fake;
    for my $mode (qw(moved-loop ask-loop badslots hostname silent)) {
        $fake{$mode} = FakeRedis->start(sub {
            my ($conn, $n, $cmd, @args) = @_;
            open my $f, '<', "$tmp/$mode" or return (['close']);
            my $me = <$f>;
            return () if $mode eq 'silent';
            $cmd = uc $cmd;
            return (['send', '$' . length($args[0]) . "\r\n$args[0]\r\n"]) if $cmd eq 'PING' && @args;
            return (['send', "+OK\r\n"]) if $cmd eq 'ASKING';
            if ($cmd eq 'CLUSTER') {
                return (['send', "*1\r\n*3\r\n:0\r\n:99999\r\n*2\r\n\$9\r\n127.0.0.1\r\n:1\r\n"]) if $mode eq 'badslots';
                return (['send', "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n\$9\r\n127.0.0.1\r\n:$me\r\n\$2\r\nid\r\n"]);
            }
            my $slot = key_slot($args[0] // '');
            return (['send', "-MOVED $slot 127.0.0.1:$me\r\n"]) if $mode eq 'moved-loop';
            return (['send', "-ASK $slot 127.0.0.1:$me\r\n"]) if $mode eq 'ask-loop';
            return (['send', "-MOVED $slot redis-7.internal:6379\r\n"]);
        });
        open my $f, '>', "$tmp/$mode" or die $!;
        print $f $fake{$mode}->port;
        close $f;
    }
    my $plain = start_redis();
    redis_cli($plain, 'set', 'mine', 'my own answer');
    my $p = nginx_start(<<"EOF");
    upstream plain { server 127.0.0.1:$plain->{port}; keepalive 2; }
@{[ map { "    upstream $_ { cache_cluster on; server 127.0.0.1:" . $fake{$_}->port . "; keepalive 2; }\n" } sort keys %fake ]}
    server {
        listen 127.0.0.1:\$PORT;
        location /plain/ { set \$cache_key \$arg_key; cache_pass plain; }
        location /fake/ { set \$cache_key \$arg_key; cache_pass \$arg_to; }
        location /silent/ { set \$cache_key \$arg_key; cache_read_timeout 1s; cache_pass silent; }
    }
EOF
    for ([ 'moved-loop', qr/cache: redis cluster redirected the request more than 5 times, the last time "MOVED \d+ 127\.0\.0\.1:\d+" from 127\.0\.0\.1:\d+/ ],
        [ 'ask-loop', qr/cache: redis cluster redirected the request more than 5 times, the last time "ASK / ],
        [ 'badslots', qr/cache: invalid CLUSTER SLOTS reply: a slot is not a number from 0 to 16383, from redis cluster node 127\.0\.0\.1:\d+/ ],
        [ 'hostname', qr/cache: redis cluster node 127\.0\.0\.1:\d+ answered "MOVED \d+ redis-7\.internal:6379", which names no IP address/ ])
    {
        my ($mode, $line) = @$_;
        my $mark = length nginx_error_log();
        my @r = keepalive_requests($p, 10, ['GET', "/fake/?to=$mode&key=k"], ['GET', '/plain/?key=mine']);
        is($r[0]{status}, 502, "$mode: 502");
        my $log = substr(nginx_error_log(), $mark);
        like($log, $line, "$mode: the error log says why");
        is(scalar(() = $log =~ /\[error\]/g), 1, "$mode: one error line");
        is($r[1]{body}, 'my own answer', "$mode: the next request gets its own answer");
    }
    is(scalar(grep { /: GET k$/ } $fake{'moved-loop'}->log_lines), 6, 'a redirection loop ends after 5 redirections');
    # A node that takes the commands and never answers: two timeouts at
    # most (it is tried again once, as the map may have moved), not one
    # per try (found by outside testing: eight).
    my $t0 = time;
    my @r = keepalive_requests($p, 10, ['GET', '/silent/?key=k'], ['GET', '/plain/?key=mine']);
    is($r[0]{status}, 504, 'a silent node: 504');
    cmp_ok(time - $t0, '<', stretch(4.5), 'after a few read timeouts (1 s each), not one per try');
    cmp_ok($fake{silent}->connections, '<=', 2, 'the silent node was tried at most twice');
    is($r[1]{body}, 'my own answer', 'silent: the next request gets its own answer');
    stop_nginx();
}

# nginx -t: keepalive (which wraps the balancer set before it) must come
# after cache_cluster; a balancing method after it would replace it.
{
    my $dir = tempdir('ngx-gateway-cluster-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
    my $modules = join '', map { "load_module $_;\n" } grep { length } split /[\s:]+/, $ENV{TEST_NGINX_LOAD_MODULES} || '';
    my $t = sub {
        my ($block) = @_;
        open my $fh, '>', "$dir/nginx.conf" or die $!;
        print $fh "${modules}error_log $dir/error.log;\npid $dir/nginx.pid;\nevents {}\n",
            "http { access_log off; $block server { listen 127.0.0.1:1; location / { set \$cache_key x; cache_pass c; } } }\n";
        close $fh;
        return scalar `$bin -t -p $dir/ -c $dir/nginx.conf 2>&1`;
    };
    like($t->('upstream c { cache_cluster on; server 127.0.0.1:1; keepalive 4; }'), qr/test is successful/,
        'nginx -t: cache_cluster then keepalive');
    like($t->('upstream c { keepalive 4; server 127.0.0.1:1; cache_cluster on; }'),
        qr/"cache_cluster" must come before "keepalive"/, 'nginx -t: keepalive before cache_cluster is refused');
    like($t->('upstream c { cache_cluster on; hash $uri; server 127.0.0.1:1; }'),
        qr/a balancing method after "cache_cluster" replaced it in upstream "c"/, 'nginx -t: a balancer after it is refused');
    like($t->('upstream c { cache_cluster maybe; server 127.0.0.1:1; }'), qr/invalid value "maybe"/, 'nginx -t: on or off');
}

done_testing();
