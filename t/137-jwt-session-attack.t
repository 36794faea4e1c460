# What a session keeps between requests (sqldb_jwt_key) when something
# other than the gateway changes it: a function called by a template that
# sets the role, the claims or the read-only default for the session (no
# word of it in the template's text), or drops the prepared statements; a
# template (with a token or without) that changes the session; a client
# that leaves while its query runs, waits or streams; a query that times
# out; pipelined waves of all of these. The next request on the one
# connection (sqldb_keepalive max=1) runs with its own role, claims and
# read-only-ness all the same; what PostgreSQL does not report (a role or
# claims a function sets for the session) is marked TODO. Then, on servers of
# their own: sqldb_target after a token's POST on a server made read-only,
# a standby, and a login whose sessions start read-only.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log psql http_send_request http_read start_extra_pg start_standby_pg wait_until);
use Test::More;
use SessionJwt qw(write_secret hs256_token status_body);
use File::Temp qw(tempdir);
use Time::HiRes qw(sleep);

my $dir = tempdir('ngx-gateway-jwt-attack-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $dir;
my $secret = 'the secret of the session attack tests, over thirty-two bytes';
write_secret($dir, $secret);
sub token { my ($sub, $role) = @_; return hs256_token($secret, $sub, $role // 'ja_user') }

psql(<<'SQL');
drop table if exists ja_rows;
drop function if exists ja_sneaky(text, text);
drop function if exists ja_forget();
drop function if exists ja_sneaky_slow(text, text);
do $$ begin
  if not exists (select from pg_roles where rolname = 'ja_user') then create role ja_user nologin; end if;
  if not exists (select from pg_roles where rolname = 'ja_other') then create role ja_other nologin; end if;
end $$;
grant ja_user, ja_other to gateway;
create table ja_rows (id serial primary key, who text not null);
grant select, insert on ja_rows to ja_user, ja_other;
grant usage on sequence ja_rows_id_seq to ja_user, ja_other;
-- Sets a parameter for the session; the template that calls it says
-- neither "set" nor "set_config".
create function ja_sneaky(name text, value text) returns text language plpgsql as $$
begin
  perform pg_catalog.set_config(name, value, false);
  return 'done';
end $$;
grant execute on function ja_sneaky(text, text) to public;
-- The same, then a while before it returns.
create or replace function ja_sneaky_slow(name text, value text) returns text language plpgsql as $$
begin
  perform pg_catalog.set_config(name, value, false);
  perform pg_sleep(0.4);
  return 'done';
end $$;
grant execute on function ja_sneaky_slow(text, text) to public;
-- Drops the session's prepared statements (the gateway's too).
create or replace function ja_forget() returns text language plpgsql as $$
begin
  execute 'deallocate all';
  return 'forgotten';
end $$;
grant execute on function ja_forget() to public;
SQL

my $server = GatewayTest::pg_server_line('jwtattack');
my $show = q{concat_ws('|', current_user, coalesce(nullif(current_setting('request.jwt.claims', true), '')::json->>'sub', '-'), }
    . q{current_setting('transaction_read_only'))};
my $port = nginx_start(<<"HTTP");
upstream one {
    sqldb_server $server;
    sqldb_keepalive max=1;
}
upstream three {
    sqldb_server $server;
    sqldb_keepalive max=1;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    location /u3/who { sqldb_pass three; sqldb_jwt_key $dir/secret; sqldb_query "select $show"; }
    location /u3/forget { sqldb_pass three; sqldb_jwt_key $dir/secret; sqldb_query "select ja_forget()"; }
    location /u3/plain { sqldb_pass three; sqldb_query "select $show"; }
    location /u3/plain_add { sqldb_pass three; sqldb_query "insert into ja_rows (who) values (current_user) returning who"; }
    location /who { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_query "select $show"; }
    location /add { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_query "insert into ja_rows (who) values (current_user) returning who"; }
    location /sneaky {
        sqldb_pass one;
        sqldb_jwt_key $dir/secret;
        sqldb_query "select ja_sneaky(\$arg_name::text, \$arg_value::text)";
    }
    location /sneaky_claims { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_query "select ja_sneaky('request.jwt.claims', '{\\"sub\\":\\"mallory\\"}')"; }
    location /slow { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_result_timeout 300ms; sqldb_query "select pg_sleep(\$arg_s::float8)::text || $show"; }
    location /stream { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_stream on; sqldb_output csv; sqldb_query "select g, repeat('x', 2000) from generate_series(1, 200000) g"; }
    location /sneaky_slow { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_query "select ja_sneaky_slow(\$arg_name::text, \$arg_value::text)"; }
    location /plain_discard { sqldb_pass one; sqldb_output rds; sqldb_query "discard all"; }
    location /plain_reset_all { sqldb_pass one; sqldb_output rds; sqldb_query "reset all"; }
    location /reset_all { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_output rds; sqldb_query "reset all"; }
    location /forget { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_query "select ja_forget()"; }
    location /fail_as { sqldb_pass one; sqldb_jwt_key $dir/secret; sqldb_query "select (1 / \$arg_n::int)::text || $show"; }
    location /plain { sqldb_pass one; sqldb_query "select $show"; }
    location /plain_add { sqldb_pass one; sqldb_query "insert into ja_rows (who) values (current_user) returning who"; }
    location /plain_begin { sqldb_pass one; sqldb_query "begin; select 'begun'"; }
    location /plain_claims { sqldb_pass one; sqldb_query "select pg_catalog.set_config('request.jwt.claims', '{\\"sub\\":\\"mallory\\"}', false)"; }
    location /plain_sneaky { sqldb_pass one; sqldb_query "select ja_sneaky(\$arg_name::text, \$arg_value::text)"; }
    location /plain_several { sqldb_pass one; sqldb_query "select 1; set role ja_other; select 'done'"; }
}
HTTP

sub req { return status_body($port, @_) }

my $alice = token('alice');
my $login = '200 gateway|-|off';

# --- A function that turns the read-only default off for the session:
# the next GET of the same token is read-only all the same.
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'GET as alice: read-only');
is(req('GET', '/sneaky?name=default_transaction_read_only&value=off', $alice), '200 done',
    "alice's GET calls a function that turns the session's read-only default off");
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'her next GET is read-only still');
like(req('GET', '/add', $alice), qr/^500 /, 'and a GET that writes fails');

