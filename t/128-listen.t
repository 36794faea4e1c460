# sqldb_listen: NOTIFY on a channel reaches every subscriber of every
# worker as server-sent events, exactly and in order; heartbeats; a client
# that leaves is removed at once (UNLISTEN after the last); the shared
# listening connection survives pg_terminate_backend and tells the
# subscribers (event: reconnect); streams end on a reload; nginx -t.
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump events subscribed subscribers metric);
use GatewayTest qw(conf_line_of nginx_conf_test http_request wait_until nginx_start stop_nginx nginx_signal nginx_error_log psql stretch
    workers_idle_ok);
use IO::Select;
use IO::Socket::INET;
use Socket ();
use IO::Handle;
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

my $server = GatewayTest::pg_server_line('listen');
my $port = nginx_start(<<"HTTP", workers => 2);
upstream db { sqldb_server $server; }
server {
    listen 127.0.0.1:\$PORT;
    sqldb_listen_heartbeat 1s;
    location /events { sqldb_pass db; sqldb_listen \$arg_channel; }
    location /fixed { sqldb_pass db; sqldb_listen Orders; }
    location = /metrics { gateway_status; }
}
HTTP


# 1. Six subscribers (over both workers), twenty notifications: each gets
# all twenty, in order, and nothing of another channel.
my @subs = map { open_sse($port, '/events?channel=orders') } 1 .. 6;
pump(\@subs, stretch(5), subscribed(@subs));
like($subs[0]{buf}, qr{^HTTP/1\.1 200 }, 'status 200');
like($subs[0]{buf}, qr{Content-Type: text/event-stream}i, 'text/event-stream');
like($subs[0]{buf}, qr{Cache-Control: no-cache}i, 'not cached');
is(scalar(grep { $_->{buf} =~ /: subscribed/ } @subs), 6, 'six subscribers are on');
# (": subscribed" comes once the server has the LISTEN: nothing sent
# from then on is missed.)
for my $i (1 .. 20) {
    psql($i == 7 ? "select pg_notify('orders', E'line one\\nline two')" : "notify orders, 'n$i'");
    psql("notify other, 'not for them'") if $i == 3;
}
my @want = map { $_ == 7 ? 'orders=line one|line two' : "orders=n$_" } 1 .. 20;
pump(\@subs, stretch(10), sub { !grep { scalar(events($_)) < 20 } @subs });
is_deeply([events($_)], \@want, "subscriber $_->{n}: every notification, in order") for map { $subs[$_]{n} = $_; $subs[$_] } 0 .. 5;

# 2. Heartbeats (every second here).
pump(\@subs, 1.5);
like($subs[0]{buf}, qr/: heartbeat\n\n/, 'comment lines keep the stream alive');

# 2b. While nothing happens, the workers hold their listening connections
# and subscribers without spending CPU.
workers_idle_ok('two idle workers with subscribers', sub { pump(\@subs, shift) });

# 3. The listening connection is shared: one per worker (two workers).
my $listeners = psql("select count(*) from pg_stat_activity where application_name = 'listen' and query like 'LISTEN%'");
cmp_ok($listeners, '<=', 2, "one listening connection per worker ($listeners)");

# 4. The server ends the listening connections: subscribers hear of it
# (event: reconnect), and the notifications after it arrive.
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'listen'");
pump(\@subs, stretch(6), sub { !grep { !grep { $_ eq 'reconnect=' } events($_) } @subs });
is(scalar(grep { my @e = events($_); grep { $_ eq 'reconnect=' } @e } @subs), 6, 'every subscriber is told of the reconnect');
like(nginx_error_log(), qr/\[error\].*sqldb: the listening connection to \S+ was lost: .*; trying again every 1000 ms/,
    'one error line says the connection was lost');
ok(wait_until(sub {
    psql("select count(*) from pg_stat_activity where application_name = 'listen' and query like 'LISTEN%'") > 0
}, 5), 'it listens again');
psql("notify orders, 'after'");
pump(\@subs, stretch(5), sub { !grep { (events($_))[-1] ne 'orders=after' } @subs });
is(scalar(grep { (events($_))[-1] eq 'orders=after' } @subs), 6, 'notifications after the reconnect arrive');

