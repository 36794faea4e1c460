# The cache gateway against a hostile or broken Redis: overflowing lengths,
# malformed, dripped, truncated, late and unsolicited replies. Each case
# checks the status, the error-log line, and that the next request on the
# same pooled connection (keepalive 1) gets its own answer, never bytes
# meant for another. Then the state of pooled connections against a real
# Redis: $cache_db and AUTH never outlive their request.
#
# Run with `cache_pipeline off` (nginx's upstream, a connection per
# request); t/207 runs the same file with the shared, pipelined connections.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log start_redis redis_cli stretch);
use FakeRedis;
use HttpClient qw(keepalive_requests);
use Test::More;
use Time::HiRes qw(sleep);

my $mode = $ENV{GATEWAY_CACHE_PIPELINE} // 'off';
my $piped = $mode eq 'on';

# What the fake answers: per key of the GET, the steps of the reply.
my %reply = (
    'ok'       => [['send', "\$2\r\nok\r\n"]],
    'other'    => [['send', "\$5\r\nother\r\n"]],
    'miss'     => [['send', "\$-1\r\n"]],
    'huge'     => [['send', "\$9223372036854775807\r\na"], ['later', 0.05, "\$5\r\nEVIL!\r\n"]],
    'overmax'  => [['send', "\$536870913\r\nabc"]],
    'negative' => [['send', "\$-5\r\n"]],
    'garbage'  => [['send', "hello there\r\n"]],
    'array'    => [['send', "*1\r\n\$2\r\nok\r\n"]],
    'integer'  => [['send', ":12\r\n"]],
    'status'   => [['send', "+OK\r\n"]],
    'huge-int' => [['send', ":99999999999999999999\r\n"]],
    'drip'     => [['drip', "\$12\r\nhello\r\nworld\r\n", 0.005]],
    'cut'      => [['send', "\$10\r\nhello"], ['close']],
    'cut-head' => [['send', "\$1"], ['close']],
    'extra'    => [['send', "\$2\r\nok\r\n+SURPRISE\r\n"]],
    'extra-miss' => [['send', "\$-1\r\n\$4\r\nevil\r\n"]],
    'idle-junk'  => [['send', "\$2\r\nok\r\n"], ['later', 0.05, "\$4\r\nevil\r\n"]],
    'smuggle'  => [['send', "\$2\r\nok\r\n"], ['stale', 0.05, "\$4\r\nevil\r\n"]],
    'smuggle-ok' => [['send', "\$2\r\nok\r\n"], ['stale', 0.05, "+OK\r\n"]],
    # Stale bytes that look like a reply to PING and a value.
    'smuggle-pong' => [['send', "\$2\r\nok\r\n"], ['stale', 0.05, "+PONG\r\n\$6\r\nSTALE!\r\n"]],
    'late'     => [['sleep', 0.6], ['send', "\$4\r\nlate\r\n"]],
    'set-extra' => [['send', "+OK\r\n+OK\r\n+EXTRA\r\n"]],
    'bad-end'  => [['send', "\$2\r\nokXY"]],
    'bad-end-long' => [['send', "\$3\r\nabcXYZ\r\n"]],
    'bad-end-cr' => [['send', "\$3\r\nabc\rX"]],
    'error'    => [['send', "-ERR something broke\r\n"]],
    'long-line' => [['send', '+' . ('x' x 70000) . "\r\n"]],
    # A header line ended by a bare LF, or holding a bare CR: never RESP,
    # whatever follows (the rest comes after cache_read_timeout, if ever).
    'bare-lf'  => [['send', "\$3\n"], ['sleep', 1], ['send', "abc\r\n"]],
    'bare-cr'  => [['send', "\$3\rabc"], ['sleep', 1], ['send', "\r\n"]],
    'bare-lf-ok' => [['send', "+OK\n"]],
);

