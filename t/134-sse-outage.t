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

# Gateways, their servers down from the start and then up; then lost,
# down a while, and up again. Each case: $up/$down start and stop its
# server; $event sends one event; $what names the connection in the log;
# $upstream and $location are its configuration. The cases run side by
# side in one nginx (each has its own server and its own log lines), so
# that their outages take their seconds once, not once each.
sub outage_cases {
    my (@cases) = @_;
    my $conf = join('', map { $_->{upstream} } @cases)
        . "server {\n    listen 127.0.0.1:\$PORT;\n" . join('', map { "    $_->{location}\n" } @cases) . "}\n";
    my $port = nginx_start($conf, workers => 1);
    my @all;
    for my $c (@cases) {
        $c->{subs} = [map { open_sse($port, $c->{path}) } 1 .. 2];
        push @all, @{ $c->{subs} };
    }
    # Three attempts at least (one a second).
    pump(\@all, stretch(3.5));
    for my $c (@cases) {
        my @subs = @{ $c->{subs} };
        for my $i (0, 1) {
            is(count_of($subs[$i], 'unavailable'), 1, "$c->{name}: subscriber $i is told once that the server is unavailable");
            unlike($subs[$i]{buf}, qr/: subscribed/, "$c->{name}: and is not subscribed");
            cmp_ok(heartbeats($subs[$i]), '>=', 1, "$c->{name}: it gets heartbeats meanwhile");
        }
        like($subs[0]{buf}, qr/\r\n\r\n.*event: unavailable\ndata: \n\n/s, "$c->{name}: the event's form");
    }
    # One that comes during the outage hears it at once.
    $_->{late} = open_sse($port, $_->{path}) for @cases;
    my @late = map { $_->{late} } @cases;
    pump(\@late, stretch(2), sub { !grep { count_of($_, 'unavailable') < 1 } @late });
    for my $c (@cases) {
        my $what = $c->{what};
        is(count_of($c->{late}, 'unavailable'), 1, "$c->{name}: a subscriber that comes during the outage is told at once");
        is(log_count(qr/\[error\].*\Q$what\E.* failed: /), 1, "$c->{name}: one error line for the outage, not one a second")
            or diag(nginx_error_log());
        unlike(nginx_error_log(), qr/\[error\].*\Q$what\E.* was lost/, "$c->{name}: nothing was lost yet");
    }

    # The servers come: the subscriptions take effect; one notice each.
    $_->{up}->() for @cases;
    push @{ $_->{subs} }, $_->{late} for @cases;
    push @all, @late;
    pump(\@all, stretch(10), subscribed(@all));
    for my $c (@cases) {
        my ($what, @subs) = ($c->{what}, @{ $c->{subs} });
        is(scalar(grep { $_->{buf} =~ /: subscribed/ } @subs), 3, "$c->{name}: all three are subscribed once it is up");
        ok(wait_until(sub { log_count(qr/\[notice\].*\Q$what\E.* is up again, after \d+ failures in \d+ ms/) == 1 }, 3),
            "$c->{name}: a notice says it is up again");
        my ($failures) = nginx_error_log() =~ /\Q$what\E.*? is up again, after (\d+) failures/;
        cmp_ok($failures // 0, '>=', 3, "$c->{name}: after the attempts of the outage");
        $c->{event}->('first');
    }
    pump(\@all, stretch(5), sub { !grep { !grep { /=first$/ } events($_) } @all });
    for my $c (@cases) {
        is(scalar(grep { grep { /=first$/ } events($_) } @{ $c->{subs} }), 3, "$c->{name}: events flow");
    }

    # The servers go while the connections are up, and stay away a while.
    $_->{down}->() for @cases;
    pump(\@all, stretch(3.5));
    for my $c (@cases) {
        my ($what, @subs) = ($c->{what}, @{ $c->{subs} });
        is(scalar(grep { count_of($_, 'unavailable') == 2 } @subs[0, 1]), 2,
            "$c->{name}: the subscribers hear once more that it is unavailable");
        is(count_of($c->{late}, 'unavailable'), 2, "$c->{name}: so does the late one");
        is(log_count(qr/\[error\].*\Q$what\E.* (failed|was lost)/), 2, "$c->{name}: one more error line for the second outage")
            or diag(nginx_error_log());
        is(log_count(qr/\[error\].*\Q$what\E.* was lost/), 1, "$c->{name}: which says the connection was lost");
    }
    $_->{up}->() for @cases;
    # (A stream reads on from its last entry: no reconnect to tell.)
    pump(\@all, stretch(10), sub {
        !grep { my $c = $_; grep { count_of($_, 'reconnect') < ($c->{reconnects} // 1) } @{ $c->{subs} } } @cases
    });
    for my $c (@cases) {
        my ($what, $reconnects) = ($c->{what}, $c->{reconnects} // 1);
        is(scalar(grep { count_of($_, 'reconnect') == $reconnects } @{ $c->{subs} }), 3,
            "$c->{name}: event: reconnect $reconnects time(s) once it is back");
        ok(wait_until(sub { log_count(qr/\[notice\].*\Q$what\E.* is up again/) == 2 }, 3), "$c->{name}: and a notice");
        $c->{event}->('second');
    }
    pump(\@all, stretch(5), sub { !grep { !grep { /=second$/ } events($_) } @all });
    for my $c (@cases) {
        is(scalar(grep { grep { /=second$/ } events($_) } @{ $c->{subs} }), 3, "$c->{name}: events flow again");
    }
    close $_->{s} for @all;
    stop_nginx();
}

# 1. sqldb_listen, its own PostgreSQL stopped.
my $extra = start_extra_pg();
pg_stop($extra);
my $server = "127.0.0.1:$extra->{port} dbname=gateway_test user=gateway \"password=it's a secret\"";
my %listen = (
    name => 'sqldb_listen',
    what => "listening connection to 127.0.0.1:$extra->{port}",
    path => '/l',
    upstream => "upstream db { sqldb_server $server; }\n",
    location => 'location /l { sqldb_pass db; sqldb_listen news; sqldb_listen_heartbeat 1s; }',
    up => sub { pg_start($extra) },
    down => sub { pg_stop($extra) },
    event => sub {
        local $ENV{TEST_NGINX_PG_PORT} = $extra->{port};
        local $ENV{TEST_NGINX_PG_SUPERPW} = $extra->{super};
        psql("notify news, '$_[0]'");
    },
);

# 2. cache_subscribe, its Redis killed; a Redis on the same port later.
my $redis = start_redis();
my $rport = $redis->{port};
kill_redis($redis);    # (its port held while it is down)
my $again;
sub redis_up {
    $again = start_redis(port => $rport);
}
my %subscribe = (
    name => 'cache_subscribe',
    what => "subscribing connection to 127.0.0.1:$rport of upstream \"red\"",
    path => '/s',
    upstream => "upstream red { server 127.0.0.1:$rport; }\n",
    location => 'location /s { cache_pass red; cache_subscribe news; cache_subscribe_heartbeat 1s; }',
    up => \&redis_up,
    down => sub { kill_redis($again) },
    event => sub { redis_cli($again, 'publish', 'news', $_[0]) },
);

# 3. cache_stream, its Redis killed the same way (a fresh one: the entries
# added after it is back arrive).
my $sredis = start_redis();
my $sport = $sredis->{port};
kill_redis($sredis);
my $sagain;
my %stream = (
    name => 'cache_stream',
    what => "stream reading connection to 127.0.0.1:$sport of upstream \"blue\"",
    path => '/x',
    upstream => "upstream blue { server 127.0.0.1:$sport; }\n",
    location => 'location /x { cache_pass blue; cache_stream news; cache_subscribe_heartbeat 1s; }',
    up => sub { $sagain = start_redis(port => $sport) },
    down => sub { kill_redis($sagain) },
    event => sub { redis_cli($sagain, 'xadd', 'news', '*', 'event', 'news', 'data', $_[0]) },
    reconnects => 0,
);

outage_cases(\%listen, \%subscribe, \%stream);

done_testing();
