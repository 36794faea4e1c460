# sqldb_listen_replay: events carry ids (the payload's first word), and
# a client that comes back with its last id (Last-Event-ID, or the query
# argument last_event_id) gets the rows of an outbox table after it, then
# the live notifications: every event once, in order, also when a burst of
# NOTIFYs arrives while the replay runs and when the listening connection
# is ended while events keep coming (a replay per channel then, no
# "event: reconnect"). A bad id is 400; a replay that fails is 502 before
# the response started, the end of the stream after. A notification whose
# first word is no id the replay's parameter takes (any session may
# pg_notify the channel) is an event without an id, logged at warn, and
# poisons nothing. The retry: line of sqldb_listen_retry and
# cache_subscribe_retry; nginx -t.
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump body events subscribed);
use GatewayTest qw(conf_line_of free_port http_request wait_until nginx_start stop_nginx nginx_error_log psql start_redis redis_cli);
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

my $server = GatewayTest::pg_server_line('replay');

# The outbox: each row is an event, announced by its trigger with its id
# as the payload's first word.
psql(<<'SQL');
create table outbox (id bigserial primary key, channel text not null, data text not null);
create function outbox_notify() returns trigger language plpgsql as $$
begin
    perform pg_notify(new.channel, new.id || ' ' || new.data);
    return new;
end $$;
create trigger outbox_notify after insert on outbox for each row execute function outbox_notify();
grant select on outbox to gateway;
SQL

