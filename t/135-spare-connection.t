# No head-of-line stall under many slow queries: when long queries hold
# every open connection and the pool may open more (default settings: no
# sqldb_keepalive line), one spare connection is opened ahead of need, so
# that a fast request that comes then neither queues behind a slow query
# nor waits for a connect. The spare counts within sqldb_keepalive max.
#
# The slow queries wait for an advisory lock that the test holds: they run
# until the test lets them go, however busy the machine is, and what the
# test sees of the pool is read from pg_stat_activity rather than timed.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read psql wait_until);
use Test::More;
use Time::HiRes qw(sleep time);

my $LOCK = 135;
my $SLOW = "select pg_advisory_xact_lock_shared($LOCK)::text || 'slow'";
my $spare = GatewayTest::pg_server_line('spare');
my $bound = GatewayTest::pg_server_line('spare8');
my $three = GatewayTest::pg_server_line('full3');
# (The pool's decisions are debug lines: a log of its own, for failures.)
my $port = nginx_start(<<"HTTP", main => "error_log logs/debug.log debug;\n");
upstream dflt { sqldb_server $spare; }
upstream max8 { sqldb_server $bound; sqldb_keepalive max=8; }
upstream max3 { sqldb_server $three; sqldb_keepalive max=3; }
server {
    listen 127.0.0.1:\$PORT;
    sqldb_result_timeout 60s;
    sqldb_output value;
    location /slow { sqldb_pass dflt; sqldb_query "$SLOW"; }
    location /fast { sqldb_pass dflt; sqldb_query "select 'fast'"; }
    location /slow8 { sqldb_pass max8; sqldb_query "$SLOW"; }
    location /slow3 { sqldb_pass max3; sqldb_query "$SLOW"; }
    location /medium3 { sqldb_pass max3; sqldb_query "select pg_sleep(1)::text || 'medium'"; }
    location /fast3 { sqldb_pass max3; sqldb_query "select 'fast'"; }
}
HTTP

# The lock that holds the slow queries, in a psql session of its own (its
# stdin): taken when this returns (by this session: the one before may not
# have ended yet); closing the handle ends the session and lets the slow
# queries go.
my $holders = 0;
sub hold_lock {
    my $app = 'lock-holder-' . ++$holders;
    local $ENV{PGPASSWORD} = $ENV{TEST_NGINX_PG_SUPERPW};
    local $ENV{PGAPPNAME} = $app;
    open my $h, '|-', 'psql', '-X', '-q', '-o', '/dev/null', '-v', 'ON_ERROR_STOP=1', '-h', '127.0.0.1',
        '-p', $ENV{TEST_NGINX_PG_PORT}, '-U', 'postgres', '-d', $ENV{TEST_NGINX_PG_DB}
        or die "psql: $!";
    $h->autoflush(1);
    print $h "select pg_advisory_lock($LOCK);\n";
    wait_until(sub {
        psql("select count(*) from pg_locks join pg_stat_activity using (pid) "
              . "where locktype = 'advisory' and granted and application_name = '$app'") == 1
    }, 30) or die "the advisory lock was not taken\n";
    return $h;
}

# What `app`'s sessions do: "slow|idle|all" (slow ones waiting for the
# lock, idle ones, every one).
sub sessions {
    my ($app) = @_;
    return psql("select count(*) filter (where state = 'active' and query like '%pg_advisory_xact_lock_shared%'), "
          . "count(*) filter (where state = 'idle'), count(*) from pg_stat_activity where application_name = '$app'");
}