# --- The same, with a GET that writes sent right behind it on the one
# connection: the function's template runs alone (its first run, and then
# because it runs long), so the GET goes out after the report came. (A
# quick function that does it can still have a GET pipelined behind it:
# see docs/sqldb.md.)
for my $round (1 .. 2) {
    is(req('GET', '/who', $alice), '200 ja_user|alice|on', "round $round: GET as alice");
    my $sneaky = http_send_request($port, 'GET', '/sneaky_slow?name=default_transaction_read_only&value=off', undef,
        Authorization => "Bearer $alice");
    sleep 0.1;
    my $write = http_send_request($port, 'GET', '/add', undef, Authorization => "Bearer $alice");
    my ($st1) = http_read($sneaky, 20);
    my ($st2) = http_read($write, 20);
    is($st1, 200, "alice's slow GET turns the session's read-only default off");
    is($st2, 500, 'a GET that writes, sent right behind it, fails (read-only)');
}
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'the GET after them is read-only');

# --- A function that sets another role, the login's role ("none", RESET
# ROLE's value) or other claims for the session: PostgreSQL reports none
# of these, and the next request of the same token sends nothing for its
# role, so it runs with what the function left. Not solved: see the TODO.
my $bob = token('bob');
for my $case (['/sneaky?name=role&value=ja_other', 'sets role ja_other'],
              ['/sneaky?name=role&value=none', "sets role none (the login role's rights)"],
              ['/sneaky_claims', "sets mallory's claims"]) {
    my ($path, $what) = @$case;
    is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'GET as alice');
    is(req('GET', $path, $alice), '200 done', "alice's GET calls a function that $what");
    TODO: {
        local $TODO = 'a role or claims that a function sets for the session are not seen (PostgreSQL does not report them)';
        is(req('GET', '/who', $alice), '200 ja_user|alice|on', "after a function that $what: her next GET runs as herself");
    }
    # Another token sets its own role and claims: the session is known again.
    is(req('GET', '/who', $bob), '200 ja_user|bob|on', 'GET as bob sets his own');
}

forget_case('/u3', 'upstream three');
like(nginx_error_log(), qr/the sessions behind \S+ are shared/, 'upstream three: the sessions were taken for shared ones');

