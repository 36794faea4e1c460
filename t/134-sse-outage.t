# While the server of sqldb_listen, cache_subscribe or cache_stream cannot be reached,
# its subscribers get `event: unavailable` once (a subscriber that comes
# during the outage, at once) and heartbeats, not `: subscribed`; the error
# log has one line for the outage, not one a second, and a notice when it
# ends; then the subscriptions take effect and events flow. A connection
# that is lost and cannot be made again is the same: one error line, one
# `event: unavailable`, then `event: reconnect` once it is back.
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump events subscribed);
use GatewayTest qw(nginx_start stop_nginx nginx_error_log wait_until psql start_extra_pg pg_stop pg_start
    start_redis kill_redis redis_cli redis_numsub stretch);
use IO::Socket::INET;
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

# The lines of the error log that match.
sub log_count {
    my ($re) = @_;
    return scalar grep { /$re/ } split /\n/, nginx_error_log();
}

sub count_of {
    my ($sub, $name) = @_;
    return scalar grep { $_ eq "$name=" } events($sub);
}

# A subscriber that has a heartbeat line (and so is being served).
sub heartbeats {
    my ($sub) = @_;
    my $n = () = $sub->{buf} =~ /: heartbeat/g;
    return $n;
}

# One gateway, its server down from the start and then up; then lost, down
# a while, and up again. $up/$down start and stop the server; $event sends
# one event; $what names the connection in the log.
sub outage_case {
    my (%c) = @_;
    my $port = nginx_start($c{conf}, workers => 1);
    my $what = $c{what};
    my @subs = map { open_sse($port, $c{path}) } 1 .. 2;
    # Three attempts at least (one a second).
    pump(\@subs, stretch(3.5));
    for my $i (0, 1) {
        is(count_of($subs[$i], 'unavailable'), 1, "$c{name}: subscriber $i is told once that the server is unavailable");
        unlike($subs[$i]{buf}, qr/: subscribed/, "$c{name}: and is not subscribed");
        cmp_ok(heartbeats($subs[$i]), '>=', 1, "$c{name}: it gets heartbeats meanwhile");
    }
    like($subs[0]{buf}, qr/\r\n\r\n.*event: unavailable\ndata: \n\n/s, "$c{name}: the event's form");
    # One that comes during the outage hears it at once.
    my $late = open_sse($port, $c{path});
    pump([$late], stretch(2), sub { count_of($late, 'unavailable') >= 1 });
    is(count_of($late, 'unavailable'), 1, "$c{name}: a subscriber that comes during the outage is told at once");
    is(log_count(qr/\[error\].*\Q$what\E.* failed: /), 1, "$c{name}: one error line for the outage, not one a second")
        or diag(nginx_error_log());
    unlike(nginx_error_log(), qr/\[error\].*\Q$what\E.* was lost/, "$c{name}: nothing was lost yet");

    # The server comes: the subscriptions take effect; one notice.
    $c{up}->();
    push @subs, $late;
    pump(\@subs, stretch(10), subscribed(@subs));
    is(scalar(grep { $_->{buf} =~ /: subscribed/ } @subs), 3, "$c{name}: all three are subscribed once it is up");
    ok(wait_until(sub { log_count(qr/\[notice\].*\Q$what\E.* is up again, after \d+ failures in \d+ ms/) == 1 }, 3),
        "$c{name}: a notice says it is up again");
    my ($failures) = nginx_error_log() =~ /is up again, after (\d+) failures/;
    cmp_ok($failures // 0, '>=', 3, "$c{name}: after the attempts of the outage");
    $c{event}->('first');
    pump(\@subs, stretch(5), sub { !grep { !grep { /=first$/ } events($_) } @subs });
    is(scalar(grep { grep { /=first$/ } events($_) } @subs), 3, "$c{name}: events flow");

    # The server goes while the connection is up, and stays away a while.
    $c{down}->();
    pump(\@subs, stretch(3.5));
    is(scalar(grep { count_of($_, 'unavailable') == 2 } @subs[0, 1]), 2,
        "$c{name}: the subscribers hear once more that it is unavailable");
    is(count_of($late, 'unavailable'), 2, "$c{name}: so does the late one");
    is(log_count(qr/\[error\].*\Q$what\E.* (failed|was lost)/), 2, "$c{name}: one more error line for the second outage")
        or diag(nginx_error_log());
    is(log_count(qr/\[error\].*\Q$what\E.* was lost/), 1, "$c{name}: which says the connection was lost");
    $c{up}->();
    # (A stream reads on from its last entry: no reconnect to tell.)
    my $reconnects = $c{reconnects} // 1;
    pump(\@subs, stretch(10), sub { !grep { count_of($_, 'reconnect') < $reconnects } @subs }) if $reconnects;
    is(scalar(grep { count_of($_, 'reconnect') == $reconnects } @subs), 3, "$c{name}: event: reconnect $reconnects time(s) once it is back");
    ok(wait_until(sub { log_count(qr/\[notice\].*\Q$what\E.* is up again/) == 2 }, 3), "$c{name}: and a notice");
    $c{event}->('second');
    pump(\@subs, stretch(5), sub { !grep { !grep { /=second$/ } events($_) } @subs });
    is(scalar(grep { grep { /=second$/ } events($_) } @subs), 3, "$c{name}: events flow again");
    close $_->{s} for @subs;
    stop_nginx();
}

# 1. sqldb_listen, its own PostgreSQL stopped.
my $extra = start_extra_pg();
pg_stop($extra);
my $server = "127.0.0.1:$extra->{port} dbname=gateway_test user=gateway \"password=it's a secret\"";
outage_case(
    name => 'sqldb_listen',
    what => "listening connection to 127.0.0.1:$extra->{port}",
    path => '/l',
    conf => <<"HTTP",
upstream db { sqldb_server $server; }
server {
    listen 127.0.0.1:\$PORT;
    location /l { sqldb_pass db; sqldb_listen news; sqldb_listen_heartbeat 1s; }
}
HTTP
    up => sub { pg_start($extra) },
    down => sub { pg_stop($extra) },
    event => sub {
        local $ENV{TEST_NGINX_PG_PORT} = $extra->{port};
        psql("notify news, '$_[0]'");
    },
);

# While a Redis is down, its port stays bound (not listening) by this
# file, so that connecting is refused and no file running beside this one
# is given the port for a server of its own (the gateway would reach it).
my %held;
sub hold_port {
    my ($port) = @_;
    $held{$port} = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port, ReuseAddr => 1, Proto => 'tcp')
        or die "holding port $port: $!";
}
sub redis_back {
    my ($port) = @_;
    close(delete $held{$port}) if $held{$port};
    return start_redis(port => $port);
}

