# cache_subscribe and cache_stream to a cache_sentinel upstream follow the
# master: a master, two replicas and three Sentinels, all real servers
# ($RedisServer --sentinel, so that TEST_REDIS_SERVER=valkey-server runs the
# same against Valkey). Across SENTINEL FAILOVER by hand and across a killed
# master, subscribers hear what is published after the switch (after
# `event: reconnect`, as for any reconnect), their subscription is on the
# new master and no longer on the old one, and stream readers get every
# entry the new master holds (added before, during and after the switch)
# once and in order.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log wait_until kill_redis redis_cli redis_numsub stretch hold_port
    start_sentinel_set sentinels_new_master);
use HttpClient qw(http_request);
use SseClient qw(open_sse pump body events subscribed);
use Test::More;
use Time::HiRes qw(time);

my @sentinels;

my ($master, $replicas, $set) = eval { start_sentinel_set() } or BAIL_OUT($@);
push @sentinels, @$set;
my %by_port = map { ($_->{port} => $_) } $master, @$replicas;

my $upstream = join '', map { "    server 127.0.0.1:$_->{port};\n" } @sentinels;
my $port = nginx_start(<<"HTTP", workers => 2);
upstream ha {
    cache_sentinel m;
$upstream}
server {
    listen 127.0.0.1:\$PORT;
    cache_connect_timeout 8s;
    cache_subscribe_heartbeat 1s;
    location /sub { cache_pass ha; cache_subscribe news; }
    location /pub { cache_pass ha; cache_publish news; }
    location /read { cache_pass ha; cache_stream s; }
    location /add { cache_pass ha; cache_stream_add s; }
}
HTTP