# --- Locations without a token whose templates change the session: the
# next request without a token runs as the login role, without claims.
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'GET as alice');
is(req('GET', '/plain', undef), $login, 'then a request without a token: the login role');
is(req('GET', '/plain_claims', undef) =~ s/ .*//sr, '200', 'a template without a token sets the claims for the session');
is(req('GET', '/plain', undef), $login, 'the next request without a token has no claims');
is(req('GET', '/plain_several', undef) =~ s/ .*//sr, '200', 'a template of several statements without a token sets role ja_other');
is(req('GET', '/plain', undef), $login, 'the next request without a token runs as the login role');
is(req('GET', '/plain_sneaky?name=role&value=ja_other', undef), '200 done', 'a template without a token calls a function that sets role ja_other');
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'alice after it runs as herself');
is(req('GET', '/plain', undef), $login, 'and the next request without a token as the login role');

# --- A client that leaves while its query runs; a query that times out.
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'GET as alice');
{
    my $s = http_send_request($port, 'POST', '/slow?s=0.5', undef, Authorization => 'Bearer ' . token('bob', 'ja_other'));
    sleep 0.2;
    close $s;
}
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'after a POST as bob (ja_other) whose client left mid-query: alice is alice');
is(req('POST', '/slow?s=2', token('bob', 'ja_other')) =~ s/ .*//sr, '504', "bob's slow POST times out");
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'alice after it');
is(req('GET', '/plain', undef), $login, 'a request without a token after it');

# --- HEAD is read-only as GET is; a POST of the same token after it is not.
is(req('HEAD', '/who', $alice) =~ s/ .*//sr, '200', 'HEAD as alice');
like(req('HEAD', '/add', $alice), qr/^500/, 'a HEAD that writes fails (read-only)');
is(req('POST', '/who', $alice), '200 ja_user|alice|off', 'a POST as alice after it is read-write');
is(req('HEAD', '/who', $alice) =~ s/ .*//sr, '200', 'HEAD as alice again');
like(req('HEAD', '/add', $alice), qr/^500/, 'and a HEAD that writes fails again');

# --- A client that leaves while its query waits its turn behind a slow one.
{
    my $slow = http_send_request($port, 'GET', '/slow?s=0.25', undef, Authorization => "Bearer $alice");
    my $queued = http_send_request($port, 'POST', '/who', undef, Authorization => 'Bearer ' . token('carol', 'ja_other'));
    sleep 0.05;
    close $queued;
    my ($st) = http_read($slow, 20);
    is($st, 200, "alice's slow GET answers");
}
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'the next GET as alice, after a queued POST as carol whose client left');
is(req('POST', '/plain_add', undef), '200 gateway', 'a write without a token runs read-write as the login role');

# --- A stream whose client reads a little and leaves, GET (read-only) and
# POST (another role): the next requests are their own.
for my $method ('GET', 'POST') {
    my $s = http_send_request($port, $method, '/stream', undef, Authorization => 'Bearer ' . token('dave', 'ja_other'));
    my $buf = '';
    sysread($s, $buf, 4096) for 1 .. 4;
    close $s;
    sleep 0.2;
    is(req('GET', '/who', $alice), '200 ja_user|alice|on', "after a $method stream as dave (ja_other) whose client left: alice is alice");
    is(req('POST', '/plain_add', undef), '200 gateway', 'and a write without a token runs read-write as the login role');
    is(req('GET', '/plain', undef), $login, 'and a read without a token as the login role');
}

# --- A transaction left open by a template without a token.
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'GET as alice');
is(req('POST', '/plain_begin', undef), '200 begun', 'a template without a token begins a transaction and leaves it open');
is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'alice after it: her own, read-only');
is(req('POST', '/plain_add', undef), '200 gateway', 'a write without a token after it');

# --- DISCARD ALL and RESET ALL in templates, with a token and without.
for my $case (['/plain_discard', undef], ['/plain_reset_all', undef], ['/reset_all', $alice]) {
    my ($path, $token) = @$case;
    is(req('GET', '/who', $alice), '200 ja_user|alice|on', 'GET as alice');
    like(req('POST', $path, $token), qr/^(200|500) /, "POST $path (DISCARD ALL cannot run in a pipeline: 500)");
    is(req('GET', '/who', $alice), '200 ja_user|alice|on', "GET as alice after $path: her role, claims, read-only");
    is(req('POST', '/plain_add', undef), '200 gateway', 'a write without a token: read-write');
    is(req('GET', '/plain', undef), $login, 'a read without a token: the login role');
    is(req('POST', '/who', $alice), '200 ja_user|alice|off', 'a POST as alice: read-write');
}

