# Prepared statements on a shared connection: a prepare that fails, a
# statement dropped behind the gateway's back and a schema change that
# stales a plan each affect that one statement only; the others stay
# prepared and no request ever meets "prepared statement already exists".
# One connection (max=1) carries every request, so each state is seen by
# the next request on it.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_get psql);
use Test::More;

psql('drop table if exists prep_t, prep_missing');
psql("create table prep_t (k int primary key, v text); insert into prep_t values (1, 'one')");
psql('grant select on prep_t to gateway');

my $server = GatewayTest::pg_server_line('prepared');

my $port = nginx_start(<<"HTTP");
upstream database {
    sqldb_server $server;
    sqldb_keepalive max=1;
}
server {
    listen 127.0.0.1:\$PORT;
    location /a { sqldb_pass database; sqldb_output value; sqldb_query "select v from prep_t where k = 1"; }
    location /b { sqldb_pass database; sqldb_output value; sqldb_query "select 'b'::text"; }
    location /star { sqldb_pass database; sqldb_output csv; sqldb_query "select * from prep_t order by k"; }
    location /missing { sqldb_pass database; sqldb_output value; sqldb_query "select x from prep_missing"; }
    location /dealloc { sqldb_pass database; sqldb_prepare off; sqldb_output none; sqldb_query "deallocate all"; }
    location /named { sqldb_pass database; sqldb_output text; sqldb_query "select name from pg_prepared_statements order by name"; sqldb_prepare off; }
}
HTTP

sub get { my ($path) = @_; my ($status, $body) = http_get($port, $path); return ($status // 0, $body // '') }
sub ok_all {
    my ($what) = @_;
    for my $path ('/a', '/b', '/star') {
        my ($status, $body) = get($path);
        is($status, 200, "$what: $path answers 200") or diag($body);
    }
}
sub named { my ($status, $body) = get('/named'); return [grep { length } split /\n/, $body] }

ok_all('all prepared');
my $before = named();
is(scalar @$before, 3, 'three statements prepared on the connection') or diag("@$before");

# A prepare that fails (the table does not exist): that request's error.
my ($status) = get('/missing');
is($status, 500, 'a failing prepare is the request\'s error');
ok_all('after a failed prepare');
is_deeply(named(), $before, 'the failed one is not held, the others stay prepared (not prepared again)');

# Once the table is there, the statement is prepared and runs.
psql('create table prep_missing (x text); insert into prep_missing values (\'here\'); grant select on prep_missing to gateway');
my $body;
($status, $body) = get('/missing');
is($status, 200, 'the failed statement is prepared again once it can be');
is($body, 'here', 'and runs');
is(scalar @{ named() }, 4, 'four statements now');

# A schema change: the plan of /star no longer fits (cached plan must not
# change result type). It is deallocated and prepared again, once.
psql('alter table prep_t add column w int default 7');
($status, $body) = get('/star');
is($status, 200, 'a changed plan is prepared again') or diag($body);
like($body, qr/^1,one,7\r?$/m, 'the new column is there');
ok_all('after the schema change');
is(scalar @{ named() }, 4, 'still four statements: the stale one was replaced, not added');

# Every statement dropped behind the gateway's back.
($status) = get('/dealloc');
is($status, 200, 'deallocate all');
is(scalar @{ named() }, 0, 'none held');
ok_all('after deallocate all');
($status) = get('/missing');
is($status, 200, '/missing after deallocate all');
is(scalar @{ named() }, 4, 'prepared again, each once');

is(psql("select count(*) from pg_stat_activity where application_name = 'prepared'"), 1,
    'one connection served every request');
my $log = nginx_error_log();
unlike($log, qr/already exists/, 'no "prepared statement already exists"');
unlike($log, qr/\[(alert|crit|emerg)\]/, 'no alert');

stop_nginx();
psql('drop table if exists prep_t, prep_missing');
done_testing();