# 2. cache_subscribe, its Redis killed; a Redis on the same port later.
my $redis = start_redis();
my $rport = $redis->{port};
kill_redis($redis);
hold_port($rport);
my $again;
sub redis_up {
    $again = redis_back($rport);
}
outage_case(
    name => 'cache_subscribe',
    what => "subscribing connection to 127.0.0.1:$rport of upstream \"red\"",
    path => '/s',
    conf => <<"HTTP",
upstream red { server 127.0.0.1:$rport; }
server {
    listen 127.0.0.1:\$PORT;
    location /s { cache_pass red; cache_subscribe news; cache_subscribe_heartbeat 1s; }
}
HTTP
    up => \&redis_up,
    down => sub { kill_redis($again); hold_port($rport) },
    event => sub { redis_cli($again, 'publish', 'news', $_[0]) },
);

# 3. cache_stream, its Redis killed the same way (a fresh one: the entries
# added after it is back arrive).
my $sredis = start_redis();
my $sport = $sredis->{port};
kill_redis($sredis);
hold_port($sport);
my $sagain;
outage_case(
    name => 'cache_stream',
    what => "stream reading connection to 127.0.0.1:$sport of upstream \"blue\"",
    path => '/x',
    conf => <<"HTTP",
upstream blue { server 127.0.0.1:$sport; }
server {
    listen 127.0.0.1:\$PORT;
    location /x { cache_pass blue; cache_stream news; cache_subscribe_heartbeat 1s; }
}
HTTP
    up => sub { $sagain = redis_back($sport) },
    down => sub { kill_redis($sagain); hold_port($sport) },
    event => sub { redis_cli($sagain, 'xadd', 'news', '*', 'event', 'news', 'data', $_[0]) },
    reconnects => 0,
);

done_testing();