# --- Pipelined on the one connection, in a random order: requests with a
# token and without, among templates without a token that set the claims
# or a role for the session and one with a token that resets it all.
my @kinds = (
    [GET => '/who', $alice, '200 ja_user|alice|on'],
    [POST => '/who', $bob, '200 ja_user|bob|off'],
    [GET => '/plain', undef, $login],
    [POST => '/plain_add', undef, '200 gateway'],
    [GET => '/plain_claims', undef, qr/^200 /],
    [GET => '/plain_several', undef, '200 done'],
    [POST => '/reset_all', $alice, qr/^200 /],
    [GET => '/fail_as?n=0', $bob, qr/^500 /],
);
sub waves {
my ($what) = @_;
my ($wrong, $total) = SessionJwt::waves($port, \@kinds, 20, 10);
is($total, 200, "$what: 200 requests in waves of 10");
is($wrong, 0, "$what: each pipelined request ran with its own role, claims and read-only-ness");
}
srand(137);
waves('upstream one');

# --- A function that drops the session's prepared statements (no word of
# it in the template). On a connection that has run no query that may
# change its session, the gateway takes its sessions for shared ones and
# stops keeping roles in them (upstream three): what the session holds of
# alice's is not left for the requests after. On one that has (upstream
# one, after the DISCARD ALL and RESET ALL above), the statements are
# prepared again, the preambles too.
sub forget_case {
    my ($u, $what) = @_;
    is(req('GET', "$u/who", $alice), '200 ja_user|alice|on', "$what: GET as alice");
    is(req('GET', "$u/forget", $alice), '200 forgotten', "alice's GET calls a function that drops the prepared statements");
    is(req('GET', "$u/who", $alice), '200 ja_user|alice|on', 'alice again (her statement is prepared again)');
    is(req('GET', "$u/plain", undef), $login, 'a request without a token runs as the login role, without her claims, read-write');
    is(req('POST', "$u/plain_add", undef), '200 gateway', 'a write without a token runs read-write');
    is(req('POST', "$u/who", $alice), '200 ja_user|alice|off', 'a POST as alice is read-write');
    is(req('GET', "$u/who", $alice), '200 ja_user|alice|on', 'a GET as alice read-only');
    is(req('GET', "$u/plain", undef), $login, 'and a request without a token after it as the login role');
}
forget_case('', 'upstream one');
waves('upstream one, its statements dropped by a function before');


my $log = nginx_error_log();
diag(join "", grep { m{\[(error|warn|info)\]} } split m{^}m, $log) if $ENV{SHOW_LOG};
unlike($log, qr/\[(alert|crit|emerg)\]/, 'no alert');
stop_nginx();