# Events with their ids: "ID:NAME=DATA" (data lines joined by "|"; no id: "-").
sub id_events {
    my ($sub) = @_;
    my @ev;
    for my $block (split /\n\n/, body($sub)) {
        next if $block =~ /^(:|retry:)/;
        my ($id) = $block =~ /^id: (.*)$/m;
        my ($name) = $block =~ /^event: (.*)$/m;
        my @data = $block =~ /^data: (.*)$/mg;
        push @ev, ($id // '-') . ":$name=" . join('|', @data) if defined $name;
    }
    return @ev;
}

# The ids a subscriber got, in order.
sub ids_of { map { /^(\d+):/ ? $1 : () } id_events($_[0]) }

# Checks that the ids are FROM..TO, each once, in order.
sub ids_are {
    my ($sub, $from, $to, $name) = @_;
    my @got = ids_of($sub);
    my @want = $from .. $to;
    my $ok = "@got" eq "@want";
    ok($ok, $name) or diag("got " . scalar(@got) . " ids: " . join(',', @got[0 .. ($#got < 40 ? $#got : 40)]));
}

# Inserts N events in one transaction, data PREFIX || n (PREFIX is SQL,
# a quoted text by default).
sub insert {
    my ($channel, $n, $prefix) = @_;
    $prefix //= 'e';
    $prefix = "'$prefix' || " unless $prefix =~ /\|\| $/;
    psql("insert into outbox (channel, data) select '$channel', $prefix g from generate_series(1, $n) g");
}

# The outbox's highest id.
sub top { psql('select coalesce(max(id), 0) from outbox') + 0 }

# Inserts N rows in N transactions, one every MS milliseconds, in a child
# process (the notifications keep coming while the test watches).
sub trickle {
    my ($channel, $n, $ms) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        psql("do \$\$ begin for i in 1..$n loop insert into outbox (channel, data) values ('$channel', 't' || i); commit; perform pg_sleep($ms / 1000.0); end loop; end \$\$");
        POSIX::_exit(0);
    }
    return $pid;
}

my $replay = 'select id, data from outbox where channel = $sqldb_channel::text and id > $sqldb_last_event_id::bigint order by id limit 50';
# (The sleep, an init plan, runs first in every round, after the statement's
# snapshot was taken: what commits meanwhile is not in its rows.)
my $slow = 'select id, data from outbox where channel = $sqldb_channel::text and id > $sqldb_last_event_id::bigint and (select pg_sleep(1)) is not null order by id limit 50';
(my $slower = $slow) =~ s/pg_sleep\(1\)/pg_sleep(2)/;
my $port = nginx_start(<<"HTTP", workers => 2);
upstream db { sqldb_server $server; }
sqldb_listen_retry 2500ms;
server {
    listen 127.0.0.1:\$PORT;
    location /events { sqldb_pass db; sqldb_listen \$arg_channel; sqldb_listen_replay "$replay"; }
    location /slow { sqldb_pass db; sqldb_listen \$arg_channel; sqldb_listen_replay "$slow"; }
    location /slower { sqldb_pass db; sqldb_listen \$arg_channel; sqldb_listen_replay "$slower"; }
    location /plain { sqldb_pass db; sqldb_listen \$arg_channel; sqldb_listen_retry 1s; }
    location /broken {
        sqldb_pass db; sqldb_listen \$arg_channel;
        sqldb_listen_replay "select id, data from no_such_table where c = \$sqldb_channel::text and id > \$sqldb_last_event_id::bigint limit 5";
    }
    location = /metrics { gateway_status; }
}
HTTP

# 1. 120 events before anyone listens; a client that got the 30th comes
# back: the 31st to the 120th (in rounds of the template's LIMIT 50), then
# the live ones.
insert('orders', 120);
my @back = (open_sse($port, '/events?channel=orders', 'Last-Event-ID: 30'));
pump(\@back, 10, sub { scalar(ids_of($back[0])) >= 90 });
like($back[0]{buf}, qr{^HTTP/1\.1 200 }, 'status 200');
like($back[0]{buf}, qr{Content-Type: text/event-stream}i, 'text/event-stream');
like(body($back[0]), qr/^retry: 2500\n\n/, 'sqldb_listen_retry (http level): the retry: field comes first');
ids_are($back[0], 31, 120, 'a client with Last-Event-ID 30 gets 31 to 120, each once, in order (three rounds)');
is((id_events($back[0]))[0], '31:orders=e31', 'id: the first word, data: the rest');
# A client without it gets the live ones only, with their ids.
my @fresh = (open_sse($port, '/events?channel=orders'));
pump(\@fresh, 5, subscribed(@fresh));
insert('orders', 10, 'live');
pump([@back, @fresh], 5, sub { !grep { ((ids_of($_))[-1] // 0) != 130 } @back, @fresh });
ids_are($back[0], 31, 130, 'then the live ones: 121 to 130, none twice');
ids_are($fresh[0], 121, 130, 'a client without Last-Event-ID: the live events, with ids');
is((id_events($fresh[0]))[-1], '130:orders=live10', 'a live event: id and data');

# 2. The query argument, for clients that cannot set the header.
my @arg = (open_sse($port, '/events?channel=orders&last_event_id=125'));
pump(\@arg, 5, sub { scalar(ids_of($arg[0])) >= 5 });
ids_are($arg[0], 126, 130, 'last_event_id=125 in the query: 126 to 130');

# 3. Without sqldb_listen_replay nothing changes: the payload is the data,
# no id: line (and the location's own retry: line).
my @plain = (open_sse($port, '/plain?channel=orders'));
pump(\@plain, 5, subscribed(@plain));
insert('orders', 1, 'p');
pump(\@plain, 5, sub { scalar(events($plain[0])) >= 1 });
is_deeply([id_events($plain[0])], ['-:orders=131 p1'], 'no replay: no id, the whole payload is the data');
like(body($plain[0]), qr/^retry: 1000\n\n: subscribed\n\n/, 'the location\'s sqldb_listen_retry, first');
close $_->{s} for @back, @fresh, @arg, @plain;

# 4. A burst of notifications while the replay runs (each round sleeps a
# second): those that commit before a round's snapshot come in its rows,
# those after come live and are held until the replay is over; none is
# lost, none comes twice.
insert('burst', 20);
my $first = top() - 19;
my $t0 = time;
my @slow = (open_sse($port, '/slow?channel=burst', 'Last-Event-ID: ' . ($first - 1)));
my $burst = trickle('burst', 150, 10);
pump(\@slow, 20, sub { $slow[0]{buf} =~ m{^HTTP/1\.1 } });
cmp_ok(time - $t0, '>=', 0.9, 'the response starts with the first (slow) round');
waitpid($burst, 0);
my $last = top();
pump(\@slow, 20, sub { ((ids_of($slow[0]))[-1] // 0) == $last });
ids_are($slow[0], $first, $last, 'a burst of 150 during a slow replay: each of the 170 once, in order');
insert('burst', 3);
pump(\@slow, 5, sub { ((ids_of($slow[0]))[-1] // 0) == $last + 3 });
ids_are($slow[0], $first, $last + 3, 'and the live ones after it');
close $slow[0]{s};

# More than the 1 MB a subscriber may have held arrives during a round
# that finds nothing: what was held is let go, and more rounds find it.
my $big = top();
my @big = (open_sse($port, '/slow?channel=big', "Last-Event-ID: $big"));
ok(wait_until(sub {
    psql("select count(*) from pg_stat_activity where application_name = 'replay' and query = 'LISTEN \"big\"'") > 0
}, 5), 'the channel is listened to (the first round runs)');
insert('big', 200, "repeat('x', 7900) || ");
pump(\@big, 20, sub { ((ids_of($big[0]))[-1] // 0) == $big + 200 });
ids_are($big[0], $big + 1, $big + 200, '1.6 MB during a round: each of the 200 once, in order');
close $big[0]{s};

# 5. The listening connection is lost and made again while a round runs
# (it sleeps 2 s): an event sent meanwhile is in no notification and not
# in that round's snapshot; one more round, once the channel is listened
# to again, finds it.
insert('gap', 1);
my $gap = top();
my @gap = (open_sse($port, '/slower?channel=gap', "Last-Event-ID: $gap"));
ok(wait_until(sub {
    psql("select count(*) from pg_stat_activity where application_name = 'replay' and query = 'LISTEN \"gap\"'") > 0
}, 5), 'the channel is listened to (the first round runs)');
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'replay' and query like 'LISTEN%'");
sleep 0.3;
insert('gap', 1);
pump(\@gap, 10, sub { ((ids_of($gap[0]))[-1] // 0) == $gap + 1 });
insert('gap', 1);
pump(\@gap, 5, sub { ((ids_of($gap[0]))[-1] // 0) == $gap + 2 });
ids_are($gap[0], $gap + 1, $gap + 2, 'the event sent while the connection was down comes, then the live one');
close $gap[0]{s};

# A client that leaves while its replay's query runs: the query is let go
# (cancelled), as a request's is.
my @gone = (open_sse($port, '/slower?channel=gone', 'Last-Event-ID: 0'));
my $running = "select count(*) from pg_stat_activity where application_name = 'replay' and state = 'active' and query like '%pg_sleep(2)%'";
ok(wait_until(sub { psql($running) > 0 }, 5), 'the replay\'s query runs');
close $gone[0]{s};
ok(wait_until(sub { psql($running) == 0 }, 1.2), 'it stops soon after the client left (the query sleeps 2 s)');

# 6. The server ends the listening connections while events keep coming:
# once it listens again, one replay per channel (and location) gives each
# subscriber what it missed, before the live ones; no "event: reconnect".
insert('term', 1);
my $start = top();
my @term = map { open_sse($port, "/events?channel=term", "Last-Event-ID: " . ($start - 1)) } 1 .. 6;
pump(\@term, 10, sub { !grep { ((ids_of($_))[-1] // 0) != $start } @term });
is(scalar(grep { ((ids_of($_))[-1] // 0) == $start } @term), 6, 'six subscribers (over two workers) are on');
my $trickle = trickle('term', 200, 15);
sleep 0.7;
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'replay' and query like 'LISTEN%'");
waitpid($trickle, 0);
$last = top();
pump(\@term, 15, sub { !grep { ((ids_of($_))[-1] // 0) != $last } @term });
like(nginx_error_log(), qr/\[error\].*sqldb: the listening connection to \S+ was lost/, 'the listening connection was lost');
cmp_ok($last - $start, '==', 200, 'while 200 events came');
for my $i (0 .. 5) {
    ids_are($term[$i], $start, $last, "subscriber $i: every event once, in order, across the reconnect");
}
is(scalar(grep { grep { /reconnect/ } events($_) } @term), 0, 'no "event: reconnect"');
close $_->{s} for @term;

# 7. A bad Last-Event-ID: what its typed parameter refuses is 400 (info).
my ($st) = http_request($port, 'GET', '/events?channel=orders&last_event_id=abc');
is($st, 400, 'a last id that is not a bigint: 400');
like(nginx_error_log(), qr/\[info\].*sqldb: the last event id "abc" was refused by "sqldb_listen_replay": .*22P02/,
    'logged at info, with the server\'s reason');
($st) = http_request($port, 'GET', '/events?channel=orders&last_event_id=99999999999999999999');
is($st, 400, 'one past bigint: 400');

# 7b. Notifications that are not the outbox's: a first word that is no
# bigint (text, a number past bigint's range) is no id. The event goes
# without one (the whole payload as its data), one warn line per
# notification names the channel, and nothing else changes: the real
# events that follow reach the live subscribers with their ids, and a
# client that comes back with a real id is served.
{
    my @lobby = map { open_sse($port, '/events?channel=room_lobby') } 1 .. 3;
    pump(\@lobby, 5, subscribed(@lobby));
    psql("select pg_notify('room_lobby', 'zzz x')");
    psql("select pg_notify('room_lobby', '99999999999999999999 y')");
    insert('room_lobby', 2, 'real');
    my $top = top();
    pump(\@lobby, 5, sub { !grep { ((ids_of($_))[-1] // 0) != $top } @lobby });
    for my $l (@lobby) {
        is_deeply([id_events($l)], ['-:room_lobby=zzz x', '-:room_lobby=99999999999999999999 y',
            ($top - 1) . ':room_lobby=real1', "$top:room_lobby=real2"],
            'forged notifications go without an id; the real events after them with theirs');
    }
    unlike(join('', map { body($_) } @lobby), qr/^id: (zzz|9{20})/m, 'no id: line carries a forged word');
    my @warn = nginx_error_log() =~ /\[warn\].*"room_lobby".*"zzz"/g;
    ok(@warn >= 1 && @warn <= 2, 'one warn line per worker that has subscribers, naming the channel (' . scalar(@warn) . ')');
    close $_->{s} for @lobby;
    my @back = (open_sse($port, '/events?channel=room_lobby', 'Last-Event-ID: ' . ($top - 1)));
    pump(\@back, 5, sub { scalar(ids_of($back[0])) >= 1 });
    like($back[0]{buf}, qr{^HTTP/1\.1 200 }, 'a client that comes back with the last real id: 200');
    is_deeply([ids_of($back[0])], [$top], 'and the event after it');
    close $back[0]{s};
}

# 8. A replay that fails: 502 before the response started...
($st) = http_request($port, 'GET', '/broken?channel=broken&last_event_id=1');
is($st, 502, 'a replay query that fails, before the response: 502');
like(nginx_error_log(), qr/\[error\].*sqldb: "sqldb_listen_replay" of channel "broken" after id "1" failed: query failed: .*no_such_table.*; the request gets 502/,
    'an error line says why');
# ... and the end of the stream after it (a replay after a reconnect).
my @broken = (open_sse($port, '/broken?channel=broken'));
pump(\@broken, 5, subscribed(@broken));
insert('broken', 1);
pump(\@broken, 5, sub { scalar(ids_of($broken[0])) >= 1 });
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'replay' and query like 'LISTEN%'");
pump(\@broken, 10, sub { $broken[0]{buf} =~ /\r\n0\r\n\r\n$/ });
like($broken[0]{buf}, qr/\r\n0\r\n\r\n$/,
    'a replay that fails after a reconnect ends the stream, with the end of the chunked body (the client comes back with its last id)');
like(nginx_error_log(), qr/\[error\].*"sqldb_listen_replay" of channel "broken" after id "\d+" failed: .*; the stream of its 1 subscribers ends/,
    'with an error line');
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
stop_nginx();

# 9. cache_subscribe_retry: the retry: field first, from the server level
# or the location's own; no retry: line where neither gateway has one.
my $redis = start_redis();
my $port2 = free_port();
$port = nginx_start(<<"HTTP");
upstream db { sqldb_server $server; }
upstream red { server 127.0.0.1:$redis->{port}; }
server {
    listen 127.0.0.1:\$PORT;
    cache_subscribe_retry 3s;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /own { cache_pass red; cache_subscribe \$arg_channel; cache_subscribe_retry 250ms; }
}
server {
    listen 127.0.0.1:$port2;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /events { sqldb_pass db; sqldb_listen \$arg_channel; }
}
HTTP
my @cs = (open_sse($port, '/sub?channel=news'), open_sse($port, '/own?channel=news'));
my @none = (open_sse($port2, '/sub?channel=news'), open_sse($port2, '/events?channel=news'));
pump([@cs, @none], 5, subscribed(@cs, @none));
like(body($cs[0]), qr/^retry: 3000\n\n: subscribed\n\n/, 'cache_subscribe_retry (server level): first');
like(body($cs[1]), qr/^retry: 250\n\n: subscribed\n\n/, 'the location\'s own');
is(body($none[0]), ": subscribed\n\n", 'none set: no retry: line (cache_subscribe)');
is(body($none[1]), ": subscribed\n\n", 'none set: no retry: line (sqldb_listen)');
redis_cli($redis, 'publish', 'news', 'hello');
pump(\@cs, 5, sub { !grep { scalar(events($_)) < 1 } @cs });
is_deeply([map { [events($_)] } @cs], [['news=hello'], ['news=hello']], 'the events follow');
close $_->{s} for @cs, @none;
stop_nginx();

# 10. nginx -t
for my $case (
    ['location /a { sqldb_pass db; sqldb_listen_replay "select 1 where $sqldb_last_event_id::int > 0 limit 1"; }',
        qr/"sqldb_listen_replay" needs "sqldb_listen" in the same location in \S+nginx\.conf:\d+/, qr/sqldb_listen_replay/],
    ['location /a { sqldb_pass db; sqldb_listen c;' . "\n" . 'sqldb_listen_replay "select id, data from outbox limit 5"; }',
        qr/"sqldb_listen_replay" directive needs \$sqldb_last_event_id as a typed parameter .* in \S+nginx\.conf:\d+/, qr/^sqldb_listen_replay/],
    ['location /a { sqldb_pass db; sqldb_listen c;' . "\n" . 'sqldb_listen_replay "select id, data from outbox where id > $sqldb_last_event_id::bigint"; }',
        qr/"sqldb_listen_replay" directive needs a LIMIT/, qr/^sqldb_listen_replay/],
    ['location /a { sqldb_pass db; sqldb_listen c;' . "\n" . 'sqldb_listen_replay "select id, data from outbox where id > $sqldb_last_event_id::bigint and x = $arg_x::text limit 5"; }',
        qr/"sqldb_listen_replay" directive takes no variable but \$sqldb_channel and \$sqldb_last_event_id \("\$arg_x"\)/, qr/^sqldb_listen_replay/],
    ['location /a { sqldb_pass db; sqldb_listen c;' . "\n" . 'sqldb_listen_retry abc; }', qr/"sqldb_listen_retry" directive invalid value in \S+nginx\.conf:\d+/, qr/^sqldb_listen_retry abc/],
    ['location /a { sqldb_pass db; sqldb_listen c;' . "\n" . 'sqldb_listen_retry 0; }', qr/"sqldb_listen_retry" must be more than 0/, qr/^sqldb_listen_retry 0/],
    ["location /a { cache_pass 127.0.0.1:1; cache_subscribe c;\ncache_subscribe_retry 5x; }", qr/"cache_subscribe_retry" directive invalid value in \S+nginx\.conf:\d+/,
        qr/^cache_subscribe_retry 5x/],
  )
{
    my ($loc, $want, $line) = @$case;
    my $err = eval {
        nginx_start("upstream db { sqldb_server $server; }\nserver { listen 127.0.0.1:\$PORT;\n$loc\n}");
        stop_nginx();
        'started';
    } // $@;
    like($err, $want, "nginx refuses: $loc");
    like(conf_line_of($err), $line, "and names the directive's line");
}

done_testing();
