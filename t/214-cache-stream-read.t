# cache_stream: a GET is a server-sent event stream of a Redis stream's
# entries (id:, event: from the field event, data: from the field data),
# read by one XREAD connection per worker; Last-Event-ID (or the argument
# last_event_id) resumes after that entry: none twice, none missing, also
# for clients that leave at random moments in a burst of thousands of
# entries; a Redis restart and a killed reading connection lose nothing
# still in the stream; a client far behind that does not read pauses its
# catch-up; heartbeats, HEAD, a reload and coming back; many keys; 400
# for a bad id; 405; TLS; a Redis Cluster (keys on each of its masters,
# and resuming there); nginx -t.
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump body subscribed metric);
use GatewayTest qw($RedisServer $RedisCli conf_line_of http_request nginx_start stop_nginx nginx_error_log start_redis redis_cli
    wait_until tls_files stretch nginx_signal workers_idle_ok);
use IO::Socket::INET;
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

my $redis = start_redis();
my $rport = $redis->{port};
my $d = tls_files();
my $tls = start_redis(tls => { cert => "$d/server.crt", key => "$d/server.key", ca => "$d/ca.crt" });
my $tport = $tls->{tls_port};

my $port = nginx_start(<<"HTTP", workers => 2);
upstream red { server 127.0.0.1:$rport; }
upstream sred { server 127.0.0.1:$tport; }
server {
    listen 127.0.0.1:\$PORT;
    cache_subscribe_heartbeat 1s;
    location /s { cache_pass red; cache_stream \$arg_key; }
    location /fixed { cache_pass red; cache_subscribe_retry 2500ms; cache_stream fixed; }
    location /add { cache_pass red; cache_stream_add \$arg_key; }
    location /tls {
        cache_pass sred;
        cache_ssl on;
        cache_ssl_trusted_certificate $d/ca.crt;
        cache_ssl_verify on;
        cache_ssl_name localhost;
        cache_stream \$arg_key;
    }
    location = /metrics { gateway_status; }
}
HTTP

