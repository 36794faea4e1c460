# The role a session keeps between requests (sqldb_jwt_key): the next
# request of the same role, claims and method sends no statement for them;
# any other request (another token, a POST after a GET, a location without
# a role, a query of several statements) sets its own, and nothing of one
# request reaches the next: not after a query that failed (its transaction
# rolled back what it set), not after a query that changed the session
# itself, not pipelined. The read-only default a GET leaves in the session
# neither makes the next POST read-only nor makes the server look like a
# read-only one to sqldb_target. Statements are counted in PostgreSQL's
# log (log_statement for the login role).
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log psql);
use Test::More;
use SessionJwt qw(write_secret hs256_token status_body);
use File::Temp qw(tempdir);

my $dir = tempdir('ngx-gateway-jwt-session-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $dir;
my $secret = 'the secret of the session tests, over thirty-two bytes';
write_secret($dir, $secret);
sub token { my ($sub, $role) = @_; return hs256_token($secret, $sub, $role // 'js_user') }

psql(<<'SQL');
drop table if exists js_rows;
do $$ begin
  if not exists (select from pg_roles where rolname = 'js_user') then create role js_user nologin; end if;
  if not exists (select from pg_roles where rolname = 'js_other') then create role js_other nologin; end if;
end $$;
grant js_user, js_other to gateway;
create table js_rows (id serial primary key, who text not null, sub text);
grant select, insert on js_rows to js_user, js_other;
grant usage on sequence js_rows_id_seq to js_user, js_other;
alter role gateway set log_statement = 'all';
alter role gateway set log_min_messages = 'log';
SQL
my $pglog = "$ENV{TEST_NGINX_PG_SOCKET_DIR}/server.log";

# Statements that set a role, in PostgreSQL's log since `$from` (bytes).
sub log_size { return -s $pglog // 0 }
sub role_statements {
    my ($from) = @_;
    open my $fh, '<', $pglog or die "$pglog: $!";
    seek $fh, $from, 0;
    my $n = 0;
    while (<$fh>) { $n++ if /LOG:\s+(execute|statement)\b.*set_config\('role'/ }
    return $n;
}

my $server = GatewayTest::pg_server_line('jwtsession');
my $show = q{concat_ws('|', current_user, coalesce(nullif(current_setting('request.jwt.claims', true), '')::json->>'sub', '-'), }
    . q{coalesce(nullif(current_setting('request.tenant', true), ''), '-'), current_setting('transaction_read_only'))};
my $port = nginx_start(<<"HTTP");
upstream one {
    sqldb_server $server;
    sqldb_keepalive max=1;
}
upstream strict {
    sqldb_server $server;
    sqldb_keepalive max=1;
    sqldb_keep_role off;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    location /who { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_query "select $show"; }
    location /tenant {
        sqldb_pass one;
        sqldb_jwt_key $dir/secret;
        sqldb_setting request.tenant \$arg_t;
        sqldb_query "select $show";
    }
    location /add {
        sqldb_pass one;
        sqldb_jwt_key $dir/secret;
        sqldb_query "insert into js_rows (who, sub) values (current_user, current_setting('request.jwt.claims', true)::json->>'sub') returning who";
    }
    location /fail { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_query "select (1 / \$arg_n::int)::text || ' ' || $show"; }
    location /sets_claims {
        sqldb_pass one;
        sqldb_jwt_key $dir/secret;
        sqldb_query "select pg_catalog.set_config('request.jwt.claims', '{\\"sub\\":\\"mallory\\"}', false)";
    }
    location /plain { sqldb_pass one; sqldb_query "select $show"; }
    location /plain_tenant { sqldb_pass one; sqldb_setting request.tenant \$arg_t; sqldb_query "select $show"; }
    location /plain_add { sqldb_pass one; sqldb_query "insert into js_rows (who) values (current_user) returning who"; }
    location /plain_fail { sqldb_pass one; sqldb_query "select (1 / \$arg_n::int)::text || ' ' || $show"; }
    location /several { sqldb_pass one; sqldb_query "select 1; select $show"; }
    location /rw_target { sqldb_pass one; sqldb_target read-write; sqldb_query "select $show"; }
    location /strict { sqldb_pass strict; sqldb_jwt_key $dir/secret; sqldb_query "select $show"; }
    location /strict_plain { sqldb_pass strict; sqldb_query "select $show"; }
}
HTTP

sub req { return status_body($port, @_) }

my $alice = token('alice');
my $bob = token('bob');
my $carol_other = token('carol', 'js_other');
my $login = '200 gateway|-|-|off';

# --- The same token again sends nothing for its role.
is(req('GET', '/who', $alice), '200 js_user|alice|-|on', 'GET as alice: her role, her claims, read-only');
my $from = log_size();
my $same = grep { req('GET', '/who', $alice) eq '200 js_user|alice|-|on' } 1 .. 20;
is($same, 20, '20 more GETs as alice: each with her role, claims and read-only');
is(role_statements($from), 0, 'and none of them set a role: the session kept it');
$from = log_size();
my $fresh = grep { req('GET', '/who', token("user$_")) eq "200 js_user|user$_|-|on" } 1 .. 20;
is($fresh, 20, '20 GETs with 20 tokens: each its own claims');
is(role_statements($from), 20, 'each set its role and claims (20 statements): the count can tell');

# --- Each change of what a request needs sets it, in any order.
my @steps = (
    [GET => '/who', $alice, '200 js_user|alice|-|on'],
    [POST => '/who', $alice, '200 js_user|alice|-|off'],
    [GET => '/who', $alice, '200 js_user|alice|-|on'],
    [POST => '/add', $alice, '200 js_user'],
    [GET => '/plain', undef, $login],
    [GET => '/who', $bob, '200 js_user|bob|-|on'],
    [POST => '/plain_add', undef, '200 gateway'],
    [GET => '/who', $carol_other, '200 js_other|carol|-|on'],
    [GET => '/several', undef, $login],
    [GET => '/tenant?t=acme', $bob, '200 js_user|bob|acme|on'],
    [GET => '/tenant?t=zeta', $bob, '200 js_user|bob|zeta|on'],
    [GET => '/who', $bob, '200 js_user|bob|-|on'],
    [GET => '/plain_tenant?t=plain', undef, '200 gateway|-|plain|off'],
    [GET => '/plain', undef, $login],
    [GET => '/who', $alice, '200 js_user|alice|-|on'],
    [POST => '/several', undef, $login],
    [GET => '/who', $alice, '200 js_user|alice|-|on'],
    [GET => '/rw_target', undef, $login],
);
for my $round (1 .. 2) {
    for my $i (0 .. $#steps) {
        my ($method, $path, $token, $want) = @{ $steps[$i] };
        is(req($method, $path, $token), $want, "round $round, step $i: $method $path");
    }
}
is(psql("select string_agg(who || ':' || coalesce(sub, '-'), ',' order by id) from js_rows"),
    'js_user:alice,gateway:-,js_user:alice,gateway:-', 'the writes ran as their own roles (read-write after a GET)');

# --- A query that fails rolls back what its request set: the session
# holds what it held before, and the next request is not fooled.
is(req('GET', '/who', $alice), '200 js_user|alice|-|on', 'alice');
like(req('GET', '/fail?n=0', $bob), qr/^500 /, "bob's query fails (division by zero)");
is(req('GET', '/who', $bob), '200 js_user|bob|-|on', 'the next request as bob runs as bob (the failed one set nothing)');
is(req('GET', '/who', $alice), '200 js_user|alice|-|on', 'and alice as alice');
like(req('GET', '/plain_fail?n=0', undef), qr/^500 /, 'a query without a role fails, behind alice');
is(req('GET', '/plain', undef), $login, 'the next one without a role runs as the login role');
is(req('GET', '/fail?n=1', $bob), '200 1 js_user|bob|-|on', 'bob again');
like(req('POST', '/fail?n=0', $alice), qr/^500 /, "a POST of alice's fails after bob's GET");
is(req('POST', '/plain_add', undef), '200 gateway', 'a write without a role runs read-write after it');
# A role that cannot be set (403): nothing of it stays.
is(req('GET', '/who', token('eve', 'js_nobody')) =~ s/ .*//sr, '403', 'a role that does not exist: 403');
is(req('GET', '/who', $alice), '200 js_user|alice|-|on', 'alice after it');

# --- A query that changes the session itself: the next request sets
# its own role and claims again.
is(req('GET', '/sets_claims', $alice) =~ s/ .*//sr, '200', "alice's query sets the session's claims to mallory's");
is(req('GET', '/who', $alice), '200 js_user|alice|-|on', 'her next request has her own claims');

# --- Pipelined on the one connection: every kind at once, in a random
# order, over and over; each answer is its own.
my @kinds = (
    [GET => '/who', $alice, '200 js_user|alice|-|on'],
    [GET => '/who', $bob, '200 js_user|bob|-|on'],
    [POST => '/who', $alice, '200 js_user|alice|-|off'],
    [GET => '/who', $carol_other, '200 js_other|carol|-|on'],
    [GET => '/plain', undef, $login],
    [POST => '/plain', undef, $login],
    [GET => '/several', undef, $login],
    [GET => '/fail?n=0', $bob, qr/^500 /],
    [GET => '/plain_fail?n=0', undef, qr/^500 /],
    [GET => '/tenant?t=x', $alice, '200 js_user|alice|x|on'],
);
srand(136);
my ($wrong, $total) = SessionJwt::waves($port, \@kinds, 25, 12);
is($total, 300, '300 requests in waves of 12');
is($wrong, 0, 'each pipelined request ran with its own role, claims, setting and read-only-ness');
is(req('GET', '/rw_target', undef), $login, 'sqldb_target read-write still finds the server read-write');

# --- sqldb_keep_role off: every request sets its role for its own
# transaction, and the session keeps nothing.
$from = log_size();
my $strict = grep { req('GET', '/strict', $alice) eq '200 js_user|alice|-|on' } 1 .. 10;
is($strict, 10, 'sqldb_keep_role off: 10 GETs as alice, each with her role, claims and read-only');
is(role_statements($from), 10, 'each set its role (10 statements)');
is(req('POST', '/strict_plain', undef), $login, 'the next request without a token: the login role, read-write');

my $log = nginx_error_log();
unlike($log, qr/\[(alert|crit|emerg)\]/, 'no alert');
unlike($log, qr/unexpected results|connection lost/, 'no connection was lost');
stop_nginx();
psql("alter role gateway reset log_statement; alter role gateway reset log_min_messages");

# --- nginx -t names what is wrong with sqldb_keep_role.
for my $case (['sqldb_keep_role maybe;', qr/invalid value "maybe" in "sqldb_keep_role" directive, it must be "on" or "off" in \S+:\d+/],
              ['sqldb_keep_role on; sqldb_keep_role off;', qr/"sqldb_keep_role" directive is duplicate in \S+:\d+/]) {
    my ($line, $want) = @$case;
    my $ok = eval {
        nginx_start(<<"HTTP");
upstream bad { sqldb_server $server; $line }
server { listen 127.0.0.1:\$PORT; location / { sqldb_pass bad; sqldb_query "select 1"; } }
HTTP
        1;
    };
    stop_nginx() if $ok;
    ok(!$ok, "nginx refuses \"$line\"");
    like($@ // '', $want, 'and says why, with the file and line');
}
done_testing();
