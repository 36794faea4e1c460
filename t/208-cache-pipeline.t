# The cache gateway's shared, pipelined connections (`cache_pipeline on`,
# the default; src/cache/pipe.rs and shared.rs): many clients at once on
# a few connections with no cross-talk, AUTH once per connection and
# SELECT only when the database changes, a hostile reply in the middle of
# a pipeline, clients that leave, a slow reader of a large value, a Redis
# restart, the upstream balancer (round robin with a server gone, backup),
# `cache_pipeline off`, and a reload with idle shared connections.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw($RedisServer $RedisCli periodic_bytes nginx_start stop_nginx nginx_error_log nginx_signal start_redis redis_cli kill_redis stretch redis_connections redis_info nginx_workers);
use FakeRedis;
use HttpClient qw(keepalive_requests parse_response);
use IO::Socket::INET;
use Socket qw(SOL_SOCKET SO_RCVBUF pack_sockaddr_in inet_aton);
use File::Temp qw(tempdir);
use POSIX qw(_exit);
use Test::More;
use Time::HiRes qw(sleep time);

my $main  = start_redis(args => ['--enable-debug-command', 'yes']);    # tests 1, 4, 5, 8, 9 (DEBUG SLEEP in 9)
my $authd = start_redis(password => 'se cret');  # test 2
my $hol   = start_redis();                       # test 5
my $gone  = start_redis();                       # test 6 (killed, started again)
my @bal   = map { start_redis() } 1 .. 3;        # test 7

# The fake answers PING with its token, GET with "value of KEY", and a few
# keys with what a real Redis would never send.
my %bad = (
    garbage   => "hello there\r\n",
    extra     => "\$2\r\nok\r\n+SURPRISE\r\n",
    wrongtype => "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
);
# Replies that come in steps: cut short, stalled, or slow but steady.
my %steps = (
    cutclose => [['send', "\$10\r\nabc"], ['close']],
    stallhdr => [['send', "\$5\r\n"], ['sleep', 3], ['send', "hello\r\n"]],
    steady   => [['send', "\$300000\r\n"], (map { (['send', 'a' x 60000], ['sleep', 0.6]) } 1 .. 4),
        ['send', ('a' x 60000) . "\r\n"]],
);
my $fake = FakeRedis->start(sub {
    my ($conn, $n, $cmd, @args) = @_;
    $cmd = uc $cmd;
    if ($cmd eq 'GET') {
        my ($kind) = $args[0] =~ /^r\d+-(\w+)$/;
        return (['send', $bad{$kind}]) if $kind && $bad{$kind};
        return @{ $steps{$kind} } if $kind && $steps{$kind};
        my $v = "value of $args[0]";
        return (['send', '$' . length($v) . "\r\n$v\r\n"]);
    }
    return (['send', '$' . length($args[0]) . "\r\n$args[0]\r\n"]) if $cmd eq 'PING' && @args;
    return (['send', "+PONG\r\n"]) if $cmd eq 'PING';
    # Database 9's confirmation comes with bytes nobody asked for.
    return (['send', "+OK\r\n\$3\r\nBAD\r\n"]) if $cmd eq 'SELECT' && $args[0] eq '9';
    return (['send', "+OK\r\n"]) if $cmd eq 'SELECT';
    return (['send', "-ERR unknown command\r\n"]);
});

my $closed = $ENV{TEST_NGINX_CLOSED_PORT};
my $port = nginx_start(<<"HTTP");
upstream main    { server 127.0.0.1:$main->{port}; }
upstream hol     { server 127.0.0.1:$hol->{port}; }
upstream nopipe  { server 127.0.0.1:$main->{port}; }
upstream authd   { server 127.0.0.1:$authd->{port}; }
upstream fake    { server 127.0.0.1:@{[ $fake->port ]}; }
upstream gone    { server 127.0.0.1:$gone->{port}; }
upstream rr      { server 127.0.0.1:$bal[0]{port}; server 127.0.0.1:$bal[1]{port}; }
upstream bk      { server 127.0.0.1:$bal[0]{port}; server 127.0.0.1:$bal[2]{port} backup; }
upstream bkdead  { server 127.0.0.1:$closed; server 127.0.0.1:$bal[2]{port} backup; }
log_format upstream '\$request_uri|\$status|\$upstream_addr|\$upstream_status|\$upstream_response_time|\$upstream_bytes_sent';
log_format bytes '\$request_method \$request_uri|\$upstream_bytes_sent|\$upstream_bytes_received|\$upstream_response_length';
server {
    listen 127.0.0.1:\$PORT;
    client_max_body_size 20m;
    location /c/   { set \$cache_key \$arg_k; set \$cache_db \$arg_db; access_log logs/access.log; access_log logs/bytes.log bytes; cache_pass main; }
    location /h3/  { set \$cache_key \$arg_k; cache_read_timeout 3s; cache_pass hol; }
    location /off/ { set \$cache_key \$arg_k; set \$cache_db \$arg_db; cache_pipeline off; access_log logs/access.log; access_log logs/bytes.log bytes; cache_pass nopipe; }
    location /a/   { set \$cache_key \$arg_k; set \$cache_db \$arg_db; cache_auth "se cret"; cache_pass authd; }
    location /f/   { set \$cache_key \$arg_key; cache_read_timeout 2s; cache_pass fake; }
    location /fdb/ {
        set \$cache_key \$arg_key;
        set \$cache_db \$arg_db;
        cache_read_timeout 2s;
        cache_next_upstream off;
        cache_pass fake;
    }
    location /fl/  {
        set \$cache_key \$arg_key;
        cache_read_timeout 2s;
        cache_next_upstream off;
        access_log logs/upstream.log upstream;
        cache_pass fake;
    }
    location /offep/ { set \$cache_key \$arg_k; cache_pipeline off; error_page 404 = /fallback; cache_pass nopipe; }
    location /onep/  { set \$cache_key \$arg_k; set \$cache_db \$arg_db; error_page 400 404 = /fallback; cache_pass main; }
    location = /fallback { return 200 "fallback"; }
    location /g/   { set \$cache_key \$arg_k; cache_pass gone; }
    location /rr/ {
        set \$cache_key \$arg_k;
        add_header X-Addr \$upstream_addr always;
        add_header X-Status \$upstream_status always;
        access_log logs/upstream.log upstream;
        cache_pass rr;
    }
    location /bk/     { set \$cache_key \$arg_k; add_header X-Addr \$upstream_addr always; cache_pass bk; }
    location /bkdead/ { set \$cache_key \$arg_k; add_header X-Addr \$upstream_addr always; cache_pass bkdead; }
}
HTTP