# The sessions of `app` and the pool's decisions in the error log, when a
# check fails.
sub show_why {
    my ($app) = @_;
    diag("pg_stat_activity of $app (pid, state, backend_start, query_start, query):\n"
          . psql("select pid, state, backend_start, query_start, query from pg_stat_activity "
              . "where application_name = '$app' order by backend_start"));
    open my $fh, '<', "$GatewayTest::NginxRoot/logs/debug.log" or return diag("no debug log: $!");
    my @lines = grep { /sqldb: (pool|spare|no spare|connection #\d+ (opened|closed|to \S+ is up))|http request line/ } <$fh>;
    diag(join '', "the pool's decisions (debug log):\n", @lines);
}

# Eight slow queries, one after the other, each on a connection of its
# own: the next is sent once the one before is seen running in PostgreSQL,
# and 50 ms on (ten times slow=), so that the pool sees it as a long query
# and no request joins it. False (with diagnostics) when one did not run.
sub eight_slow {
    my ($path, $app, $socks, $count) = @_;
    for my $n (1 .. ($count // 8)) {
        push @$socks, http_send($port, $path);
        if (!wait_until(sub { (split /\|/, sessions($app))[0] == $n }, 20)) {
            diag("slow query $n of $path is not running on a connection of its own: " . sessions($app));
            show_why($app);
            return 0;
        }
        sleep 0.05;
    }
    return 1;
}

# Reads the slow queries' answers (the lock is let go): how many are 'slow'.
sub slow_answers {
    my @socks = @_;
    return scalar grep { my ($s, $b) = http_read($_, 60); ($s // 0) == 200 && ($b // '') eq 'slow' } @socks;
}

my $holder = hold_lock();
my @slow;
my $took = 1;
SKIP: {
    skip 'the slow queries did not each get a connection of their own', 3
        unless ok(eight_slow('/slow', 'spare', \@slow), 'eight slow queries run, each on a connection of its own');
    # The ninth: up and idle (ready for a query) beside the eight, before
    # any fast request came.
    my $t0 = time;
    my ($seen, $most) = ('', 0);
    wait_until(sub {
        $seen = sessions('spare');
        my $all = (split /\|/, $seen)[2];
        $most = $all if $all > $most;
        return $seen eq '8|1|9' || $all > 9;
    }, 30);
    $took = time - $t0;
    is("$seen most=$most", '8|1|9 most=9',
        'eight slow queries hold eight connections: a ninth is opened, ready, before any fast request')
        or show_why('spare');

    # Fast requests now, four at a time: none waits behind a slow query
    # (the slow ones run until the lock is let go, after these) or for a
    # connect.
    my ($fast_ok, $worst) = (0, 0);
    for (1 .. 10) {
        my @socks = map { [http_send($port, '/fast'), time] } 1 .. 4;
        for (@socks) {
            my ($s, $b) = http_read($_->[0], 20);
            my $t = time - $_->[1];
            $worst = $t if $t > $worst;
            $fast_ok++ if ($s // 0) == 200 && ($b // '') eq 'fast';
        }
    }
    is($fast_ok, 40, sprintf('40 fast requests answered beside eight slow queries (the slowest took %.3f s)', $worst))
        or show_why('spare');
    is((split /\|/, sessions('spare'))[0], 8, 'the fast requests were all served while the eight slow queries ran');
}
close $holder;
is(slow_answers(@slow), scalar @slow, sprintf('the %d slow queries answered once the lock was let go', scalar @slow));

# The spare stays within the pool's bound: with sqldb_keepalive max=8,
# eight slow queries hold every connection the pool may open, and no ninth
# is opened (looked for three times as long as the ninth above took, at
# least a second, at most ten).
$holder = hold_lock();
@slow = ();
SKIP: {
    skip 'the slow queries did not each get a connection of their own', 1
        unless ok(eight_slow('/slow8', 'spare8', \@slow), 'max=8: eight slow queries run, each on a connection of its own');
    my $look = 3 * $took < 1 ? 1 : 3 * $took > 10 ? 10 : 3 * $took;
    my $most = 0;
    wait_until(sub { my $all = (split /\|/, sessions('spare8'))[2]; $most = $all if $all > $most; 0 }, $look);
    is($most, 8, sprintf('with max=8, no spare past the bound (looked for %.1f s)', $look)) or show_why('spare8');
}
close $holder;
is(slow_answers(@slow), scalar @slow, sprintf('the %d slow queries of max=8 answered', scalar @slow));

# A full pool (max=3: two slow queries, and a query of a second on the
# third connection): a fast request waits behind the query that will end
# soon, not behind one that has run for long and may run on.
$holder = hold_lock();
@slow = ();
SKIP: {
    skip 'the slow queries did not each get a connection of their own', 2
        unless ok(eight_slow('/slow3', 'full3', \@slow, 2), 'max=3: two slow queries run, each on a connection of its own');
    my $medium = http_send($port, '/medium3');
    wait_until(sub { psql("select count(*) from pg_stat_activity where application_name = 'full3' "
        . "and state = 'active' and query like '%pg_sleep%'") == 1 }, 20);
    sleep 0.05;
    my $t = time;
    my ($s, $b) = http_read(http_send($port, '/fast3'), 20);
    is(($s // 0) . ' ' . ($b // ''), '200 fast',
        sprintf('with every connection busy, a fast request waits behind the query of a second, not a slow one (it took %.3f s)', time - $t))
        or show_why('full3');
    ($s, $b) = http_read($medium, 20);
    is(($s // 0) . ' ' . ($b // ''), '200 medium', 'the query of a second answered');
}
close $holder;
is(slow_answers(@slow), scalar @slow, sprintf('the %d slow queries of max=3 answered', scalar @slow));

unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]/, 'no alert');
stop_nginx();
done_testing();