# 5. Subscribers that leave are removed at once (the gauge).
close $_->{s} for @subs;
ok(wait_until(sub { subscribers($port, 'sqldb_listen') == 0 }, 3), 'the subscribers gauge is back to 0');
my $sent = metric($port, 'events_sent_total', 'sqldb_listen');
cmp_ok($sent, '>=', 6 * 21, "events counted ($sent)");

# 6. A literal channel keeps its letter case (it is quoted): NOTIFY "Orders".
my @fixed = (open_sse($port, '/fixed'));
pump(\@fixed, stretch(3), subscribed(@fixed));
psql('notify "Orders", \'cased\'');
psql("notify orders, 'not this one'");
pump(\@fixed, stretch(3), sub { scalar(events($fixed[0])) >= 1 });
is_deeply([events($fixed[0])], ['Orders=cased'], 'the channel as written (quoted)');

# 7. A reload ends the streams of the old workers at once (nginx tells the
# listening connection): the client's EventSource comes back to a new one.
my $t0 = time;
nginx_signal('HUP');
pump(\@fixed, stretch(5), sub { $fixed[0]{eof} });
ok($fixed[0]{eof}, 'a reload ends the stream');
cmp_ok(time - $t0, '<', stretch(3), 'at once');
like($fixed[0]{buf}, qr/0\r\n\r\n$/, 'with the end of the chunked body (not cut)');

# 8. Client mistakes.
my ($st) = http_request($port, 'GET', '/events?channel=bad-name');
is($st, 400, 'a channel that is not an identifier: 400');
like(nginx_error_log(), qr/\[info\].*sqldb: "sqldb_listen" channel "bad-name" is not an identifier/, 'logged at info');
($st) = http_request($port, 'GET', '/events?channel=' . ('x' x 64));
is($st, 400, 'a channel of 64 bytes: 400');
($st) = http_request($port, 'GET', '/events');
is($st, 400, 'no channel: 400');
($st) = http_request($port, 'POST', '/events?channel=a', 'x');
is($st, 405, 'POST: 405');
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
stop_nginx();