# --- helpers ---------------------------------------------------------------

# The lines of an access log in logs/, each split at "|", once the line
# whose first field is $last is there (a client can have the last bytes
# before nginx writes the line).
sub log_fields {
    my ($file, $last) = @_;
    my @lines;
    GatewayTest::wait_until(sub {
        open my $fh, '<', "$GatewayTest::NginxRoot/logs/$file" or die $!;
        @lines = map { chomp; [split /\|/] } <$fh>;
        return grep { $_->[0] eq $last } @lines;
    }, 2);
    return @lines;
}

sub raw_request {
    my ($method, $path, $body) = @_;
    $body //= '';
    return "$method $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " . length($body) . "\r\n\r\n$body";
}

# A client connection with a 4 KiB receive buffer (a client that does not
# read, or reads slowly).
sub small_window_client {
    my $c = IO::Socket::INET->new(Proto => 'tcp') or die $!;
    setsockopt($c, SOL_SOCKET, SO_RCVBUF, 4096) or die "SO_RCVBUF: $!";
    connect($c, pack_sockaddr_in($port, inet_aton('127.0.0.1'))) or die "connect: $!";
    binmode $c;
    return $c;
}

# What a client connection receives until nginx closes it, a whole
# response has come, or nothing comes for $wait seconds.
sub read_response {
    my ($c, $wait) = @_;
    my $buf = '';
    while (1) {
        my $rin = '';
        vec($rin, fileno($c), 1) = 1;
        last unless select(my $rout = $rin, undef, undef, $wait) > 0;
        my $n = sysread($c, my $chunk, 1 << 20);
        last unless $n;
        $buf .= $chunk;
        last if $buf =~ /\r\n\r\n/ && $buf =~ /Content-Length: (\d+)/i && length($buf) >= index($buf, "\r\n\r\n") + 4 + $1;
    }
    return $buf;
}

# One request on a connection of its own: { status, headers, body, error }.
sub req {
    my ($method, $path, $body) = @_;
    my ($r) = keepalive_requests($port, 30, [$method, $path, $body]);
    return $r;
}

# Requests each on a connection of its own, all sent at once (the sockets
# are connected first), then read together. Returns one hash per request:
# { status, headers, body, error }, and the seconds it all took.
sub parallel {
    my ($timeout, @reqs) = @_;
    my @c = map {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!";
        binmode $s;
        { s => $s, raw => raw_request(@$_), buf => '', open => 1 }
    } @reqs;
    my $t0 = time;
    syswrite($_->{s}, $_->{raw}) for @c;
    my $deadline = $t0 + stretch($timeout);
    while (grep { $_->{open} } @c) {
        my $left = $deadline - time;
        last if $left <= 0;
        my $rin = '';
        vec($rin, fileno($_->{s}), 1) = 1 for grep { $_->{open} } @c;
        next unless select(my $rout = $rin, undef, undef, $left) > 0;
        for my $c (grep { $_->{open} && vec($rout, fileno($_->{s}), 1) } @c) {
            my $got = sysread($c->{s}, my $chunk, 1 << 20);
            if ($got) { $c->{buf} .= $chunk } else { $c->{open} = 0; close $c->{s} }
        }
    }
    my $secs = time - $t0;
    my @out = map {
        my ($st, $h, $b) = parse_response($_->{buf});
        { status => $st // 0, headers => $h, body => $b, error => $_->{open} ? 'timeout' : undef }
    } @c;
    close $_->{s} for grep { $_->{open} } @c;
    return (\@out, $secs);
}

sub calls_of {
    my ($stats, $cmd) = @_;
    my ($v) = $stats =~ /^cmdstat_\Q$cmd\E:calls=(\d+)/m;
    return $v // 0;
}

# Connections to a Redis that are not redis-cli's own (the CLIENT LIST).
sub nginx_clients {
    my ($r) = @_;
    return scalar grep { /^id=/ && !/cmd=client\|list/ } split /\n/, redis_cli($r, 'CLIENT', 'LIST');
}

sub no_worker_trouble {
    my ($log, $name) = @_;
    my @bad = $log =~ /^(.*(?:\[alert\]|\[crit\]|\[emerg\]|exited on signal|panicked).*)$/mg;
    is(scalar @bad, 0, $name) or diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);
}