# The events of a stream as [id, event name or '', data lines joined by |].
sub entries {
    my ($sub) = @_;
    my @ev;
    # (Whole events only: a client that leaves may have half of one.)
    my $body = body($sub);
    my $end = rindex($body, "\n\n");
    $body = $end < 0 ? '' : substr($body, 0, $end + 2);
    for my $block (split /\n\n/, $body) {
        my ($id) = $block =~ /^id: (.*)$/m or next;
        my ($name) = $block =~ /^event: (.*)$/m;
        my @data = $block =~ /^data: ?(.*)$/mg;
        push @ev, [$id, $name // '', join('|', @data)];
    }
    return @ev;
}

sub xadd {
    my ($r, $key, @fields) = @_;
    my $id = redis_cli($r, 'xadd', $key, '*', @fields);
    chomp $id;
    return $id;
}

# 1. Live entries: ids, event names, data lines; an entry without a data
# field is an event with empty data; retry: first where set.
my @subs = map { open_sse($port, '/s?key=k1') } 1 .. 4;
pump(\@subs, stretch(5), subscribed(@subs));
is(scalar(grep { $_->{buf} =~ /: subscribed/ } @subs), 4, 'four subscribers are on');
like($subs[0]{buf}, qr{Content-Type: text/event-stream}i, 'text/event-stream');
my @ids = (
    xadd($redis, 'k1', 'data', 'one'),
    xadd($redis, 'k1', 'event', 'up date', 'data', "two\nlines"),
    xadd($redis, 'k1', 'other', 'x'),
    xadd($redis, 'k1', 'data', 'four', 'event', 'last'),
);
pump(\@subs, stretch(5), sub { !grep { entries($_) < 4 } @subs });
for my $s (@subs) {
    is_deeply([entries($s)],
        [[$ids[0], '', 'one'], [$ids[1], 'up date', 'two|lines'], [$ids[2], '', ''], [$ids[3], 'last', 'four']],
        'each subscriber gets the four entries, with ids, names and data lines');
}
# While no entry comes, the workers hold their XREAD connections and the
# subscribers without spending CPU.
workers_idle_ok('two idle workers with four stream subscribers', sub { pump(\@subs, shift) });
my $fixed = open_sse($port, '/fixed');
pump([$fixed], stretch(5), subscribed($fixed));
like(body($fixed), qr/^retry: 2500\n\n: subscribed\n\n/, 'retry: first, then : subscribed');
close $_->{s} for @subs, $fixed;

# 2. Resume: Last-Event-ID and ?last_event_id= give the entries after it,
# then the live ones.
my $h = open_sse($port, '/s?key=k1', "Last-Event-ID: $ids[1]");
my $a = open_sse($port, "/s?key=k1&last_event_id=$ids[0]");
pump([$h, $a], stretch(5), sub { entries($h) >= 2 && entries($a) >= 3 });
is_deeply([map { $_->[0] } entries($h)], [@ids[2, 3]], 'Last-Event-ID: the entries after it');
is_deeply([map { $_->[0] } entries($a)], [@ids[1 .. 3]], 'last_event_id=: the entries after it');
my $live = xadd($redis, 'k1', 'data', 'five');
pump([$h, $a], stretch(5), sub { entries($h) >= 3 && entries($a) >= 4 });
is((entries($h))[-1][0], $live, 'then the live one (header)');
is((entries($a))[-1][0], $live, 'then the live one (argument)');
is(scalar(entries($h)), 3, 'none twice');
close $_->{s} for $h, $a;

# 3. Bad ids: 400 and one info line; the next request works.
for my $bad ('abc', '1-2-3', '-5', '1-x') {
    my ($st) = http_request($port, 'GET', "/s?key=k1&last_event_id=$bad");
    is($st, 400, "last_event_id=$bad: 400");
}
like(nginx_error_log(), qr/\[info\].*the last event id "1-2-3".*is not a stream entry ID/, 'logged at info');
{
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
    print $s "GET /s?key=k1 HTTP/1.1\r\nHost: x\r\nLast-Event-ID: nope\r\nConnection: close\r\n\r\n";
    local $/;
    like(<$s> // '', qr{^HTTP/1\.1 400 }, 'a bad Last-Event-ID header: 400');
}
is((http_request($port, 'POST', '/s?key=k1', 'x'))[0], 405, 'POST: 405');
my $after = open_sse($port, '/s?key=k1', "Last-Event-ID: $ids[2]");
pump([$after], stretch(5), sub { entries($after) >= 2 });
is_deeply([map { $_->[0] } entries($after)], [$ids[3], $live], 'the next request after the bad ones works');
close $after->{s};

# 4. A burst of 3000 entries; eight clients that leave at random moments
# and come back with their last id: each gets every entry once, in order.
{
    my $n = 3000;
    my $writer = fork // die;
    if (!$writer) {
        for my $batch (0 .. 29) {
            open my $cli, '|-', $RedisCli, '-p', $rport or die;
            print $cli "XADD burst * data e" . ($batch * 100 + $_) . "\n" for 0 .. 99;
            close $cli;
            sleep 0.03;
        }
        POSIX::_exit(0);
    }
    my @got = map { [] } 1 .. 8;
    my %conn;
    my $deadline = time + stretch(60);
    srand(214);
    while (time < $deadline) {
        for my $c (0 .. 7) {
            next if @{ $got[$c] } >= $n;
            my $last = @{ $got[$c] } ? $got[$c][-1][0] : '0';
            my $s = open_sse($port, '/s?key=burst', "Last-Event-ID: $last");
            pump([$s], rand(0.4));
            push @{ $got[$c] }, entries($s);
            close $s->{s};
        }
        last unless grep { @$_ < $n } @got;
    }
    waitpid($writer, 0);
    my @all = split /\n/, redis_cli($redis, 'xrange', 'burst', '-', '+');
    my @want = grep { /^\d+-\d+$/ } @all;
    is(scalar(@want), $n, "Redis holds the $n entries");
    for my $c (0 .. 7) {
        my @ids = map { $_->[0] } @{ $got[$c] };
        my @data = map { $_->[2] } @{ $got[$c] };
        is(scalar(@ids), $n, "client $c got $n events");
        is_deeply(\@ids, \@want, "client $c: every id once, in order");
        is_deeply(\@data, [map { "e$_" } 0 .. $n - 1], "client $c: the data in order");
    }
    # A client from the start: every entry, in pages of the catch-up.
    my $s = open_sse($port, '/s?key=burst&last_event_id=0-0');
    pump([$s], stretch(20), sub { entries($s) >= $n });
    is_deeply([map { $_->[0] } entries($s)], \@want, "from 0-0: the $n entries, once each, in order");
    close $s->{s};
}

# 4b. A client far behind that does not read: its catch-up pauses (it
# gets no more pages while 256 kB wait for it) instead of pulling the
# whole stream into the worker; once it reads, it gets every entry.
{
    my $n = 5000;
    open my $cli, '|-', "$RedisCli -p $rport >/dev/null" or die;
    print $cli "XADD big * data " . sprintf('%05d', $_) . ('x' x 4000) . "\n" for 1 .. $n;
    close $cli;
    my $pages = sub { (redis_cli($redis, 'info', 'commandstats') =~ /cmdstat_xrange:calls=(\d+)/)[0] // 0 };
    my $before = $pages->();
    my $s = open_sse($port, '/s?key=big&last_event_id=0-0');
    # Until its catch-up has read pages and then read none for a second.
    my ($seen, $since) = (-1, time);
    wait_until(sub {
        my $now = $pages->();
        ($seen, $since) = ($now, time) if $now != $seen;
        $now > $before && time - $since >= 1;
    }, 3);
    my $paused = $pages->() - $before;
    cmp_ok($paused, '<', 20, "a client that does not read: $paused pages of the 26 the catch-up needs");
    pump([$s], stretch(30), sub { entries($s) >= $n });
    my @e = entries($s);
    is(scalar(@e), $n, "once it reads: all $n entries");
    is(scalar(grep { $e[$_][2] =~ /^\Q@{[sprintf('%05d', $_ + 1)]}\E/ } 0 .. $#e), $n, 'in order');
    close $s->{s};
}

# 5. Many keys, one subscriber each: each gets its own key's entry only.
{
    my @many = map { open_sse($port, "/s?key=m$_") } 1 .. 40;
    pump(\@many, stretch(10), subscribed(@many));
    my %id = map { ($_ => xadd($redis, "m$_", 'data', "for m$_")) } 1 .. 40;
    pump(\@many, stretch(10), sub { !grep { entries($_) < 1 } @many });
    my $ok = grep { my @e = entries($many[$_ - 1]); @e == 1 && $e[0][0] eq $id{$_} && $e[0][2] eq "for m$_" } 1 .. 40;
    is($ok, 40, 'forty keys: each subscriber gets its own entry, once');
    close $_->{s} for @many;
}

# 6. The reading connection killed, then Redis restarted: the subscribers
# stay and get what came in between, with no event: reconnect.
{
    my @s = map { open_sse($port, '/s?key=r1') } 1 .. 4;
    pump(\@s, stretch(5), subscribed(@s));
    my $first = xadd($redis, 'r1', 'data', 'before');
    pump(\@s, stretch(5), sub { !grep { entries($_) < 1 } @s });
    redis_cli($redis, 'client', 'kill', 'type', 'normal');
    my $between = xadd($redis, 'r1', 'data', 'between');
    pump(\@s, stretch(8), sub { !grep { entries($_) < 2 } @s });
    is(scalar(grep { (entries($_))[1] && (entries($_))[1][0] eq $between } @s), 4,
        'a killed reading connection: the entry added meanwhile arrives');
    # A restart (no persistence: the stream starts again, with new ids).
    my $mark = length nginx_error_log();
    # (The reading connections, one a worker with subscribers, wait in XREAD.)
    my $readers = GatewayTest::redis_info($redis, 'clients', 'blocked_clients');
    redis_cli($redis, 'shutdown', 'nosave');
    waitpid($redis->{pid}, 0);
    # (While it is down its port is held: no file running beside this one
    # is given it for a Redis of its own.)
    GatewayTest::hold_port($rport);
    # Down until the reading connections have failed (or were lost).
    my $lost = sub { scalar(() = substr(nginx_error_log(), $mark) =~ /\[error\].*stream reading connection .* (?:was lost|failed)/g) };
    pump(\@s, stretch(5), sub { $lost->() >= $readers });
    is($lost->(), $readers, "the $readers reading connection(s) are lost, one error line each");
    GatewayTest::release_port($rport);
    my $pid = fork // die;
    if (!$pid) {
        open STDOUT, '>', '/dev/null';
        exec $RedisServer, '--port', $rport, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', $redis->{dir};
        exit 127;
    }
    $redis->{pid} = $pid;
    wait_until(sub { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $rport) }, stretch(10));
    # Until the reading connections are back, waiting in XREAD again.
    pump(\@s, stretch(10), sub { (GatewayTest::redis_info($redis, 'clients', 'blocked_clients') // 0) >= $readers });
    my $later = xadd($redis, 'r1', 'data', 'after the restart');
    pump(\@s, stretch(10), sub { !grep { entries($_) < 3 } @s });
    is(scalar(grep { (entries($_))[2] && (entries($_))[2][0] eq $later } @s), 4, 'after a restart: the new entry arrives');
    is(scalar(grep { body($_) =~ /reconnect/ || $_->{eof} } @s), 0, 'no event: reconnect, no stream ended');
    like(nginx_error_log(), qr/stream reading connection .* (was lost|failed)/, 'the lost connection is logged');
    close $_->{s} for @s;
}

# 6b. Heartbeats; HEAD; a reload ends the stream, and the client that
# comes back with its last id gets what was added while it was away.
{
    my $s = open_sse($port, '/s?key=rl');
    pump([$s], stretch(5), subscribed($s));
    pump([$s], stretch(5), sub { body($s) =~ /: heartbeat/ });
    like(body($s), qr/: heartbeat\n\n/, 'a heartbeat comes (cache_subscribe_heartbeat)');
    my ($st, undef, $head) = http_request($port, 'HEAD', '/s?key=rl');
    is($st, 200, 'HEAD: 200');
    like($head, qr{Content-Type: text/event-stream}i, 'HEAD: the stream\'s type');
    my $first = xadd($redis, 'rl', 'data', 'first');
    pump([$s], stretch(5), sub { entries($s) >= 1 });
    nginx_signal('HUP');
    pump([$s], stretch(15), sub { $s->{eof} });
    ok($s->{eof}, 'a reload ends the stream');
    my $away = xadd($redis, 'rl', 'data', 'while away');
    my $back = open_sse($port, '/s?key=rl', "Last-Event-ID: $first");
    pump([$back], stretch(10), sub { entries($back) >= 1 });
    my $next = xadd($redis, 'rl', 'data', 'next');
    pump([$back], stretch(10), sub { entries($back) >= 2 });
    is_deeply([map { $_->[0] } entries($back)], [$away, $next], 'after the reload: what came while away, then the live one');
    close $_->{s} for $s, $back;
}

# 7. Over TLS.
{
    my $s = open_sse($port, '/tls?key=t1');
    pump([$s], stretch(5), subscribed($s));
    my $id = xadd($tls, 't1', 'data', 'secret');
    pump([$s], stretch(5), sub { entries($s) >= 1 });
    is_deeply([entries($s)], [[$id, '', 'secret']], 'TLS: the entry arrives');
    close $s->{s};
}
cmp_ok(metric($port, 'events_sent_total', 'cache_stream'), '>', 0, 'events are counted under source cache_stream');
stop_nginx();

# 8. A Redis Cluster of three masters, one seed configured: keys on each
# master are read there (the worker asks the seed for the map); a client
# resumes on one of them.
{
    my @nodes = map {
        start_redis(args => ['--cluster-enabled', 'yes', '--cluster-config-file', '$dir/nodes.conf',
            '--cluster-node-timeout', 1000, '--cluster-port', GatewayTest::free_port()])
    } 1 .. 3;
    my $create = `$RedisCli --cluster create @{[ map { "127.0.0.1:$_->{port}" } @nodes ]} --cluster-replicas 0 --cluster-yes 2>&1`;
    like($create, qr/All 16384 slots covered/, 'redis-cli made the cluster') or diag($create);
    ok(wait_until(sub { !grep { redis_cli($_, 'cluster', 'info') !~ /cluster_state:ok/ } @nodes }, 20), 'cluster_state:ok');
    my $cport = nginx_start(<<"HTTP");
upstream cl { cache_cluster on; server 127.0.0.1:$nodes[0]{port}; }
server {
    listen 127.0.0.1:\$PORT;
    location /c { cache_pass cl; cache_stream \$arg_key; }
}
HTTP
    my @keys = map { "ck$_" } 1 .. 12;
    my %owner;
    for my $k (@keys) {
        ($owner{$k}) = grep { redis_cli($_, 'xlen', $k) !~ /MOVED/ } @nodes;
    }
    my %on = map { ($_->{port} => 1) } values %owner;
    is(scalar(keys %on), 3, 'the twelve keys are spread over the three masters');
    my %sub = map { ($_ => open_sse($cport, "/c?key=$_")) } @keys;
    pump([values %sub], stretch(10), subscribed(values %sub));
    is(scalar(grep { $_->{buf} =~ /: subscribed/ } values %sub), 12, 'cluster: twelve subscribers are on');
    my %id = map { ($_ => xadd($owner{$_}, $_, 'data', "in $_")) } @keys;
    pump([values %sub], stretch(10), sub { !grep { entries($_) < 1 } values %sub });
    my $ok = grep { my @e = entries($sub{$_}); @e == 1 && $e[0][0] eq $id{$_} && $e[0][2] eq "in $_" } @keys;
    is($ok, 12, 'cluster: each key\'s entry reaches its subscriber, from its master');
    my $k = $keys[0];
    my $second = xadd($owner{$k}, $k, 'data', 'second');
    my $r = open_sse($cport, "/c?key=$k", "Last-Event-ID: $id{$k}");
    pump([$r], stretch(10), sub { entries($r) >= 1 });
    is_deeply([map { $_->[0] } entries($r)], [$second], 'cluster: Last-Event-ID resumes on the key\'s master');
    close $r->{s};
    unlike(nginx_error_log(), qr/\[(error|alert|crit)\]/, 'cluster: no error in the log');

    # The slot of a key moves to another master (as a resharding moves
    # it): its client, coming back with its last id where its stream
    # ended, misses nothing, and the entries added on the new master come.
    my $mk = $keys[1];
    my $from = $owner{$mk};
    my ($to) = grep { $_ != $from } @nodes;
    my $slot = redis_cli($from, 'cluster', 'keyslot', $mk);
    my $id_of = sub { my $id = redis_cli($_[0], 'cluster', 'myid'); chomp $id; $id };
    my ($fid, $tid) = ($id_of->($from), $id_of->($to));
    my $c = $sub{$mk};
    my (@got, @ended) = entries($c);
    redis_cli($to, 'cluster', 'setslot', $slot, 'importing', $fid);
    redis_cli($from, 'cluster', 'setslot', $slot, 'migrating', $tid);
    redis_cli($from, 'migrate', '127.0.0.1', $to->{port}, '', 0, 5000, 'keys', $mk);
    redis_cli($_, 'cluster', 'setslot', $slot, 'node', $tid) for @nodes;
    my @after = map { xadd($to, $mk, 'data', "moved $_") } 1 .. 3;
    my $deadline = time + stretch(20);
    while (time < $deadline && (!@got || $got[-1][0] ne $after[-1])) {
        pump([$c], 0.5);
        @got = (@ended, entries($c));
        if ($c->{eof}) {
            # (Its stream ended: it comes back as a browser does.)
            @ended = @got;
            $c = open_sse($cport, "/c?key=$mk", 'Last-Event-ID: ' . $got[-1][0]);
        }
    }
    is_deeply([map { $_->[0] } @got], [$id{$mk}, @after], 'a moved slot: every entry once, in order, from the new master')
        or diag(join('', grep { /stream|MOVED|ASK/ } split /^/, nginx_error_log()) . 'eof: ' . ($c->{eof} // 0) . "\n" . body($c) . redis_cli($to, 'xrange', $mk, '-', '+') . "\n" . redis_cli($from, 'client', 'list') . "\n" . redis_cli($to, 'client', 'list'));

    # A slot held in migration a while (-ASK for its key, which has gone to
    # the new master already): its client waits instead of ending, one
    # that comes meanwhile waits too (no 502), and both get the entry added
    # during the migration and those after it, once each, in order.
    my $ak = $keys[2];
    my $afrom = $owner{$ak};
    my ($ato) = grep { $_ != $afrom } @nodes;
    my $aslot = redis_cli($afrom, 'cluster', 'keyslot', $ak);
    my ($afid, $atid) = ($id_of->($afrom), $id_of->($ato));
    my $a1 = $sub{$ak};
    redis_cli($ato, 'cluster', 'setslot', $aslot, 'importing', $afid);
    redis_cli($afrom, 'cluster', 'setslot', $aslot, 'migrating', $atid);
    redis_cli($afrom, 'migrate', '127.0.0.1', $ato->{port}, '', 0, 5000, 'keys', $ak);
    like(redis_cli($afrom, 'xlen', $ak), qr/^ASK /, 'the key\'s old master answers ASK now');
    my $a2 = open_sse($cport, "/c?key=$ak", "Last-Event-ID: $id{$ak}");
    my $during = xadd_asking($ato, $ak, 'during');
    like($during, qr/^\d+-\d+$/, 'an entry is added on the new master during the migration');
    pump([$a1, $a2], stretch(1.5));
    ok(!$a1->{eof} && !$a2->{eof}, 'while the slot migrates, neither stream ends');
    unlike($a2->{buf}, qr{^HTTP/1\.1 502}, 'the client that came meanwhile is not refused');
    redis_cli($_, 'cluster', 'setslot', $aslot, 'node', $atid) for @nodes;
    my $late = xadd($ato, $ak, 'data', 'after the migration');
    pump([$a1, $a2], stretch(10), sub { !grep { (entries($_))[-1] && (entries($_))[-1][0] ne $late } $a1, $a2 });
    is_deeply([map { $_->[0] } entries($a1)], [$id{$ak}, $during, $late], 'the client that stayed: every entry once, in order');
    is_deeply([map { $_->[0] } entries($a2)], [$during, $late], 'the client that came during the migration: the same after its last id');
    unlike(nginx_error_log(), qr/\[error\].*answered "ASK/, 'no error line for the migration');
    close $_->{s} for values %sub, $c, $a2;
    stop_nginx();
}

# XADD on a connection that sent ASKING first (an importing node takes it).
sub xadd_asking {
    my ($r, $key, $data) = @_;
    open my $fh, '-|', 'sh', '-c', "printf 'ASKING\\nXADD $key * data $data\\n' | $RedisCli -p $r->{port}" or die $!;
    my @out = <$fh>;
    close $fh;
    my ($id) = grep { /^\d+-\d+$/ } map { s/\s+\z//r } @out;
    return $id // '';
}

# 9. nginx -t
for my $case (
    ['location /a { cache_stream k; }', qr/"cache_stream" needs "cache_pass" in the same location in \S+nginx\.conf:\d+/, qr/cache_stream k;/],
    ['location /a { cache_pass $arg_u; cache_stream k; }', qr/"cache_stream" needs "cache_pass" to name an upstream or an address, not a variable in \S+nginx\.conf:\d+/, qr/cache_stream k;/],
    ['location /a { cache_pass red; cache_subscribe c; cache_stream k; }', qr/"cache_stream" directive is duplicate, or beside "cache_subscribe"/, qr/cache_stream k;/],
    ['location /a { cache_pass red; cache_stream k; cache_stream_add k; }', qr/"cache_stream_add" directive is duplicate, or beside .*"cache_stream"/, qr/cache_stream_add k;/],
    ['location /a { cache_pass red; cache_stream k; }', qr/^started$/],
  )
{
    my ($loc, $want, $line) = @$case;
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