# A stream reader's entries: [id, data], whole events only.
sub entries {
    my ($sub) = @_;
    my $b = body($sub);
    my $end = rindex($b, "\n\n");
    $b = $end < 0 ? '' : substr($b, 0, $end + 2);
    my @ev;
    for my $block (split /\n\n/, $b) {
        my ($id) = $block =~ /^id: (.*)$/m or next;
        my ($data) = $block =~ /^data: ?(.*)$/m;
        push @ev, [$id, $data // ''];
    }
    return @ev;
}

sub id_le {
    my ($a, $b) = @_;
    my ($am, $as) = split /-/, $a;
    my ($bm, $bs) = split /-/, $b;
    return $am < $bm || ($am == $bm && $as <= $bs);
}

# The ids of stream s on a server, in order.
sub stream_ids {
    my ($r) = @_;
    return grep { /^\d+-\d+$/ } split /\n/, redis_cli($r, 'XRANGE', 's', '-', '+');
}

my ($n, @acked) = (0);
sub add_entry {
    $n++;
    my ($st, $body) = http_request($port, 'POST', '/add', "e$n");
    push @acked, $n if $st == 201;
    return $st;
}

sub count_of {
    my ($sub, $name) = @_;
    return scalar grep { $_ eq "$name=" } events($sub);
}

sub messages {
    my ($sub) = @_;
    return map { /^news=(.*)$/ ? $1 : () } events($sub);
}

# Workers that followed a switch from the master on port $old.
sub switches { my ($old) = @_; () = nginx_error_log() =~ /switched from 127\.0\.0\.1:$old to/g }

# Subscribers and readers, two of each (on either worker).
my @subs = map { open_sse($port, '/sub') } 1 .. 2;
my @readers = map { open_sse($port, '/read') } 1 .. 2;
pump([@subs, @readers], stretch(10), subscribed(@subs, @readers));
is(scalar(grep { $_->{buf} =~ /: subscribed/ } @subs, @readers), 4, 'subscribers and readers are subscribed');
like($subs[0]{buf}, qr/^HTTP\/1\.1 200/, 'a 200 stream');
add_entry() for 1 .. 5;
is(scalar(@acked), 5, 'entries added before any switch');
my ($st) = http_request($port, 'POST', '/pub', 'before');
is($st, 200, 'a publish before any switch');

# Waits until every subscriber has the message and every reader the
# entries acknowledged so far.
sub caught_up {
    my ($message) = @_;
    pump([@subs, @readers], stretch(15), sub {
        !grep({ !grep { $_ eq $message } messages($_) } @subs)
            && !grep { scalar(entries($_)) < scalar(@acked) } @readers;
    });
}
caught_up('before');
is(scalar(grep { grep { $_ eq 'before' } messages($_) } @subs), 2, 'both subscribers got the message');

# Each reader's entries: once each, ids increasing, every entry of the
# stream on $on among them (an entry the old master took in its last
# moment and did not pass on may have been read there: shown, at most one).
sub readers_check {
    my ($what, $on) = @_;
    my @ids = stream_ids($on);
    for my $i (0, 1) {
        my @got = entries($readers[$i]);
        my $ordered = !grep { id_le($got[$_][0], $got[$_ - 1][0]) } 1 .. $#got;
        ok($ordered, "$what: reader $i got each entry once, in order (" . scalar(@got) . ' entries)');
        my %got = map { ($_->[0] => 1) } @got;
        my @missing = grep { !$got{$_} } @ids;
        is(scalar(@missing), 0, "$what: reader $i got every entry of the new master's stream") or diag("missing: @missing");
        my %on = map { ($_ => 1) } @ids;
        my @extra = grep { !$on{ $_->[0] } } @got;
        diag("$what: reader $i got " . scalar(@extra) . ' entries the new master does not have') if @extra;
        cmp_ok(scalar(@extra), '<=', 1, "$what: reader $i got nothing else (but the old master's last write)");
        my %data = map { ($_->[1] => 1) } @got;
        my @lost = grep { !$data{"e$_"} } @acked;
        cmp_ok(scalar(@lost), '<=', 1, "$what: reader $i got the acknowledged entries") or diag("not read: @lost");
    }
}
readers_check('before any switch', $master);

# Adds entries until the switch from $old is followed by both workers, and
# 20 more after it.
sub load_until_switched {
    my ($old, $seconds) = @_;
    my ($after, %st) = (0);
    my $deadline = time + stretch($seconds);
    while (time < $deadline) {
        $st{ add_entry() }++;
        $after++ if switches($old) >= 2;
        last if $after >= 20;
    }
    return \%st;
}

# After a switch: every subscriber hears `event: reconnect` once more, then
# what is published; readers get what is added.
sub after_switch {
    my ($what, $reconnects, $message, $on) = @_;
    pump([@subs, @readers], stretch(10), sub { !grep { count_of($_, 'reconnect') < $reconnects } @subs });
    is(scalar(grep { count_of($_, 'reconnect') == $reconnects } @subs), 2, "$what: each subscriber heard event: reconnect");
    # (Published until each has it: the resubscription may be a moment
    # behind the reconnect event of the other worker.)
    my $deadline = time + stretch(10);
    my $pubs = 0;
    while (time < $deadline) {
        my ($s) = http_request($port, 'POST', '/pub', $message);
        $pubs++ if $s == 200;
        pump([@subs], 0.2);
        last if !grep { !grep { $_ eq $message } messages($_) } @subs;
    }
    is(scalar(grep { grep { $_ eq $message } messages($_) } @subs), 2, "$what: both subscribers got a message published after it");
    add_entry() for 1 .. 5;
    caught_up($message);
    readers_check($what, $on);
    cmp_ok(redis_numsub($on, 'news'), '>=', 1, "$what: the subscriptions are on the new master");
}

# 1. SENTINEL FAILOVER by hand, entries added meanwhile.
my $old = $master->{port};
redis_cli($sentinels[1], 'SENTINEL', 'FAILOVER', 'm');
my $seen = load_until_switched($old, 30);
my $new = sentinels_new_master($old, @sentinels);
isnt($new, $old, 'the Sentinels promoted a replica');
diag('entries added during SENTINEL FAILOVER: ' . join(', ', map { "$_: $seen->{$_}" } sort keys %$seen));
is(scalar(grep { !/^201$/ } keys %$seen), 0, 'every entry added during it was acknowledged');
after_switch('SENTINEL FAILOVER', 1, 'after-failover', $by_port{$new});
ok(wait_until(sub { redis_numsub($by_port{$old}, 'news') == 0 }, 5), 'no subscription is left on the old master');
like(nginx_error_log(), qr/\[error\].*subscribing connection to 127\.0\.0\.1:$old of upstream "ha" was lost: the master of its sentinel set switched to 127\.0\.0\.1:$new/,
    'the log says why the subscribing connection moved');

# 2. The master killed.
$old = $new;
kill_redis($by_port{$old});
hold_port($old);
$seen = load_until_switched($old, 40);
$new = sentinels_new_master($old, @sentinels);
isnt($new, $old, 'a replica took over from the killed master');
diag('entries added with the master killed: ' . join(', ', map { "$_: $seen->{$_}" } sort keys %$seen));
after_switch('master killed', 2, 'after-kill', $by_port{$new});
ok(!grep({ $_->{eof} } @subs, @readers), 'no stream ended');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]|exited on signal/, 'no alert, no crash');
diag(join "; ", nginx_error_log() =~ /(switched from \S+ to \S+)/g);
close $_->{s} for @subs, @readers;
stop_nginx();

done_testing();