sub alive { my $pid = shift; open my $fh, '<', "/proc/$pid/stat" or return 0; (<$fh> // '') !~ /^\d+ \(.*\) Z/ }

sub value_for { my ($tag, $len) = @_; my $v = "<$tag>"; $v .= chr(97 + length($v) % 26) x ($len - length $v) if $len > length $v; $v }

# --- 1. forty clients at once, mixed commands and databases -----------------
{
    my $dir = tempdir('ngx-gateway-046-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my $clients = 40;
    my $rounds = 3;
    my @dbs = (undef, 0, 3, 7);
    # (A request of the warm-up so the counting below starts with nginx up.)
    is(req('GET', '/c/?k=warm-up')->{status}, 404, 'warm-up: a miss');
    my $conns_before = redis_connections($main);
    # Each child says it is ready, then waits for the go (its pipe
    # closing): client 0 first, the others a moment later.
    pipe(my $ready_r, my $ready_w) or die "pipe: $!";
    pipe(my $first_r, my $first_w) or die "pipe: $!";
    pipe(my $rest_r, my $rest_w) or die "pipe: $!";
    my @pids;
    for my $c (0 .. $clients - 1) {
        my $pid = fork;
        die "fork: $!" unless defined $pid;
        if (!$pid) {
            my $db = $dbs[$c % 4];
            my $other = ($db // 0) == 7 ? 3 : 7;
            my $q = defined $db ? "&db=$db" : '';
            my $key = "cl$c";
            my (@reqs, @want);
            for my $i (1 .. $rounds) {
                # Values of different sizes; some look like RESP inside.
                my $len = (17, 300, 5000, 70000)[($c + $i) % 4];
                my $v = value_for("client $c round $i", $len);
                $v .= "\r\n\$5\r\nEVIL!\r\n+OK\r\n" if $c % 3 == 0;
                my $final = "final $c/$i";
                push @reqs, ['PUT', "/c/?k=$key$q", $v], ['GET', "/c/?k=$key$q"], ['GET', "/c/?k=$key&db=$other"],
                    ['DELETE', "/c/?k=$key$q"], ['GET', "/c/?k=$key$q"], ['DELETE', "/c/?k=$key$q"],
                    ['PUT', "/c/?k=$key$q", $final], ['GET', "/c/?k=$key$q"];
                push @want, [201, ''], [200, $v], [404, ''], [204, ''], [404, ''], [404, ''], [201, ''], [200, $final];
            }
            close $ready_r;
            close $first_w;
            close $rest_w;
            syswrite($ready_w, 'x');
            sysread($c ? $rest_r : $first_r, my $nothing, 1);
            my @got = keepalive_requests($port, 20, @reqs);
            open my $out, '>', "$dir/res-$c" or _exit(1);
            my $ok = 0;
            for my $i (0 .. $#reqs) {
                my $g = $got[$i];
                my ($st, $body) = ($g->{status} // 'none', $g->{body} // '');
                # (A miss is nginx's own 404 page, as for its upstreams.)
                my $same = $want[$i][0] eq '404' ? $body =~ m{<title>404 Not Found</title>} : $body eq $want[$i][1];
                if ($st eq $want[$i][0] && $same) { $ok++; next }
                my $shown = length $body > 60 ? substr($body, 0, 60) . '... (' . length($body) . ' bytes)' : $body;
                print $out "FAIL client $c: $reqs[$i][0] $reqs[$i][1]: want $want[$i][0], got $st "
                    . ($g->{error} ? "($g->{error}) " : '') . "'$shown'\n";
            }
            print $out "OK $ok of " . scalar(@reqs) . "\n";
            close $out;
            _exit(0);
        }
        push @pids, $pid;
    }
    close $ready_w;
    close $first_r;
    close $rest_r;
    my $ready = 0;
    while ($ready < $clients) { sysread($ready_r, my $x, 64) or last; $ready += length $x }
    # Redis holds every command for 500 ms as the clients start: the
    # requests pile up, the connections are slow, and the worker opens
    # more of them, as many as it may. Client 0 goes 150 ms before the
    # others, so that its request has been waiting for longer than a
    # connection may keep a request waiting before a new one opens, however
    # the worker takes in the rest (in one go on a busy machine).
    redis_cli($main, 'CLIENT', 'PAUSE', int(stretch(0.5) * 1000), 'ALL');
    close $first_w;
    sleep(0.15);
    close $rest_w;
    waitpid($_, 0) for @pids;
    my ($ok, $all, @fails) = (0, 0);
    for my $c (0 .. $clients - 1) {
        open my $fh, '<', "$dir/res-$c" or do { push @fails, "client $c wrote no result"; next };
        while (<$fh>) {
            chomp;
            if (/^OK (\d+) of (\d+)/) { $ok += $1; $all += $2 } else { push @fails, $_ }
        }
    }
    is($ok, $clients * $rounds * 8, "$clients clients at once: every one of the " . ($clients * $rounds * 8)
        . ' responses has its own status and value') or diag(join "\n", @fails[0 .. ($#fails < 14 ? $#fails : 14)]);
    my $conns_after = redis_connections($main);
    my $opened = $conns_after - $conns_before - 1;    # (the second INFO's own)
    my $live = nginx_clients($main);
    cmp_ok($opened, '<=', 8, "the worker opened at most 8 connections to Redis ($opened)");
    cmp_ok($live, '<=', 8, "Redis has at most 8 clients from the worker ($live)");
    cmp_ok($live, '>=', 2, "with Redis slow, the load was spread over more than one connection ($live)")
        or diag(redis_cli($main, 'CLIENT', 'LIST'));
    # What Redis holds afterwards: each client's last value in its own database.
    my @wrong;
    for my $db (0, 3, 7) {
        my @cl = grep { ($dbs[$_ % 4] // 0) == $db } 0 .. $clients - 1;
        my @vals = split /\n/, redis_cli($main, '-n', $db, 'MGET', map { "cl$_" } @cl);
        for my $i (0 .. $#cl) {
            push @wrong, "db $db cl$cl[$i]: " . ($vals[$i] // 'none') unless ($vals[$i] // '') eq "final $cl[$i]/$rounds";
        }
    }
    is(scalar @wrong, 0, 'Redis holds each last value in its own database') or diag(join "\n", @wrong);
    is(redis_cli($main, '-n', 5, 'DBSIZE'), 0, 'and nothing went to a database no request asked for');
}

# --- 2. AUTH once per connection; SELECT only when the database changes -----
{
    redis_cli($authd, 'CONFIG', 'RESETSTAT');
    # (redis-cli's own connection and AUTH count too: one each per call.)
    my ($res) = parallel(10, map { ['GET', "/a/?k=nokey$_"] } 1 .. 40);
    my @codes = map { $_->{status} } @$res;
    is_deeply(\@codes, [(404) x 40], 'forty authenticated GETs at once: 404 each');
    my $stats = redis_cli($authd, 'INFO', 'commandstats');
    my $conns = redis_connections($authd) - 2;
    my $auths = calls_of($stats, 'auth') - 1;
    cmp_ok($conns, '>=', 1, "the worker opened connections ($conns)");
    cmp_ok($conns, '<=', 8, 'at most 8');
    is($auths, $conns, "AUTH went once per connection ($auths AUTH, $conns connections)");
    is(calls_of($stats, 'get'), 40, 'each GET ran once');
    is(calls_of($stats, 'ping'), 40 + $conns, 'a PING per request, and one with each AUTH');
    is(calls_of($stats, 'select'), 0, 'no SELECT at all when no request asks for a database');

    # Database 5, over and over, sequentially: the connection's database
    # is asked about once, then no more SELECTs.
    is(req('PUT', '/a/?k=five&db=5', 'in five')->{status}, 201, 'a store in database 5');
    redis_cli($authd, 'CONFIG', 'RESETSTAT');
    my @r = map { req('GET', '/a/?k=five&db=5') } 1 .. 30;
    is_deeply([map { "$_->{status} $_->{body}" } @r], [('200 in five') x 30], 'thirty reads of database 5, in order');
    $stats = redis_cli($authd, 'INFO', 'commandstats');
    cmp_ok(calls_of($stats, 'select'), '<=', 1, 'one SELECT at most for thirty requests in one database ('
        . calls_of($stats, 'select') . ')');
    is(calls_of($stats, 'auth') - 1, redis_connections($authd) - 2,
        'and AUTH only with a new connection');

    # Forty at once, all in database 6, which no connection is in yet: a
    # connection changes to it once, so SELECTs are far fewer than the
    # requests (about one per connection, at most 8 connections).
    redis_cli($authd, '-n', 6, 'SET', 'six', 'in six');
    redis_cli($authd, 'CONFIG', 'RESETSTAT');
    ($res) = parallel(10, map { ['GET', '/a/?k=six&db=6'] } 1 .. 40);
    is_deeply([map { "$_->{status} $_->{body}" } @$res], [('200 in six') x 40], 'forty reads of database 6 at once');
    $stats = redis_cli($authd, 'INFO', 'commandstats');
    my $selects = calls_of($stats, 'select');
    my $used = redis_info($authd, 'clients', 'connected_clients') - 1;
    cmp_ok($selects, '<=', 10, "SELECTs far fewer than the forty requests ($selects SELECTs, $used connections open)");
    is(calls_of($stats, 'get'), 40, 'each GET ran once');

    # Alternating databases, one request after the other: a SELECT for
    # each change at most, never one for a request that stays (fewer when
    # the pool has a connection in each database already: a slow machine
    # keeps more of them open).
    redis_cli($authd, 'CONFIG', 'RESETSTAT');
    @r = map { $_ % 2 ? req('GET', '/a/?k=five&db=5') : req('GET', '/a/?k=five') } 1 .. 20;
    is_deeply([map { $_->{status} } @r], [map { $_ % 2 ? 200 : 404 } 1 .. 20], 'alternating databases 5 and 0: each in its own');
    $stats = redis_cli($authd, 'INFO', 'commandstats');
    $selects = calls_of($stats, 'select');
    $used = redis_info($authd, 'clients', 'connected_clients') - 1;
    ok($selects <= 20 && ($used > 1 || $selects >= 19),
        "one SELECT per change of database at most ($selects for 20 requests, $used connections open)");
}

# --- 3. a hostile reply in the middle of a pipeline -------------------------
{
    my $round = 0;
    # Ten GETs at once on the fake, the bad one fifth; returns the answers,
    # the keys, and the fake's log of this round.
    my $run = sub {
        my ($bad) = @_;
        $round++;
        my @keys = map { "r$round-" . ($_ == 5 ? $bad : "k$_") } 1 .. 10;
        my $from = scalar $fake->log_lines;
        my ($res) = parallel(10, map { ['GET', "/f/?key=$_"] } @keys);
        sleep 0.1;
        my @log = ($fake->log_lines)[$from .. scalar($fake->log_lines) - 1];
        return ($res, \@keys, \@log);
    };
    # The connection each GET went on, and its place there.
    my $where = sub {
        my ($log) = @_;
        my (%conn, %place, %n);
        for (@$log) {
            my ($c, $k) = /^(\d+): GET (\S+)$/ or next;
            $conn{$k} = $c;
            $place{$k} = $n{$c}++;
        }
        return (\%conn, \%place);
    };

    for my $case (['garbage', 'a reply that is not RESP'], ['extra', 'bytes after a whole reply']) {
        my ($bad, $what) = @$case;
        my ($res, $keys, $log) = $run->($bad);
        my ($conn, $place) = $where->($log);
        my $bk = $keys->[4];
        my @behind = grep { $_ ne $bk && ($conn->{$_} // -1) == $conn->{$bk} && $place->{$_} > $place->{$bk} } @$keys;
        my $shared = grep { ($conn->{$_} // -1) == $conn->{$bk} } @$keys;
        cmp_ok($shared, '>=', 3, "$what: several requests were in flight on the connection of the bad reply ($shared)");
        my @cross = grep { my $b = $res->[$_]{body} // ''; $b =~ /^value of / && $b ne "value of $keys->[$_]" } 0 .. 9;
        is(scalar @cross, 0, "$what: no request got another request's value");
        if ($bad eq 'garbage') {
            is($res->[4]{status}, 502, "$what: that request gets 502");
        } else {
            # Its own reply was whole: the bytes after it are the next one's trouble.
            ok($res->[4]{status} == 502 || ($res->[4]{status} == 200 && $res->[4]{body} eq 'ok'),
                "$what: that request gets its own reply or 502 ($res->[4]{status})");
            unlike($res->[4]{body} // '', qr/SURPRISE/, "$what: never the extra bytes");
        }
        my @wrong;
        for my $i (0 .. 9) {
            next if $i == 4;
            my $k = $keys->[$i];
            my ($st, $b) = ($res->[$i]{status}, $res->[$i]{body} // '');
            my $want = (grep { $_ eq $k } @behind) ? '502' : "200 value of $k";
            push @wrong, "$k (conn $conn->{$k}, place $place->{$k}): want $want, got $st $b"
                unless ($want eq '502' ? $st == 502 : "$st $b" eq $want);
        }
        is(scalar @wrong, 0, "$what: the requests before it get their own values, those queued behind it on its connection 502 ("
            . scalar(@behind) . ' behind)') or diag(join "\n", @wrong, @$log);
        my ($after) = parallel(10, map { ['GET', "/f/?key=after$round-$_"] } 1 .. 10);
        is_deeply([map { "$_->{status} $_->{body}" } @$after], [map { "200 value of after$round-$_" } 1 .. 10],
            "$what: the next ten requests get their own values");
    }

    # A whole error reply (WRONGTYPE) fails only its own request: the
    # connection goes on and everyone else on it, before and behind, gets
    # their value.
    my ($res, $keys, $log) = $run->('wrongtype');
    my ($conn, $place) = $where->($log);
    my $wk = $keys->[4];
    is($res->[4]{status}, 502, 'WRONGTYPE in the middle of a pipeline: that request gets 502');
    is_deeply([map { "$res->[$_]{status} $res->[$_]{body}" } grep { $_ != 4 } 0 .. 9],
        [map { "200 value of $keys->[$_]" } grep { $_ != 4 } 0 .. 9], 'every other request gets its own value')
        or diag(join "\n", @$log);
    my $behind = grep { $_ ne $wk && ($conn->{$_} // -1) == $conn->{$wk} && $place->{$_} > $place->{$wk} } @$keys;
    cmp_ok($behind, '>=', 1, "requests were queued behind it on its connection ($behind)");
    my ($again) = parallel(10, map { ['GET', "/f/?key=again-$_"] } 1 .. 3);
    is_deeply([map { "$_->{status} $_->{body}" } @$again], [map { "200 value of again-$_" } 1 .. 3],
        'and the next requests too');
    sleep stretch(0.2);
    ok(!grep({ $_ eq "gone $conn->{$wk}" } $fake->log_lines), 'and its connection was not closed')
        or diag(join "\n", $fake->log_lines);
}

# --- 3b. replies cut short, stalled, or slow but steady ----------------------
{
    # A value cut by the server closing: the response is cut short, and
    # $upstream_status is the status answered (200), not a number past its
    # room in the log line.
    my $r = req('GET', '/fl/?key=r1-cutclose');
    ok(!defined $r->{status} || $r->{status} == 200, 'a value cut short: the response is cut');
    # A value header, then nothing for longer than cache_read_timeout:
    # nothing went to the client yet, so 504.
    $r = req('GET', '/fl/?key=r2-stallhdr');
    is($r->{status}, 504, 'a value that stalls after its header: 504 (nothing had gone out)');
    # A value that keeps coming, in all longer than cache_read_timeout but
    # never 2 s without bytes: whole (the timeout is between two reads).
    $r = req('GET', '/fl/?key=r3-steady');
    is($r->{status}, 200, 'a value that keeps coming for 2.4 s (cache_read_timeout 2s): 200');
    is(length($r->{body} // ''), 300000, 'and whole');
    my %logged = map { ($_->[0] => $_) } log_fields('upstream.log', '/fl/?key=r3-steady');
    is(($logged{'/fl/?key=r1-cutclose'} // [])->[3], '200', '$upstream_status of the cut value: 200');
    is(($logged{'/fl/?key=r2-stallhdr'} // [])->[3], '504', '$upstream_status of the stalled one: 504');
    # (Its try ends twice, at the timeout and at the request's end: the
    # second must not take back what the first counted. Found by outside
    # testing: 0.)
    cmp_ok(($logged{'/fl/?key=r2-stallhdr'} // [])->[5] // 0, '>', 20,
        '$upstream_bytes_sent of the stalled one: its command went out');
    is(($logged{'/fl/?key=r3-steady'} // [])->[3], '200', '$upstream_status of the steady one: 200');
    unlike(nginx_error_log(), qr/exited on signal|\[alert\]/, 'no worker trouble');

    # The confirmation of a database followed by bytes nobody asked for:
    # the stream is broken, and the request gets 502 at once (no endless
    # round of new connections, each confirming the database again).
    my $conns = $fake->connections;
    my $mark = length nginx_error_log();
    my $t0 = time;
    $r = req('GET', '/fdb/?key=r4-x&db=9');
    is($r->{status}, 502, 'a database confirmed with bytes after it: 502');
    cmp_ok(time - $t0, '<', stretch(1.5), 'at once');
    cmp_ok($fake->connections - $conns, '<=', 2, 'over one connection (or two)');
    my @lines = grep { /\[error\]/ } split /\n/, substr(nginx_error_log(), $mark);
    is(scalar @lines, 1, 'one error line') or diag(join "\n", @lines);
    like($lines[0] // '', qr/redis sent bytes that no command asked for.*GET \/fdb\//, 'naming the request');
}

# --- 4. clients that leave ------------------------------------------------
{
    my $big = periodic_bytes(5 * 1024 * 1024, 251, sub { $_[0] % 251 });
    is(req('PUT', '/c/?k=big5', $big)->{status}, 201, '5 MiB stored');
    is(req('PUT', "/c/?k=small$_", "small value $_")->{status}, 201, "small value $_ stored") for 1 .. 3;
    my $mark = length nginx_error_log();
    my $access = -s "$GatewayTest::NginxRoot/logs/access.log";
    # Redis holds every command for half a second: the requests are queued
    # on the shared connections when their clients leave.
    redis_cli($main, 'CLIENT', 'PAUSE', int(stretch(0.6) * 1000), 'ALL');
    my @leave;
    for my $i (1 .. 30) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
        my $path = $i % 3 == 0 ? '/c/?k=big5' : '/c/?k=small' . ($i % 3);
        $path .= '&db=3' if $i % 5 == 0;
        syswrite($s, raw_request('GET', $path));
        push @leave, $s;
    }
    # And a few that read some of the big value, then leave.
    my @partial = map {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
        syswrite($s, raw_request('GET', '/c/?k=big5'));
        $s
    } 1 .. 4;
    sleep 0.2;
    close $_ for @leave;
    sleep stretch(0.6);
    for my $s (@partial) {
        my $got = 0;
        my $deadline = time + stretch(5);
        while ($got < 200_000 && time < $deadline) {
            my $n = sysread($s, my $buf, 65536);
            last unless $n;
            $got += $n;
        }
        close $s;
    }
    sleep 0.3;
    my ($res, $secs) = parallel(10, map { ['GET', '/c/?k=small' . (1 + $_ % 3)] } 0 .. 19);
    is_deeply([map { "$_->{status} $_->{body}" } @$res], [map { '200 small value ' . (1 + $_ % 3) } 0 .. 19],
        'after 34 clients left, 20 requests at once get their own values');
    my $r = req('GET', '/c/?k=big5');
    is($r->{status}, 200, 'the big value is read again');
    ok(($r->{body} // '') eq $big, 'whole, byte for byte') or diag('got ' . length($r->{body} // '') . ' bytes');
    open my $fh, '<', "$GatewayTest::NginxRoot/logs/access.log" or die $!;
    seek $fh, $access, 0;
    my $left = grep { /" 499 / } <$fh>;
    cmp_ok($left, '>=', 30, "the clients left before their replies ($left requests logged with 499)");
    no_worker_trouble(substr(nginx_error_log(), $mark), 'no alert, crit or crash after the clients left');
}

# --- 5. a slow reader of a large value does not hold up the others ----------
{
    my $big = periodic_bytes(10 * 1024 * 1024, 256, sub { ($_[0] * 7) % 256 });
    is(req('PUT', '/c/?k=big10', $big)->{status}, 201, '10 MiB stored');
    my $mid = value_for('sixty-four k', 65536);
    is(req('PUT', "/c/?k=mid$_", "$_$mid")->{status}, 201, "a 64 KiB value $_ stored") for 1 .. 4;
    # A client with a small receive buffer that does not read.
    my $slow = small_window_client();
    syswrite($slow, raw_request('GET', '/c/?k=big10'));
    sleep 0.5;
    my ($res, $secs) = parallel(10, map { ['GET', '/c/?k=mid' . (1 + $_ % 4)] } 0 .. 19);
    my @wrong = grep { $res->[$_]{status} != 200 || $res->[$_]{body} ne (1 + $_ % 4) . $mid } 0 .. 19;
    is(scalar @wrong, 0, 'while a client does not read its 10 MiB, twenty others get their own 64 KiB values')
        or diag(join "\n", map { "#$_: $res->[$_]{status} " . length($res->[$_]{body}) . ' bytes' } @wrong);
    cmp_ok($secs, '<', stretch(2), sprintf('all twenty within 2 s (%.3f s)', $secs));
    # The slow reader then gets all of its value.
    my ($st, $h, $body) = do {
        my $buf = '';
        my $deadline = time + stretch(30);
        while (time < $deadline) {
            my $n = sysread($slow, my $chunk, 1 << 20);
            last unless $n;
            $buf .= $chunk;
        }
        parse_response($buf);
    };
    is($st, 200, 'the slow reader gets 200');
    ok(($body // '') eq $big, 'and its whole 10 MiB, byte for byte') or diag('got ' . length($body // '') . ' bytes');
    close $slow;

    # The others arriving together with the slow reader's request (the
    # same moment, so they are queued on its connection behind the 10
    # MiB value: a server of its own, with the one connection the stores
    # opened): they are not held up by it either. (cache_read_timeout 3s
    # there: a request held up gets 504 after 3 s, not 60.)
    is(req('PUT', '/h3/?k=big10', $big)->{status}, 201, '10 MiB stored on another server');
    is(req('PUT', "/h3/?k=mid$_", "$_$mid")->{status}, 201, "a 64 KiB value $_ stored there") for 1 .. 4;
    $slow = small_window_client();
    my @others = map {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
        binmode $s;
        $s
    } 0 .. 19;
    my $t0 = time;
    syswrite($slow, raw_request('GET', '/h3/?k=big10'));
    syswrite($others[$_], raw_request('GET', '/h3/?k=mid' . (1 + $_ % 4))) for 0 .. 19;
    my @bad;
    for my $i (0 .. 19) {
        my $buf = read_response($others[$i], stretch(10));
        close $others[$i];
        my ($st, undef, $b) = parse_response($buf);
        push @bad, "#$i: " . ($st // 'none') . ' ' . length($b // '') . ' bytes' unless ($st // 0) == 200 && $b eq (1 + $i % 4) . $mid;
    }
    my $took = time - $t0;
    is(scalar @bad, 0, 'twenty GETs sent together with the slow reader\'s get their own values')
        or diag(join "\n", @bad, 'connections to that server: ' . nginx_clients($hol));
    cmp_ok($took, '<', stretch(2), sprintf('all twenty within 2 s (%.3f s)', $took));
    close $slow;

    # Twelve slow readers of the 10 MiB value (more than the 8 connections
    # a server gets, and 120 MiB, past what a worker holds for slow
    # clients): each holds a connection of its own up, and the others
    # still get their values at once.
    my @slow = map {
        my $c = small_window_client();
        syswrite($c, raw_request('GET', '/c/?k=big10'));
        sleep 0.05;
        $c
    } 1 .. 12;
    sleep 0.5;
    ($res, $secs) = parallel(10, map { ['GET', '/c/?k=mid' . (1 + $_ % 4)] } 0 .. 19);
    @wrong = grep { $res->[$_]{status} != 200 || $res->[$_]{body} ne (1 + $_ % 4) . $mid } 0 .. 19;
    is(scalar @wrong, 0, 'while twelve clients do not read their 10 MiB, twenty others get their own values')
        or diag(join "\n", map { "#$_: $res->[$_]{status} " . length($res->[$_]{body}) . ' bytes' } @wrong);
    cmp_ok($secs, '<', stretch(2), sprintf('all twenty within 2 s (%.3f s)', $secs));
    close $_ for @slow;
}

# --- 6. a Redis restart ----------------------------------------------------
{
    is(req('PUT', '/g/?k=before', 'x')->{status}, 201, 'a store before the restart');
    # Requests on the shared connection when Redis dies: 502, promptly.
    redis_cli($gone, 'CLIENT', 'PAUSE', 3000, 'ALL');
    my @inflight = map {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
        syswrite($s, raw_request('GET', "/g/?k=before"));
        $s
    } 1 .. 5;
    sleep 0.2;
    my %old = %$gone;
    kill_redis($gone);
    my $t0 = time;
    my @st = map { (parse_response(read_response($_, stretch(5))))[0] // 'none' } @inflight;
    is_deeply(\@st, [(502) x 5], 'requests in flight when Redis was killed: 502');
    cmp_ok(time - $t0, '<', stretch(2), 'at once, not after a timeout');
    my $r = req('GET', '/g/?k=before');
    is($r->{status}, 502, 'while Redis is down: 502');
    # The same port again (held by kill_redis while it was down).
    GatewayTest::release_port($old{port});
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if (!$pid) {
        open STDOUT, '>', '/dev/null';
        { exec $RedisServer, '--port', $old{port}, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
            '--dir', $old{dir}, '--logfile', "$old{dir}/redis-again.log", '--daemonize', 'no' }
        _exit(127);
    }
    my $again = { %old, pid => $pid };
    push @GatewayTest::Redis, $again;
    my $up = 0;
    for (1 .. 500) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $old{port});
        if ($s) { close $s; $up = 1; last }
        sleep 0.01;
    }
    ok($up, 'Redis is back on the same port');
    $t0 = time;
    my ($ok_at, @early);
    while (time - $t0 < stretch(5)) {
        my $st = req('PUT', '/g/?k=after', 'back')->{status};
        if ($st == 201) { $ok_at = time; last }
        push @early, $st;
        sleep 0.05;
    }
    ok(defined $ok_at && $ok_at - $t0 < stretch(2),
        sprintf('requests succeed again %.3f s after the restart (before that: %s)', ($ok_at // 99) - $t0, "@early" || 'none'));
    my ($res) = parallel(10, map { ['GET', '/g/?k=after'] } 1 .. 20);
    is_deeply([map { "$_->{status} $_->{body}" } @$res], [('200 back') x 20], 'then twenty at once all succeed');
    is(redis_cli($again, 'GET', 'after'), 'back', 'on the new Redis');
}

# --- 7. balancing: round robin with a server gone, backup -------------------
{
    my ($p0, $p1, $p2) = map { "127.0.0.1:$_->{port}" } @bal;
    redis_cli($_, 'SET', 'same', 'everywhere') for @bal;
    redis_cli($bal[0], 'SET', 'who', 'primary');
    redis_cli($bal[2], 'SET', 'who', 'backup');
    my @r = map { req('GET', "/rr/?k=same&n=a$_") } 1 .. 6;
    is_deeply([map { "$_->{status} $_->{body}" } @r], [('200 everywhere') x 6], 'round robin: six reads');
    my %addr = map { ($_->{headers}{'x-addr'} // '') => 1 } @r;
    is_deeply([sort keys %addr], [sort $p0, $p1], 'from both servers ($upstream_addr)');
    is($r[0]{headers}{'x-status'}, '200', '$upstream_status is set');
    my $r = req('GET', '/bk/?k=who');
    is("$r->{status} $r->{body} $r->{headers}{'x-addr'}", "200 primary $p0", 'with the primary up, the primary answers');

    kill_redis($bal[0]);
    sleep 0.2;
    @r = map { req('GET', "/rr/?k=same&n=b$_") } 1 .. 6;
    is_deeply([map { "$_->{status} $_->{body}" } @r], [('200 everywhere') x 6], 'one server killed: all six reads succeed');
    my @addrs = map { $_->{headers}{'x-addr'} // '' } @r;
    my @retried = grep { $addrs[$_] eq "$p0, $p1" } 0 .. 5;
    is(scalar(grep { $_ ne $p1 && $_ ne "$p0, $p1" } @addrs), 0, "each from the live server, or the dead one and then it (@addrs)");
    is(scalar @retried, 1, 'one request went to the dead server, then on to the live one');
    if (@retried) {
        my $h = $r[ $retried[0] ]{headers};
        is($h->{'x-status'}, '502, 200', '$upstream_status of the retried request: 502, 200');
    }
    # The access log, written as each request ended.
    my %logged = map { ($_->[0] => $_) } log_fields('upstream.log', '/rr/?k=same&n=b6');
    my $first = $logged{'/rr/?k=same&n=a1'} // [];
    like($first->[4] // '', qr/^\d+\.\d{3}$/, "\$upstream_response_time of a request (@$first)");
    my @two = grep { ($logged{"/rr/?k=same&n=b$_"}[2] // '') =~ /, / } 1 .. 6;
    is(scalar @two, 1, 'the access log has the retried request with two addresses');
    if (@two) {
        my $f = $logged{"/rr/?k=same&n=b$two[0]"};
        is("$f->[2]|$f->[3]", "$p0, $p1|502, 200", '$upstream_addr and $upstream_status of the retry');
        like($f->[4], qr/^\d+\.\d{3}, \d+\.\d{3}$/, "\$upstream_response_time: a time for each try ($f->[4])");
        like($f->[5], qr/^0, [1-9]\d*$/, "\$upstream_bytes_sent: nothing to the server that refused the connection ($f->[5])");
    }
    $r = req('GET', '/bk/?k=who');
    is("$r->{status} $r->{body}", '200 backup', 'with the primary down, the backup answers');
    is($r->{headers}{'x-addr'}, "$p0, $p2", 'after the primary ($upstream_addr)');
    $r = req('GET', '/bkdead/?k=who');
    is("$r->{status} $r->{body} $r->{headers}{'x-addr'}", "200 backup 127.0.0.1:$closed, $p2",
        'a primary that never listened: the backup answers');
    $r = req('PUT', '/bk/?k=new', 'to backup');
    is($r->{status}, 201, 'a store with the primary down');
    is(redis_cli($bal[2], 'GET', 'new'), 'to backup', 'went to the backup');
}

# --- 8. cache_pipeline off ---------------------------------------------------
{
    # The same steps through nginx's upstream (cache_pipeline off) and
    # through the shared connections: the same answers, status and body.
    my $big = value_for('one mebibyte', 1 << 20);
    my @steps = (['PUT', 'k', 'plain value'], ['GET', 'k'], ['HEAD', 'k'], ['GET', 'missing'], ['DELETE', 'k'],
        ['GET', 'k'], ['DELETE', 'k'], ['PUT', 'big', $big], ['GET', 'big']);
    my %got;
    for my $loc ('off', 'c') {
        $got{$loc} = [map {
            my ($m, $k, $b) = @$_;
            my ($r) = keepalive_requests($port, 30, [$m, "/$loc/?k=$loc-$k", $b]);
            my $body = $r->{body} // '';
            "$m $k: " . ($r->{status} // 'none') . ' ' . (length $body > 100 ? length($body) . ' bytes ' . ($body eq $big ? 'whole' : 'other') : $body)
        } @steps];
    }
    is_deeply($got{off}, $got{c},
        'cache_pipeline off and on: the same answers to PUT, GET, HEAD, a miss, DELETE and 1 MiB');
    is_deeply([map { (split / /, $_)[2] } @{ $got{off} }], [201, 200, 200, 404, 204, 404, 404, 201, 200],
        'cache_pipeline off: the statuses of each');
    # $upstream_bytes_sent, $upstream_bytes_received and
    # $upstream_response_length, from the access log: the value's length,
    # and the bytes of each command and its replies, which differ from
    # cache_pipeline off's only by the key's name (off-k, c-k) and the PING
    # token's length. (nginx's upstream counts as the response length the
    # bytes it read after the reply's first line, whatever they were: 0
    # for a small value that came with it, the CRLF for a large one.)
    my %bytes;
    # (The first of each: "GET k" is asked again after the DELETE.)
    $bytes{ $_->[0] } //= [@$_[1 .. 3]] for log_fields('bytes.log', 'GET /c/?k=c-big');
    for my $step (['GET', 'k', 11], ['GET', 'big', 1 << 20], ['PUT', 'big', 0]) {
        my ($m, $k, $len) = @$step;
        my ($off, $on) = map { $bytes{"$m /$_/?k=$_-$k"} // ['-', '-', '-'] } 'off', 'c';
        is($on->[2], $len, "$m $k: \$upstream_response_length $len") if $m eq 'GET';
        my $sent = $m eq 'PUT' ? 1 << 20 : 20;
        cmp_ok($on->[0], '>', $sent, "$m $k: \$upstream_bytes_sent ($on->[0], off: $off->[0])");
        cmp_ok(abs($on->[0] - $off->[0]), '<', 12, "$m $k: within a few bytes of cache_pipeline off's");
        cmp_ok($on->[1], '>', $len + 6, "$m $k: \$upstream_bytes_received ($on->[1], off: $off->[1])");
        cmp_ok(abs($on->[1] - $off->[1]), '<', 12, "$m $k: within a few bytes of cache_pipeline off's");
    }
    my @r = (req('PUT', '/off/?k=cross', 'one'), req('GET', '/c/?k=cross'), req('PUT', '/c/?k=cross', 'two'),
        req('GET', '/off/?k=cross'));
    is_deeply([map { "$_->{status} $_->{body}" } @r], ['201 ', '200 one', '201 ', '200 two'],
        'what one stores the other reads');
    # error_page applies to what the cache answers (docs/cache.md): a miss, or a
    # database Redis refuses, goes to the fallback location either way.
    my $r = req('GET', '/offep/?k=missing');
    is("$r->{status} $r->{body}", '200 fallback', 'error_page 404 = /fallback, cache_pipeline off: a miss goes to the fallback');
    $r = req('GET', '/onep/?k=missing');
    is("$r->{status} $r->{body}", '200 fallback', 'error_page 404 = /fallback, cache_pipeline on: a miss goes to the fallback');
    $r = req('GET', '/onep/?k=x&db=16');
    is("$r->{status} $r->{body}", '200 fallback', 'error_page 400 = /fallback: a database Redis refuses goes to the fallback');
    my $before = redis_connections($main);
    @r = map { req('GET', '/off/?k=c-big') } 1 .. 5;
    my $opened = redis_connections($main) - $before - 1;
    is($opened, 5, 'cache_pipeline off (no keepalive): a connection per request, nginx\'s upstream');
    $before = redis_connections($main);
    @r = map { req('PUT', "/off/?k=off-db$_&db=3", "db3 $_") } 1 .. 5;
    is_deeply([map { $_->{status} } @r], [(201) x 5], 'cache_pipeline off with $cache_db: stored');
    $opened = redis_connections($main) - $before - 1;
    cmp_ok($opened, '<=', 1, "over the shared connections ($opened opened)");
    is(redis_cli($main, '-n', 3, 'GET', 'off-db3'), 'db3 3', 'in database 3');
}

# --- 9. reload with idle shared connections ---------------------------------
{
    my @r = (req('GET', '/c/?k=small1'), req('GET', '/a/?k=five&db=5'), req('GET', '/f/?key=reload'));
    is_deeply([map { $_->{status} } @r], [200, 200, 200], 'shared connections open to three servers');
    my @old = nginx_workers();
    is(scalar @old, 1, 'one worker');
    my $mark = length nginx_error_log();
    my $t0 = time;
    nginx_signal('HUP');
    my $exited = GatewayTest::wait_until(sub { !grep { alive($_) } @old }, 5);
    my $took = time - $t0;
    ok($exited, sprintf('the old worker exited %.3f s after the reload', $took));
    my @new;
    GatewayTest::wait_until(sub { @new = grep { my $n = $_; !grep { $_ == $n } @old } nginx_workers(); @new }, 5);
    is(scalar @new, 1, 'a new worker runs');
    @r = (req('PUT', '/c/?k=reloaded', 'yes'), req('GET', '/c/?k=reloaded'), req('GET', '/a/?k=five&db=5'),
        req('GET', '/f/?key=reload2'));
    is_deeply([map { "$_->{status} $_->{body}" } @r], ['201 ', '200 yes', '200 in five', '200 value of reload2'],
        'requests after the reload are answered');
    no_worker_trouble(substr(nginx_error_log(), $mark), 'no alert or crash in the reload');

    # A reload while Redis is busy (its event loop held for 2 s, DEBUG
    # SLEEP) and requests wait on the confirmation of new databases: the
    # old worker answers them all once Redis is free (each one's probe
    # ends, then its command goes out on the connection it left, which must
    # not close as idle meanwhile). (Not a script that loops on TIME: in Redis 8
    # and Valkey 8 a script sees the time it started at, so it would run on
    # past busy-reply-threshold, 5 s, and the server answers BUSY meanwhile.)
    my $busy = fork // die "fork: $!";
    if (!$busy) {
        redis_cli($main, 'DEBUG', 'SLEEP', '2');
        POSIX::_exit(0);
    }
    sleep 0.3;
    my @socks = map {
        my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
        binmode $c;
        syswrite($c, raw_request('GET', "/c/?k=busy$_&db=" . (8 + $_)));
        $c
    } 1 .. 4;
    sleep 0.3;
    @old = nginx_workers();
    nginx_signal('HUP');
    my @st = map { (parse_response(read_response($_, stretch(10))))[0] // 'none' } @socks;
    waitpid $busy, 0;
    is("@st", '404 404 404 404', 'a reload while Redis is busy: the waiting requests with new databases are answered');
    ok(GatewayTest::wait_until(sub { !grep { alive($_) } @old }, stretch(10)), 'and the old worker exits');
}

no_worker_trouble(nginx_error_log(), 'no alert, crit or crash in the whole run');
stop_nginx();
done_testing();