# --- sqldb_target after a token's POST: a server that turns read-only (its
# configuration reloaded) is seen as such by a connection whose session
# holds a role the gateway set, as by one that holds the login's. On a
# server of its own (its configuration changes).
{
    my $pg = start_extra_pg();
    my $sql_on = sub {
        local $ENV{TEST_NGINX_PG_PORT} = $pg->{port};
        local $ENV{TEST_NGINX_PG_SUPERPW} = $pg->{super};
        return psql($_[0], 'gateway_test');
    };
    $sql_on->(<<'SQL');
do $$ begin
  if not exists (select from pg_roles where rolname = 'ja_user') then create role ja_user nologin; end if;
end $$;
grant ja_user to gateway;
SQL
    my $line = "127.0.0.1:$pg->{port} dbname=gateway_test user=gateway \"password=it's a secret\" application_name=jatarget";
    $port = nginx_start(<<"HTTP");
upstream two {
    sqldb_server $line;
    sqldb_keepalive max=1;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    location /who { sqldb_pass two; sqldb_jwt_key $dir/secret; sqldb_query "select $show"; }
    location /plain { sqldb_pass two; sqldb_query "select $show"; }
    location /rw_target { sqldb_pass two; sqldb_target read-write; sqldb_query "select $show"; }
}
HTTP
    # The first request with a target: the roles of the servers are
    # followed from now on.
    is(req('GET', '/rw_target', undef), $login, 'sqldb_target read-write: the server is read-write');
    for my $case (['/plain', undef, $login, 'gateway|-|on', 'without a token'],
                  ['/who', $alice, '200 ja_user|alice|off', 'ja_user|alice|on', "with alice's token"]) {
        my ($path, $token, $before, $after, $what) = @$case;
        is(req('POST', $path, $token), $before, "POST $what: read-write");
        $sql_on->('alter system set default_transaction_read_only = on');
        $sql_on->('select pg_reload_conf()');
        ok(wait_until(sub { req('POST', $path, $token) eq "200 $after" }, 10),
            "POST $what again: the server's configuration made it read-only");
        is(req('GET', '/rw_target', undef) =~ s/ .*//sr, '502', "then sqldb_target read-write: no server meets it ($what)");
        $sql_on->('alter system reset default_transaction_read_only');
        $sql_on->('select pg_reload_conf()');
        ok(wait_until(sub { req('GET', '/rw_target', undef) eq $login }, 10), 'the server is read-write again');
    }
    stop_nginx();

    # --- A standby: a GET with a token, then a query of several statements
    # and a POST without one (the standby's transactions are all read-only:
    # the login's role back must not try to make one read-write).
    my $standby = start_standby_pg($pg);
    my $sline = "127.0.0.1:$standby->{port} dbname=gateway_test user=gateway \"password=it's a secret\" application_name=jastandby";
    ok(wait_until(sub { local $ENV{TEST_NGINX_PG_PORT} = $standby->{port}; local $ENV{TEST_NGINX_PG_SUPERPW} = $standby->{super};
        psql("select count(*) from pg_roles where rolname = 'ja_user'", 'gateway_test') eq '1' }, 10), 'the standby has the role');
    # --- And a login whose sessions start read-only (alter role ... set).
    $sql_on->('alter role gateway set default_transaction_read_only = on');
    $port = nginx_start(<<"HTTP");
upstream standby { sqldb_server $sline; sqldb_keepalive max=1; }
upstream ro_login { sqldb_server $line; sqldb_keepalive max=1; }
server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    location /s/who { sqldb_pass standby; sqldb_jwt_key $dir/secret; sqldb_query "select $show"; }
    location /s/plain { sqldb_pass standby; sqldb_query "select $show"; }
    location /s/several { sqldb_pass standby; sqldb_query "select 1; select $show"; }
    location /r/who { sqldb_pass ro_login; sqldb_jwt_key $dir/secret; sqldb_query "select $show"; }
    location /r/plain { sqldb_pass ro_login; sqldb_query "select $show"; }
    location /r/several { sqldb_pass ro_login; sqldb_query "select 1; select $show"; }
}
HTTP
    my $ro_login = '200 gateway|-|on';
    for my $round (1 .. 2) {
        is(req('GET', '/s/who', $alice), '200 ja_user|alice|on', "standby, round $round: GET as alice");
        is(req('GET', '/s/several', undef), $ro_login, 'then several statements without a token: the login role');
        is(req('GET', '/s/who', $alice), '200 ja_user|alice|on', 'GET as alice again');
        is(req('POST', '/s/plain', undef), $ro_login, 'then a POST without a token: the login role');
        is(req('POST', '/s/who', $alice), '200 ja_user|alice|on', 'a POST as alice (the standby is read-only)');
        is(req('GET', '/r/who', $alice), '200 ja_user|alice|on', "read-only login, round $round: GET as alice");
        is(req('POST', '/r/who', $alice), '200 ja_user|alice|on', 'a POST as alice stays read-only: the login is');
        is(req('POST', '/r/plain', undef), $ro_login, 'a POST without a token: the login role, read-only');
        is(req('GET', '/r/who', token('erin', 'ja_user')), '200 ja_user|erin|on', 'GET as erin');
        # (Several statements, twice: the second after the first left the
        # session unknown; the login's read-only transaction stays so.)
        is(req('POST', '/r/several', undef), $ro_login, 'several statements without a token: read-only, as the login');
        is(req('POST', '/r/several', undef), $ro_login, 'and again');
    }
    unlike(nginx_error_log(), qr/\[(alert|crit|emerg)\]/, 'no alert');
    stop_nginx();
    $sql_on->('alter role gateway reset default_transaction_read_only');
}
done_testing();
