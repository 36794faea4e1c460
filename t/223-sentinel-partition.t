# A master the Sentinels lose while nginx still reaches it (a one-sided
# partition, made with ACL users on real servers on 127.0.0.1): the
# Sentinels reach the servers as their own user (sentinel auth-user),
# replication runs as another (masteruser), nginx as the default user
# (cache_auth). Cutting a user off on the master (ACL SETUSER ... off,
# CLIENT KILL USER ...) cuts its connections and refuses its AUTH from
# then on, while the other users go on.
#
# 1. The Sentinels cut off, replication not: the Sentinels fail over; the
#    gateway follows them, not the old master, which still says ROLE
#    master and takes nginx's connections. The writes it acknowledged
#    until the failover began reached the replicas: none is missing (but
#    the last, at most). Healed, the old master is made a replica.
# 2. The Sentinels and the replicas cut off: the writes the master
#    acknowledged from the cut until the gateway heard that a replica was
#    selected (+selected-slave) are the only ones that may be missing
#    afterwards (scaling.md, "What replication may lose"); they are counted.
#
# In both, no request waits longer than cache_connect_timeout and a margin,
# each 503 has Retry-After, and every write acknowledged once the gateway
# switched is on the final master after the heal.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log wait_until redis_cli stretch start_sentinel_set
    sentinels_new_master redis_missing timed_request);
use HttpClient qw(http_request);
use Test::More;
use Time::HiRes qw(time);

my ($dpw, $spw, $rpw) = ('data-pw', 'sentinel-pw', 'replica-pw');
my ($master, $replicas, $set) = eval {
    start_sentinel_set(
        password => $dpw,
        acl => ["sentinel-user on >$spw ~* &* +\@all", "replica-user on >$rpw ~* &* +\@all"],
        args => ['--masteruser', 'replica-user', '--masterauth', $rpw],
        sentinel => { auth_user => 'sentinel-user', auth_pass => $spw },
    );
} or BAIL_OUT($@);
my @sentinels = @$set;
my %by_port = map { ($_->{port} => $_) } $master, @$replicas;

my $upstream = join '', map { "    server 127.0.0.1:$_->{port};\n" } @sentinels;
my $port = nginx_start(<<"HTTP", workers => 1);
upstream ha {
    cache_sentinel m;
$upstream}
server {
    listen 127.0.0.1:\$PORT;
    cache_connect_timeout 3s;
    cache_read_timeout 1s;
    cache_auth $dpw;
    location /kv/ { set \$cache_key \$uri; cache_pass ha; }
}
HTTP

sub acl_user {
    my ($r, $user, $state) = @_;
    is(redis_cli($r, 'ACL', 'SETUSER', $user, $state), 'OK', "ACL SETUSER $user $state on $r->{port}");
    redis_cli($r, 'CLIENT', 'KILL', 'USER', $user) if $state eq 'off';
}

# A replica has every write of $m (its offset reached the master's).
sub replicas_caught_up {
    my ($m) = @_;
    return wait_until(sub {
        my ($role, $offset, @r) = split /\n/, redis_cli($m, 'ROLE');
        my @offsets = @r[map { 3 * $_ + 2 } 0 .. int(@r / 3) - 1];
        $role eq 'master' && @offsets == 2 && !grep({ $_ < $offset } @offsets);
    }, 10);
}