# 9. With one worker (so that every subscriber shares its connection):
# after the last subscriber of a channel, UNLISTEN; after the last of all,
# the connection closes.
$port = nginx_start(<<"HTTP", workers => 1);
upstream db { sqldb_server $server; }
server { listen 127.0.0.1:\$PORT; location /events { sqldb_pass db; sqldb_listen \$arg_channel; } }
HTTP
@subs = map { open_sse($port, '/events?channel=orders') } 1 .. 3;
my @other = map { open_sse($port, '/events?channel=other') } 1 .. 3;
pump([@subs, @other], stretch(5), subscribed(@subs, @other));
# (Once the connection listens to both: the channels go out in order.)
ok(wait_until(sub {
    psql("select count(*) from pg_stat_activity where application_name = 'listen' and state = 'idle' and query = 'LISTEN \"other\"'") > 0
}, 5), 'one connection listens to both channels');
close $_->{s} for @subs;
ok(wait_until(sub {
    psql("select count(*) from pg_stat_activity where application_name = 'listen' and query = 'UNLISTEN \"orders\"'") > 0
}, 3), 'UNLISTEN once the last subscriber of a channel left') or diag(psql("select state, query from pg_stat_activity where application_name = 'listen'"));
psql("notify other, 'still here'");
pump(\@other, stretch(5), sub { !grep { (events($_))[-1] // '' ne 'other=still here' } @other });
is(scalar(grep { (events($_))[-1] // '' eq 'other=still here' } @other), 3, 'the other channel goes on');
close $_->{s} for @other;
ok(wait_until(sub { psql("select count(*) from pg_stat_activity where application_name = 'listen'") == 0 }, 3),
    'no listening connection once nobody listens');
stop_nginx();

# 10. A subscriber that does not read is dropped once more than 1 MB waits
# for it; the others get everything.
$port = nginx_start(<<"HTTP", workers => 1);
upstream db { sqldb_server $server; }
server { listen 127.0.0.1:\$PORT; location /events { sqldb_pass db; sqldb_listen \$arg_channel; } }
HTTP
socket(my $stuck, Socket::PF_INET(), Socket::SOCK_STREAM(), 0) or die $!;
setsockopt($stuck, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 4096) or die $!;
connect($stuck, Socket::pack_sockaddr_in($port, Socket::inet_aton('127.0.0.1'))) or die $!;
$stuck->autoflush(1);
print $stuck "GET /events?channel=flood HTTP/1.1\r\nHost: localhost\r\n\r\n";
my @reader = (open_sse($port, '/events?channel=flood'));
pump(\@reader, stretch(5), subscribed(@reader));
sleep 0.3;
# (psql in a child: the reader reads while the 12 MB arrive.)
my $notifier = fork // die "fork: $!";
if (!$notifier) {
    psql("select pg_notify('flood', repeat('x', 7990) || g) from generate_series(1, 1500) g");
    POSIX::_exit(0);
}
# (The reader only reads meanwhile: a check of the whole 12 MB buffer,
# often, would make it the slow one.)
my $deadline = time + 30;
pump(\@reader, 0.5) while time < $deadline && index($reader[0]{buf}, "x1500\n\n") < 0;
waitpid($notifier, 0);
is(scalar(events($reader[0])), 1500, 'a subscriber that reads gets all 1,500 events of 8 kB');
# (One that has taken nothing for a second is dropped at the next event.)
sleep 1.2;
psql("notify flood, 'one more'");
pump(\@reader, stretch(5), sub { index($reader[0]{buf}, "one more") >= 0 });
like(nginx_error_log(), qr/\[info\].*sqldb: a subscriber that cannot take events \(gone, or more than 1048576 bytes behind\) is dropped/,
    'the one that does not read is dropped, with an info line');
close $stuck;
close $reader[0]{s};
stop_nginx();

# 11. Fifty subscribers reset their connections in the middle of a burst
# of 4,000 notifications: the worker stays responsive, each is dropped at
# most once, and the one left gets everything.
$port = nginx_start(<<"HTTP", workers => 1);
upstream db { sqldb_server $server; }
server { listen 127.0.0.1:\$PORT; location /events { sqldb_pass db; sqldb_listen \$arg_channel; } location = /metrics { gateway_status; } }
HTTP
my @gone = map { open_sse($port, '/events?channel=burst') } 1 .. 50;
my @stay = (open_sse($port, '/events?channel=burst'));
pump([@gone, @stay], stretch(5), subscribed(@gone, @stay));
my $notify = "select pg_notify('burst', repeat('n', 400) || g) from generate_series(1, 2000) g";
psql($notify);
for my $g (@gone) {
    setsockopt($g->{s}, Socket::SOL_SOCKET(), Socket::SO_LINGER(), pack('ii', 1, 0));
    close $g->{s};
}
psql($notify);
my $t = time;
my ($mst, $metrics) = http_request($port, 'GET', '/metrics');
is($mst, 200, 'the worker answers after the burst');
cmp_ok(time - $t, '<', stretch(4), 'at once');
pump(\@stay, stretch(20), sub { scalar(events($stay[0])) >= 4000 });
is(scalar(events($stay[0])), 4000, 'the subscriber that stays gets all 4,000');
ok(wait_until(sub { subscribers($port, 'sqldb_listen') == 1 }, 5), 'the ones that left are removed');
my $drops = () = nginx_error_log() =~ /sqldb: a subscriber that cannot take events/g;
cmp_ok($drops, '<=', 50, "each dropped once at most ($drops lines)");
close $stay[0]{s};
stop_nginx();

# 12. nginx -t
for my $case (
    ['location /a { sqldb_listen c; }', qr/"sqldb_listen" needs "sqldb_pass" in the same location in \S+nginx\.conf:\d+/,
        qr/sqldb_listen c;/],
    ['location /a { sqldb_pass db; sqldb_listen c; sqldb_query "select 1"; }',
        qr/"sqldb_listen" and "sqldb_query" cannot be in the same location in \S+nginx\.conf:\d+/, qr/sqldb_listen c;/],
    ['location /a { sqldb_pass db; sqldb_listen c; sqldb_listen d; }', qr/"sqldb_listen" directive is duplicate in .*nginx\.conf:\d+/],
    ['location /a { sqldb_pass db; sqldb_listen "a-b"; }', qr/invalid channel "a-b" in "sqldb_listen" directive .* in .*nginx\.conf:\d+/],
    ['location /a { sqldb_pass db; sqldb_listen c; sqldb_listen_heartbeat 0; }', qr/sqldb_listen_heartbeat/],
  )
{
    my ($loc, $want, $line) = @$case;
    # (The location on a line of its own: the line named is the directive's,
    # not the end of the http block's.)
    my $err = eval {
        nginx_start("upstream db { sqldb_server $server; }\nserver { listen 127.0.0.1:\$PORT;\n$loc\n}");
        stop_nginx();
        'started';
    } // $@;
    like($err, $want, "nginx refuses: $loc");
    like(conf_line_of($err), $line, "and names the directive's line") if $line;
}

# A location with sqldb_pass and no sqldb_query or sqldb_listen in reach:
# the configuration loads (its requests get 500, as with ngx_postgres), and
# nginx -t warns, naming the sqldb_pass line.
{
    my $port = nginx_start("upstream db { sqldb_server $server; }\nserver { listen 127.0.0.1:\$PORT;\nlocation /noq {\n    sqldb_pass db;\n}\nlocation /q { sqldb_pass db; sqldb_query \"select 1\"; }\n}");
    my $out = nginx_conf_test();
    like($out, qr/\[warn\].*"sqldb_pass" has no "sqldb_query" or "sqldb_listen" in reach: its requests get 500 in \S+nginx\.conf:\d+/,
        'nginx -t warns of a sqldb_pass with no query');
    like(conf_line_of(($out =~ /^(.*in reach.*)$/m)[0]), qr/^\s*sqldb_pass db;/, "naming the sqldb_pass line");
    my $warned = () = $out =~ /in reach/g;
    is($warned, 1, 'once (not for the location with a query)');
    like($out, qr/test is successful/, 'and the configuration stands');
    my ($status) = http_request($port, 'GET', '/noq');
    is($status, 500, 'its requests get 500');
    stop_nginx();
}

# A stream behind auth_request while the database cannot be reached (here
# a port where nothing listens): /authorize gets 502, auth_request makes
# that a 500, and docs/realtime.md's error_page tells the client 503 with
# Retry-After rather than a 500. (On an nginx built without auth_request,
# nothing to try.)
SKIP: {
    my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
    skip 'needs an nginx built with http_auth_request_module', 2
        unless `$bin -V 2>&1` =~ /http_auth_request_module/;
    my $down = "127.0.0.1:$ENV{TEST_NGINX_CLOSED_PORT}";
    my $port = nginx_start(<<"HTTP");
upstream gone { sqldb_server $down dbname=x user=x connect_timeout=2; }
server {
    listen 127.0.0.1:\$PORT;
    location = /events {
        auth_request /authorize;
        error_page   500 = \@events_unavailable;
        sqldb_pass   gone;
        sqldb_listen room_lobby;
    }
    location = /authorize { internal; sqldb_pass gone; sqldb_output none; sqldb_query "select 1"; }
    location \@events_unavailable { add_header Retry-After 2 always; return 503; }
}
HTTP
    my ($status, undef, $head) = http_request($port, 'GET', '/events');
    is($status, 503, 'a stream whose authorization cannot be asked: 503');
    like($head, qr/^Retry-After: 2\r?$/mi, 'with Retry-After');
    stop_nginx();
}

done_testing();
