# A new database connection's steps (PQconnectPoll, the SCRAM proof of its
# password among them) run on a thread of nginx's pool, not in the
# worker's event loop: the worker goes on serving while a connection is
# made. A connection given up while a step of it is on a thread (its client
# left) ends once the step is back; nothing of it lingers.
#
# With the build with fault injection (make fault),
# NGX_GATEWAY_SLOW_CONNECT_STEP=<ms> makes each step that long on its
# thread, so that a step is on a thread whenever the test looks.
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

use GatewayTest qw(wait_until nginx_start nginx_error_log http_send http_read http_get psql stretch);
use Test::More;
use Time::HiRes qw(sleep time);

my $server = GatewayTest::pg_server_line('threadstep');
my $gone_server = GatewayTest::pg_server_line('threadgone');
my $step_ms = 250;

my $port = nginx_start(<<"HTTP", main => "env NGX_GATEWAY_SLOW_CONNECT_STEP=$step_ms;\n");
upstream database {
    sqldb_server $server;
}
upstream unshared {
    sqldb_server $gone_server;
    sqldb_pipeline off;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_connect_timeout 30s;
    location /echo { sqldb_pass database; sqldb_output value; sqldb_query "select 'echo'"; }
    location /ret { return 200 "ok"; }
    location /unshared { sqldb_pass unshared; sqldb_output value; sqldb_query "select 'unshared'"; }
}
HTTP

sub backends {
    my ($app) = @_;
    return psql("select count(*) from pg_stat_activity where application_name = '$app'");
}

# 1. While the connection is being made (each of its steps takes
# $step_ms on a thread), the worker answers another request at once.
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
cmp_ok($connect, '>=', 2 * $step_ms / 1000,
    sprintf('(its connect took its steps: %.2f s, so the steps did run on the thread)', $connect));

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
unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]|exited on signal/, 'no alert, no crash');

done_testing();