# Cuts the users off on the master $old, writes until the gateway
# followed the switch and 20 writes more; heals. Returns the writes
# acknowledged: before the cut, from the cut until the gateway heard of
# the failover (sent before its notice was in the log), and after.
sub round {
    my ($what, $prefix, $old, @users) = @_;
    my $m = $by_port{$old};
    my $mark = length nginx_error_log();
    my @before = map { "$prefix-b$_" } 1 .. 30;
    my @st = map { (timed_request($port, 'PUT', "/kv/$_", 'v'))[0] } @before;
    is_deeply(\@st, [(201) x 30], "$what: 30 writes before the cut");
    ok(replicas_caught_up($m), "$what: the replicas have them");

    acl_user($m, $_, 'off') for @users;
    my $cut = time;
    my (%seen, @window, @after, $began, $switched, $retry_after_missing);
    my ($longest, $n, $follow) = (0, 0, 0);
    my $deadline = time + stretch(30);
    while (time < $deadline && $follow < 20) {
        $n++;
        # (Whether the gateway heard of the failover before this write.)
        my $told = substr(nginx_error_log(), $mark) =~ /a failover of sentinel set "m" of upstream "ha" began/;
        $began //= time - $cut if $told;
        my ($s, $head, $took) = timed_request($port, 'PUT', "/kv/$prefix-w$n", $n);
        $seen{$s}++;
        $longest = $took if $took > $longest;
        $retry_after_missing++ if $s == 503 && $head !~ /\r\nRetry-After: 1\b/i;
        if ($s == 201) {
            push @{ $told ? \@after : \@window }, "$prefix-w$n";
        }
        $switched //= time - $cut if substr(nginx_error_log(), $mark) =~ /switched from 127\.0\.0\.1:$old to/;
        $follow++ if defined $switched;
    }
    diag(sprintf("$what: writes %s; the gateway heard of the failover %.2f s after the cut, switched after %.2f s;"
        . " %d writes acknowledged from the cut until then, %d after; longest %.2f s",
        join(', ', map { "$_: $seen{$_}" } sort keys %seen), $began // -1, $switched // -1,
        scalar(@window), scalar(@after), $longest));
    ok(defined $switched, "$what: the gateway followed a switch");
    my $new = sentinels_new_master($old, @sentinels);
    isnt($new, $old, "$what: the Sentinels failed over");
    like(substr(nginx_error_log(), $mark), qr/switched from 127\.0\.0\.1:$old to 127\.0\.0\.1:$new\b/,
        "$what: the gateway switched to the master they promoted");
    like(redis_cli($m, 'ROLE'), qr/^master\n/, "$what: while the old master still says it is a master");
    is(scalar(grep { !/^(201|503)$/ } keys %seen), 0, "$what: every write got 201 or 503");
    ok(!$retry_after_missing, "$what: each 503 with Retry-After: 1");
    cmp_ok($longest, '<', stretch(4.5), "$what: none waited longer than cache_connect_timeout (3 s), and a margin");
    cmp_ok(scalar(@after), '>=', 19, "$what: writes are acknowledged after the switch");
    is(scalar(redis_missing($by_port{$new}, @after)), 0, "$what: every write acknowledged after the gateway heard of the failover is on the new master");

    # The heal: the Sentinels make the old master a replica of the new one.
    acl_user($m, $_, 'on') for @users;
    ok(wait_until(sub { redis_cli($m, 'ROLE') =~ /^slave\n127\.0\.0\.1\n$new\n/ }, 20), "$what: healed, the old master follows the new one")
        or diag(join "\n", "ROLE of the old master:", redis_cli($m, 'ROLE'), "the first Sentinel's log:",
            grep { /[+-]\w/ } split /\n/, do { local (@ARGV, $/) = ("$sentinels[0]{dir}/sentinel.log"); <> });
    $mark = length nginx_error_log();
    @st = map { (timed_request($port, 'PUT', "/kv/$prefix-h$_", 'v'))[0] } 1 .. 10;
    is_deeply(\@st, [(201) x 10], "$what: writes go on after the heal");
    unlike(substr(nginx_error_log(), $mark), qr/READONLY/, "$what: none went to the old master");
    return ($new, \@before, \@window, [@after, map { "$prefix-h$_" } 1 .. 10]);
}

# 1. The Sentinels cut off.
my $old = $master->{port};
my ($new, $before, $window, $after) = round('Sentinels cut off', 'a', $old, 'sentinel-user');
is(scalar(redis_missing($by_port{$new}, @$before)), 0, 'Sentinels cut off: the writes before the cut are on the final master');
my @lost = redis_missing($by_port{$new}, @$window);
diag('Sentinels cut off: ' . scalar(@lost) . ' of ' . scalar(@$window) . " writes the old master acknowledged are not on the final master (@lost)");
cmp_ok(scalar(@lost), '<=', 1, 'Sentinels cut off: the old master\'s writes reached the replicas (all but the last, at most)');
is(scalar(redis_missing($by_port{$new}, @$after)), 0, 'Sentinels cut off: every write after the switch is on the final master');

# 2. The Sentinels and the replicas cut off.
$old = $new;
($new, $before, $window, $after) = round('Sentinels and replicas cut off', 'c', $old, 'sentinel-user', 'replica-user');
is(scalar(redis_missing($by_port{$new}, @$before)), 0, 'Sentinels and replicas cut off: the writes before the cut are on the final master');
@lost = redis_missing($by_port{$new}, @$window);
diag('Sentinels and replicas cut off: ' . scalar(@lost) . ' of ' . scalar(@$window)
    . ' writes the old master acknowledged from the cut until the failover began are lost');
is(scalar(redis_missing($by_port{$new}, @$after)), 0,
    'Sentinels and replicas cut off: every write after the gateway heard of the failover is on the final master (the lost ones are all before)');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]|exited on signal/, 'no alert, no crash');
stop_nginx();

done_testing();
