# Many clients at once on two database locations, then all of them leave
# together (wrk stopping): results delivered to requests that are being
# finalized must never touch a freed request. Round after round, no worker
# may die, and the gateway serves the next request.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_get psql);
use Test::More;

my $server = GatewayTest::pg_server_line('loadleave');
psql('drop table if exists ll_items');
psql("create table ll_items (id int primary key, label text); insert into ll_items select g, 'item ' || g from generate_series(1, 10) g");
psql('grant select on ll_items to gateway');

my $port = nginx_start(<<"HTTP", workers => 2);
upstream database {
    sqldb_server $server;
    sqldb_keepalive max=4;
}
server {
    listen 127.0.0.1:\$PORT;
    location /echo { sqldb_pass database; sqldb_query "select 'default' as echo"; }
    location /item { sqldb_pass database; sqldb_query "select id, label from ll_items where id = \$arg_id::int"; }
}
HTTP

my $rounds = $ENV{TEST_LOAD_ROUNDS} || 8;
for my $i (1 .. $rounds) {
    my @pids;
    for my $path ('/echo', '/item?id=4') {
        my $pid = fork;
        die "fork: $!" unless defined $pid;
        if (!$pid) {
            open STDOUT, '>', '/dev/null';
            open STDERR, '>', '/dev/null';
            exec 'wrk', '-t1', '-c150', '-d1s', "http://127.0.0.1:$port$path";
            exit 127;
        }
        push @pids, $pid;
    }
    waitpid $_, 0 for @pids;
}
my $log = nginx_error_log();
my @died = $log =~ /(exited on signal \d+)/g;
is(scalar @died, 0, "no worker died in $rounds rounds of 300 clients leaving at once") or diag(join "\n", @died);
unlike($log, qr/\[(alert|crit)\]/, 'no alert');
my ($status, $body) = http_get($port, '/item?id=4');
is($status, 200, 'the next request is served');
like($body // '', qr/item 4/, 'with its own answer');

stop_nginx();
psql('drop table if exists ll_items');
done_testing();
