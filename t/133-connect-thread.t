# A new database connection's steps (PQconnectPoll, the SCRAM proof of its
# password among them) run on a thread of nginx's pool, not in the
# worker's event loop: the worker goes on serving while a connection is
# made. A connection given up while a step of it is on a thread (its client
# left) ends once the step is back; nothing of it lingers.
#
# With the build with fault injection (make fault),
# NGX_GATEWAY_SLOW_CONNECT_STEP=<ms> makes each step that long on its
# thread, so that a step is on a thread whenever the test looks.
#
# With overflow=reject, a spare connection that is still being made (long
# queries hold every other) takes the next request rather than it getting
# 503: also the first request of a location, which runs alone.
use strict;
use warnings;
use lib 't/lib';

BEGIN {
    if (!$ENV{TEST_NGINX_FAULT_MODULE} || !-f $ENV{TEST_NGINX_FAULT_MODULE}) {
        require Test::More;
        Test::More::plan(skip_all => 'the fault-injection build is made for Debian\'s nginx only (make fault)');
    }
    $ENV{TEST_NGINX_LOAD_MODULES} = $ENV{TEST_NGINX_FAULT_MODULE};
}

use GatewayTest qw(wait_until nginx_start nginx_error_log http_send http_read http_get psql stretch nginx_workers
    cpu_seconds);
use Test::More;
use Time::HiRes qw(sleep time);

my $server = GatewayTest::pg_server_line('threadstep');
my $gone_server = GatewayTest::pg_server_line('threadgone');
my $rej_server = GatewayTest::pg_server_line('threadrej');
my $step_ms = stretch(250);

my $port = nginx_start(<<"HTTP", main => "env NGX_GATEWAY_SLOW_CONNECT_STEP=$step_ms;\n");
upstream database {
    sqldb_server $server;
}
upstream unshared {
    sqldb_server $gone_server;
    sqldb_pipeline off;
}
upstream rejecting {
    sqldb_server $rej_server;
    sqldb_keepalive max=2 overflow=reject;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_connect_timeout 30s;
    location /echo { sqldb_pass database; sqldb_output value; sqldb_query "select 'echo'"; }
    location /ret { return 200 "ok"; }
    location /unshared { sqldb_pass unshared; sqldb_output value; sqldb_query "select 'unshared'"; }
    location /rslow { sqldb_pass rejecting; sqldb_output value; sqldb_query "select pg_sleep(3)::text || 'slow'"; }
    location /rfast { sqldb_pass rejecting; sqldb_output value; sqldb_query "select 'fast'"; }
}
HTTP

sub backends {
    my ($app) = @_;
    return psql("select count(*) from pg_stat_activity where application_name = '$app'");
}

# 1. While the connection is being made (each of its steps takes
# $step_ms on a thread), the worker answers another request at once, and
# waits for the steps without spending CPU: nginx does not watch the
# socket while a step has it.
my @workers = nginx_workers();
# (Once before: under valgrind the first request of a kind also pays for
# translating its code.)
http_get($port, '/ret');
my $cpu = sub { my $c = 0; $c += cpu_seconds($_) for @workers; $c };
my $cpu0 = $cpu->();
my $t0 = time;
my $s = http_send($port, '/echo');
sleep 0.05;
my $t1 = time;
my ($st, $body) = http_get($port, '/ret');
my $took = time - $t1;
is("$st $body", '200 ok', 'a request that needs no database is served while a connection is made');
cmp_ok($took, '<', $step_ms / 1000 * 0.8,
    sprintf('at once (%.3f s), not after a step of %d ms of the connect', $took, $step_ms));
my ($est, $ebody) = http_read($s);
is("$est $ebody", '200 echo', 'and the query that waited for the connection is answered');
my $connect = time - $t0;
my $spent = $cpu->() - $cpu0;
cmp_ok($connect, '>=', 2 * $step_ms / 1000,
    sprintf('(its connect took its steps: %.2f s, so the steps did run on the thread)', $connect));
SKIP: {
    skip 'under valgrind: the CPU time is valgrind\'s', 1 if $ENV{TEST_NGINX_USE_VALGRIND};
    cmp_ok($spent / $connect, '<', 0.15,
        sprintf('the worker does not spin while the steps run: %.2f s of CPU in %.2f s', $spent, $connect));
}

# 2. Clients that leave while steps of their new connections are on a
# thread (an upstream without pipelining: a connection each): the
# connections are given up, their sessions end when the steps are back,
# and the worker goes on.
my @gone = map { http_send($port, '/unshared') } 1 .. 3;
sleep 0.1;
close $_ for @gone;
sleep 0.1;
my ($rst) = http_get($port, '/ret');
is($rst, 200, 'the worker serves meanwhile');
ok(wait_until(sub { backends('threadgone') == 0 }, stretch(10)),
    'no session of the connections given up lingers: ' . backends('threadgone'));
my ($nst, $nbody) = http_get($port, '/unshared');
is("$nst $nbody", '200 unshared', 'the next request on that upstream is served');
is(backends('threadstep'), 1, 'the other upstream keeps its one pooled connection');

# 3. overflow=reject, max=2: a query of three seconds holds the first
# connection; slow= (5 ms) after it went out a spare is opened, whose
# steps take $step_ms each on the thread. A request that comes while the
# spare is being made (the first of its location: it runs alone, as its
# time is not known yet) takes the spare and is answered once it is up,
# not turned away with 503 because both connections are "in use".
my $held = http_send($port, '/rslow');
ok(wait_until(sub { psql("select count(*) from pg_stat_activity where application_name = 'threadrej' "
    . "and state = 'active' and query like '%pg_sleep%'") == 1 }, stretch(15)), 'the slow query runs');
sleep 0.05;
$t1 = time;
my ($fst, $fbody) = http_get($port, '/rfast', stretch(15));
is("$fst $fbody", '200 fast',
    sprintf('a request that comes while the spare is being made is served on it, not 503 (in %.2f s)', time - $t1));
my ($sst, $sbody) = http_read($held, stretch(15));
is("$sst $sbody", '200 slow', 'the slow query is answered');
is(backends('threadrej'), 2, 'the pool holds its two connections, no more');
unlike(nginx_error_log(), qr/no connection to spare/, 'no request of that upstream was turned away');

unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]|exited on signal/, 'no alert, no crash');

done_testing();