my $fake = FakeRedis->start(sub {
    my ($conn, $n, $cmd, @args) = @_;
    return @{ $reply{ $args[0] // '' } // [['send', "-ERR unknown\r\n"]] } if uc $cmd eq 'GET';
    return @{ $reply{ $args[0] // '' } // [['send', "+OK\r\n"]] } if uc $cmd eq 'SET';
    return (['send', "-ERR DB index is out of range\r\n"]) if uc $cmd eq 'SELECT' && $args[0] >= 16;
    return (['send', "+OK\r\n"]) if uc $cmd eq 'SELECT';
    # PING echoes its token, as Redis does.
    return (['send', '$' . length($args[0]) . "\r\n$args[0]\r\n"]) if uc $cmd eq 'PING' && @args;
    return (['send', "+PONG\r\n"]) if uc $cmd eq 'PING';
    return (['send', "-ERR unknown command\r\n"]);
});

my $port = nginx_start(<<"HTTP");
upstream fake { server 127.0.0.1:@{[ $fake->port ]}; keepalive 1; }
server {
    listen 127.0.0.1:\$PORT;
    location /k/ {
        set \$cache_key \$arg_key;
        set \$cache_db \$arg_db;
        cache_read_timeout 300ms;
        cache_pipeline $mode;
        cache_pass fake;
    }
}
HTTP

# One hostile reply, then a good one on the same client and (when the first
# left it reusable) the same upstream connection.
sub case {
    my ($key, $status, $log, $name, %opt) = @_;
    my $before = $fake->connections;
    my $mark = length nginx_error_log();
    my @r = keepalive_requests($port, 5, ['GET', "/k/?key=$key"], ['GET', '/k/?key=other']);
    if (defined $status) {
        is($r[0]{status}, $status, "$name: status $status");
    } else {
        ok(!defined $r[0]{status} || ($r[0]{error} // '') ne '', "$name: the response is cut short")
            or diag(explain $r[0]);
    }
    my $after_log = substr(nginx_error_log(), $mark);
    like($after_log, $log, "$name: the error log says why") if $log;
    if (defined $status) {
        is($r[1]{status}, 200, "$name: the next request succeeds");
        is($r[1]{body}, 'other', "$name: and gets its own answer");
    } else {
        # The client connection was cut: ask again on a new one.
        my @again = keepalive_requests($port, 5, ['GET', '/k/?key=other']);
        is($again[0]{body}, 'other', "$name: the next request gets its own answer");
    }
    sleep 0.1;    # anything the fake sends later
    my @after = keepalive_requests($port, 5, ['GET', '/k/?key=other']);
    is($after[0]{body}, 'other', "$name: and so does the one after");
    unlike($after_log, qr/\[alert\]|exited on signal/, "$name: no worker trouble");
    return $fake->connections - $before;
}

my ($n, $mark, @r);
$n = case('huge', 502, qr/\[error\].*value length of 9223372036854775807 bytes, more than 536870912 allowed/,
    'a bulk length near 2^63');
cmp_ok($n, '>=', 2, 'the connection of the overflowing reply was not reused');
case('overmax', 502, qr/\[error\].*value length of 536870913 bytes/, 'a bulk one byte over 512 MB');
case('negative', 502, qr/invalid reply to GET/, 'a negative bulk length');
case('garbage', 502, qr/\[error\].*cache: redis sent an invalid reply to GET/, 'a reply that is not RESP');
case('array', 502, qr/invalid reply to GET/, 'an array to GET');
case('integer', 502, qr/invalid reply to GET/, 'an integer to GET');
case('status', 502, qr/invalid reply to GET/, 'a status to GET');
case('huge-int', 502, qr/invalid reply to GET/, 'an integer that overflows');
case('error', 502, qr/redis answered GET with an error: ERR something broke/, 'an error reply');
case('long-line', 502, qr/upstream sent too big header|invalid reply/, 'a reply line longer than the buffer');
case('miss', 404, undef, 'a miss');

# A bare LF (or CR) in a reply header line is refused as soon as it is
# seen, not waited on until cache_read_timeout (which would be 504).
case('bare-lf', 502, qr/\[error\].*cache: redis sent an invalid reply to GET/, 'a bulk header ended by a bare LF');
case('bare-cr', 502, qr/\[error\].*cache: redis sent an invalid reply to GET/, 'a bare CR in a bulk header');
$mark = length nginx_error_log();
@r = keepalive_requests($port, 5, ['PUT', '/k/?key=bare-lf-ok', 'v'], ['GET', '/k/?key=other']);
is($r[0]{status}, 502, 'a status line ended by a bare LF: 502');
like(substr(nginx_error_log(), $mark), qr/\[error\].*cache: redis sent an invalid reply to SET/, 'the error log says why');
is($r[1]{body}, 'other', 'and the next request gets its own answer');

# A dripped reply is whole, and its connection is reused.
my $before = $fake->connections;
@r = keepalive_requests($port, 5, ['GET', '/k/?key=drip'], ['GET', '/k/?key=ok']);
is($r[0]{status}, 200, 'a reply dripped byte by byte: 200');
is($r[0]{body}, "hello\r\nworld", 'and the value is whole');
is($r[1]{body}, 'ok', 'the next request gets its own answer');
is($fake->connections - $before, 0, 'on the same upstream connection (reused)');

# Truncated replies: the value cut mid-way cannot complete.
case('cut', undef, qr/upstream prematurely closed connection/, 'a value cut mid-way');
case('cut-head', 502, qr/upstream prematurely closed connection/, 'a reply header cut mid-way');

# Unsolicited bytes: right after the reply, or later on an idle connection.
$n = case('extra', 200, qr/\[error\].*redis sent bytes that no command asked for/, 'bytes after the reply');
cmp_ok($n, '>=', 1, 'the connection with extra bytes was not reused');
case('extra-miss', 404, qr/redis sent bytes that no command asked for/, 'bytes after a miss');
# Bytes that come to a pooled connection while it is idle: it is closed,
# and the next request, sent once they have come (50 ms after the reply),
# goes on another connection. (Sent within those 50 ms, as a busy machine
# may not manage, it would find them before the echo of its PING: the
# stale bytes below.)
{
    my $from = scalar $fake->log_lines;
    @r = keepalive_requests($port, 5, ['GET', '/k/?key=idle-junk']);
    is($r[0]{body}, 'ok', 'bytes sent later to an idle pooled connection: the request before them gets its answer');
    sleep stretch(0.3);
    @r = keepalive_requests($port, 5, ['GET', '/k/?key=other']);
    is($r[0]{status}, 200, 'bytes sent later to an idle pooled connection: the next request succeeds');
    is($r[0]{body}, 'other', 'bytes sent later to an idle pooled connection: and gets its own answer');
    my %conn_of = map { ($_->[1] => $_->[0]) } commands_since($from);
    isnt($conn_of{'GET other'}, $conn_of{'GET idle-junk'}, 'bytes sent later to an idle pooled connection: which was not used again');
}
# Bytes after the last reply of a store: logged once (the input filter is
# not handed them again).
$mark = length nginx_error_log();
@r = keepalive_requests($port, 5, ['PUT', '/k/?key=set-extra&db=3', 'v'], ['GET', '/k/?key=other']);
is_deeply([map { $_->{status} } @r], [201, 200], 'bytes after the replies to a store: 201, then the next answer');
my @said = substr(nginx_error_log(), $mark) =~ /(redis sent bytes that no command asked for)/g;
is(scalar @said, 1, 'and one error-log line about them');

# Stale bytes: sent by the server after a complete reply, they arrive once
# the pooled connection has gone to the next request, in front of its
# replies. Every request starts with PING <token>, and anything before the
# echo of its own token (even a +PONG and a value) means
# the connection carries bytes from before: 502, one error line, the
# connection closed; never the stale bytes as the next request's answer.
sub commands_since {
    my ($from) = @_;
    my @l = $fake->log_lines;
    # The PING token differs every time: shown as PING.
    return map {
        my ($conn, $cmd) = /^(\d+): (.*)$/ ? ($1, $2) : ();
        defined $conn ? [$conn, $cmd =~ s/^PING [0-9a-f]{16}$/PING/r] : ();
    } @l[$from .. $#l];
}
for my $stale (['smuggle', 'a bulk'], ['smuggle-ok', 'a status'], ['smuggle-pong', 'a PONG and a value']) {
    my ($key, $what) = @$stale;
    my $from = scalar $fake->log_lines;
    $mark = length nginx_error_log();
    @r = keepalive_requests($port, 5, ['GET', "/k/?key=$key"], ['GET', '/k/?key=other'], ['GET', '/k/?key=ok']);
    is($r[0]{body}, 'ok', "stale bytes ($what): the request before them gets its answer");
    is($r[1]{status}, 502, "stale bytes ($what): the request that finds them gets 502");
    unlike($r[1]{body} // '', qr/evil|STALE/, "stale bytes ($what): and not them as its value");
    is($r[2]{body}, 'ok', "stale bytes ($what): the request after gets its own answer");
    my @cmds = commands_since($from);
    my %conn_of = map { ($_->[1] => $_->[0]) } @cmds;
    my $pooled = $conn_of{"GET $key"} // -1;
    # What the next request sent on the pooled connection: its PING, then
    # its GET, unless nginx closed the connection (on the stale bytes)
    # before the fake had read that far (a busy machine).
    my @on_it = map { $_->[1] } grep { $_->[0] == $pooled } @cmds;
    my ($at) = grep { $on_it[$_] eq "GET $key" } 0 .. $#on_it;
    my $next = join ' ', @on_it[($at // $#on_it) + 1 .. $#on_it];
    like($next, qr/^PING/, "stale bytes ($what): they came on the pooled connection ($next)");
    isnt($conn_of{'GET ok'}, $pooled, "stale bytes ($what): which was not used again");
    like($next, qr/^PING(?: GET other)?$/, "stale bytes ($what): PING went first");
    my $log = substr(nginx_error_log(), $mark);
    my @lines = grep { /\[error\]/ } split /\n/, $log;
    is(scalar @lines, 1, "stale bytes ($what): one error line") or diag($log);
    like($log, qr/\[error\].*cache: redis sent .* where the echo of PING was due/, "stale bytes ($what): which says so");
}

# A reply after the timeout goes nowhere.
case('late', 504, qr/upstream timed out/, 'a reply after cache_read_timeout');
sleep 0.7;
@r = keepalive_requests($port, 5, ['GET', '/k/?key=ok'], ['GET', '/k/?key=other']);
is_deeply([map { $_->{body} } @r], ['ok', 'other'], 'after the late reply arrived, answers are still right');

# A value that does not end with CRLF, when all of it came with its
# header: 502 before any header goes out, and the connection goes.
$n = case('bad-end', 502, qr/\[error\].*cache: redis sent an invalid end of value/, 'a value without its CRLF');
cmp_ok($n, '>=', 1, 'the connection of the value without its CRLF was not reused');
$n = case('bad-end-long', 502, qr/\[error\].*cache: redis sent an invalid end of value/,
    'a value followed by other bytes than CRLF');
cmp_ok($n, '>=', 1, 'the connection was not reused');
case('bad-end-cr', 502, qr/\[error\].*cache: redis sent an invalid end of value/, 'a value followed by CR alone');

# $cache_db: the fake sees PING, SELECT n, the command, and SELECT 0 before the connection is reused.
$mark = scalar $fake->log_lines;
@r = keepalive_requests($port, 5, ['GET', '/k/?key=ok&db=5'], ['GET', '/k/?key=other']);
is_deeply([map { $_->{body} } @r], ['ok', 'other'], '$cache_db: both requests answered');
my @cmds = map { s/^\d+: //r =~ s/^PING [0-9a-f]{16}$/PING/r } grep { /^\d+: / } ($fake->log_lines)[$mark .. scalar($fake->log_lines) - 1];
# A request with $cache_db always goes over the shared connections: the
# database is asked about alone first (PING, SELECT 5), and the command
# goes out only once Redis said yes. The shared connection changes its
# database again only for a request that wants another one.
is_deeply(\@cmds,
    $piped
    ? ['PING', 'SELECT 5', 'PING', 'GET ok', 'PING', 'SELECT 0', 'GET other']
    : ['PING', 'SELECT 5', 'PING', 'GET ok', 'PING', 'GET other'],
    'SELECT 5 is confirmed before the command; the next request does not run in database 5');

# $cache_db beyond SELECT's int (Redis takes 0 to 2147483647): 400 at
# info before anything is sent; the largest one goes out as it is (the
# fake, as a Redis of 16 databases, refuses SELECT 16 and over).
my $from = scalar $fake->log_lines;
$mark = length nginx_error_log();
@r = map { keepalive_requests($port, 5, ['GET', "/k/?key=other&db=$_"]) } '2147483648', '4294967296', '-1';
is_deeply([map { $_->{status} } @r], [400, 400, 400], '$cache_db over 2147483647 or negative: 400');
is_deeply([commands_since($from)], [], 'and nothing reached the server');
my $said = substr(nginx_error_log(), $mark);
like($said, qr/\[info\].*"\$cache_db" is not a database number \(0 to 2147483647\): "2147483648"/, 'logged at info');
unlike($said, qr/\[error\]/, 'and not as an error');
$from = scalar $fake->log_lines;
@r = keepalive_requests($port, 5, ['GET', '/k/?key=other&db=2147483647']);
is_deeply([map { $_->[1] } commands_since($from)], ['PING', 'SELECT 2147483647'],
    '$cache_db 2147483647 is a database number, sent as it is (and asked about before the command)');
is($r[0]{status}, 400, 'which this server (of 16) refuses: 400');

# A database Redis refuses: the client's mistake (400 at info), and the
# command never reaches the server (it would run in another database).
$from = scalar $fake->log_lines;
$mark = length nginx_error_log();
@r = keepalive_requests($port, 5, ['GET', '/k/?key=ok&db=16'], ['GET', '/k/?key=other']);
is_deeply([map { $_->{status} } @r], [400, 200], 'SELECT refused: 400, then the next request is answered');
is($r[1]{body}, 'other', 'with its own answer');
$said = substr(nginx_error_log(), $mark);
like($said, qr/\[info\].*cache: redis refused SELECT 16 \("\$cache_db"\): ERR DB index is out of range/,
    'the refusal is logged at info');
unlike($said, qr/\[error\]/, 'and not as an error');
my @cmds_db = map { $_->[1] } commands_since($from);
ok(!grep({ $_ eq 'GET ok' } @cmds_db), 'the command of the refused database was never sent') or diag(explain \@cmds_db);
is_deeply([@cmds_db[0, 1]], ['PING', 'SELECT 16'], 'only PING and SELECT were');

stop_nginx();

# Against a real Redis: nothing of one request's database or AUTH is left
# on the pooled connection for the next one.
my $redis = start_redis(password => 'pw');
$port = nginx_start(<<"HTTP");
upstream redis { server 127.0.0.1:$redis->{port}; keepalive 1; }
server {
    listen 127.0.0.1:\$PORT;
    cache_pipeline $mode;
    location /auth/ {
        set \$cache_key \$uri;
        set \$cache_db \$arg_db;
        set \$cache_exptime \$arg_ttl;
        cache_auth pw;
        cache_pass redis;
    }
    location /noauth/ {
        set \$cache_key \$uri;
        cache_pass redis;
    }
}
HTTP
@r = keepalive_requests($port, 5, ['PUT', '/auth/x?db=5', 'in five'], ['GET', '/auth/x'], ['GET', '/auth/x?db=5'],
    ['GET', '/noauth/x']);
is_deeply([map { $_->{status} } @r], [201, 404, 200, 502],
    'db 5 stays with its request; a request without cache_auth is not authenticated by an earlier one');
is($r[2]{body}, 'in five', 'the value is in database 5');
like(nginx_error_log(), qr/cache: PING was refused: NOAUTH/, 'the unauthenticated request got NOAUTH');
my $clients = redis_cli($redis, 'INFO', 'stats');
my ($conns) = $clients =~ /total_connections_received:(\d+)/;
# The start-up probe and this redis-cli; the PUT's connection, kept (reset)
# and reused by the first GET; authenticated GETs close their connection
# instead of resetting it (see t/205), so the second GET and the request
# without cache_auth open one each.
cmp_ok($conns, '<=', 5, "connections kept where they may be ($conns connections, the probe's and redis-cli's included)");

# A database Redis refuses never takes the command to another one: a
# store and a delete with $cache_db 16 (of 16) get 400, and database 0,
# the connection's, is untouched.
@r = keepalive_requests($port, 5, ['PUT', '/auth/w', 'zero'], ['PUT', '/auth/w?db=16', 'lost'],
    ['DELETE', '/auth/w?db=16'], ['GET', '/auth/w'], ['GET', '/auth/x?db=5']);
is_deeply([map { $_->{status} } @r], [201, 400, 400, 200, 200], 'a refused database: 400 for a store and for a delete');
is($r[3]{body}, 'zero', 'database 0 kept its value: the store ran nowhere, the delete deleted nothing');
is($r[4]{body}, 'in five', 'and database 5 still answers');
is(redis_cli($redis, 'GET', '/auth/w'), 'zero', 'as Redis itself says');

# $cache_exptime 0 is no expiry; a number is seconds; anything else 400 at info.
# (nginx closes the client connection after a 400.)
@r = map { keepalive_requests($port, 5, $_) } ['PUT', '/auth/t0?ttl=0', 'forever'],
    ['PUT', '/auth/t9?ttl=90', 'ninety'], ['PUT', '/auth/tx?ttl=abc', 'bad'], ['PUT', '/auth/ty?db=x', 'bad'];
is_deeply([map { $_->{status} } @r], [201, 201, 400, 400], '$cache_exptime 0 and 90 stored; bad numbers 400');
is(redis_cli($redis, 'TTL', '/auth/t0'), '-1', '$cache_exptime 0: no expiry');
cmp_ok(redis_cli($redis, 'TTL', '/auth/t9'), '>', 80, '$cache_exptime 90: expires');
my $log = nginx_error_log();
like($log, qr/\[info\].*cache: "\$cache_exptime" is not a number of seconds: "abc"/, 'a bad $cache_exptime is logged at info');
like($log, qr/\[info\].*cache: "\$cache_db" is not a database number \(0 to 2147483647\): "x"/,
    'a bad $cache_db is logged at info');
unlike($log, qr/\[alert\]|exited on signal/, 'no worker trouble');
stop_nginx();

done_testing();
