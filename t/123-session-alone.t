# Requests whose statements change their session beyond their own sync
# point (a transaction left open, a setting, a COPY) have the connection to
# themselves: nothing pipelined behind them runs inside their transaction,
# under their settings, or fails with their COPY. One connection (max=1,
# pipelining on) carries them all.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql);
use Test::More;
use Time::HiRes qw(sleep);

my $server = GatewayTest::pg_server_line('alone');
psql('drop table if exists alone_log');
psql('create table alone_log (id serial, tag text)');
psql('grant select, insert on alone_log to gateway; grant usage on sequence alone_log_id_seq to gateway');

my $port = nginx_start(<<"HTTP");
upstream database {
    sqldb_server $server;
    sqldb_keepalive max=1;
}
server {
    listen 127.0.0.1:\$PORT;
    location /slow { sqldb_pass database; sqldb_output value; sqldb_query "select pg_sleep(0.3)::text || 'slept'"; }
    location /begin { sqldb_pass database; sqldb_output none; sqldb_query "begin"; }
    location /ins { sqldb_pass database; sqldb_output value; sqldb_query "insert into alone_log (tag) values (\$arg_t::text) returning tag"; }
    location /setenc { sqldb_pass database; sqldb_output value; sqldb_query "select set_config('client_encoding', 'SJIS', false)"; }
    location /esc { sqldb_pass database; sqldb_escape \$v \$arg_v; sqldb_output value; sqldb_query "select \$v || '|' || current_setting('client_encoding')"; }
    location /copyin { sqldb_pass database; sqldb_query "copy alone_log (tag) from stdin"; }
    location /e { sqldb_pass database; sqldb_output value; sqldb_query "select \$arg_id::text"; }
}
HTTP

sub staggered {
    my @paths = @_;
    my @s;
    for my $p (@paths) {
        push @s, http_send($port, $p);
        sleep 0.05;
    }
    return map { [http_read($_, 10)] } @s;
}

# 1. A write queued behind a request that opens a transaction: it must not
# run inside it (and be rolled back when that connection closes).
for my $round (1 .. 3) {
    my $tag = "kept-$round";
    my @r = staggered('/slow', '/begin', "/ins?t=$tag");
    is($r[2][0], 200, "round $round: the insert behind a begin answers 200");
    is($r[2][1], $tag, "round $round: with its row");
    is(psql("select count(*) from alone_log where tag = '$tag'"), 1, "round $round: and the row is there (committed)");
}

# 2. A query pipelined behind a SET of client_encoding does not run under it.
my @r = staggered('/slow', '/setenc', '/esc?v=plain');
is($r[1][0], 200, 'the set_config request answers');
is($r[2][0], 200, 'the escaped query behind it answers');
is($r[2][1], 'plain|UTF8', 'and it ran in a UTF8 session');

# 3. A COPY fails its own request only.
@r = staggered('/slow', '/copyin', '/e?id=x');
is($r[1][0], 500, 'COPY: 500 for its request');
is($r[2][0], 200, 'the request behind it is not its victim');
is($r[2][1], 'x', 'and gets its own answer');

unlike(nginx_error_log(), qr/\[(alert|crit)\]/, 'no alert');
stop_nginx();
psql('drop table if exists alone_log');
done_testing();
