# sqldb_target: a primary and a streaming standby made from it
# (pg_basebackup -R) in one upstream. Requests go to the server whose
# reported role (in_hot_standby, default_transaction_read_only) meets their
# target, per method; a target no server meets is a 502 with one log line;
# after the primary stops and the standby is promoted, writes succeed again
# within 2 s, with no reload, and the pooled connections serve right.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(wait_until nginx_start stop_nginx nginx_error_log http_get psql start_extra_pg start_standby_pg pg_stop stretch);
use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(sleep time);

my $primary = start_extra_pg();
my $standby = start_standby_pg($primary);

# SQL on one instance, as the superuser.
sub sql_on {
    my ($pg, $sql) = @_;
    local $ENV{TEST_NGINX_PG_PORT} = $pg->{port};
    local $ENV{TEST_NGINX_PG_SUPERPW} = $pg->{super};
    return psql($sql, 'gateway_test');
}


is(sql_on($standby, 'select pg_is_in_recovery()'), 't', 'the standby is in recovery');
sql_on($primary, 'create table target_log (id serial primary key, at text)');
sql_on($primary, 'grant all on target_log to gateway; grant all on sequence target_log_id_seq to gateway');
ok(wait_until(sub { sql_on($standby, "select count(*) from pg_class where relname = 'target_log'") eq '1' }, 10),
    'the table reached the standby');

my ($P, $S) = ($primary->{port}, $standby->{port});
my $keywords = qq{dbname=gateway_test user=gateway "password=it's a secret" application_name=target};
# Each answer says whether its server is in recovery, and which it is (its port).
my $who = q{pg_is_in_recovery()::text || ' ' || current_setting('port')};

# A GET that also returns $upstream_addr (the X-Addr header).
sub get_addr {
    my ($port, $path) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!";
    print $s "GET $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    local $/;
    my $r = <$s> // '';
    my ($head, $body) = split /\r\n\r\n/, $r, 2;
    my ($st) = $head =~ m{^HTTP/\S+ (\d+)};
    my ($addr) = $head =~ m{^X-Addr: ([^\r]*)}mi;
    return ($st, $body, $addr // '');
}

sub gateway_conns {
    my ($pg, $app) = @_;
    return sql_on($pg, "select count(*) from pg_stat_activity where application_name = '$app'") + 0;
}

# A fresh worker knows no role: a server the balancer offers is tried, its
# session says what it is before the query goes out; one that does not fit
# keeps its connection (idle, for other targets) and the next server serves.
{
    my $k0 = qq{dbname=gateway_test user=gateway "password=it's a secret" application_name=fresh};
    my $port0 = nginx_start(<<"HTTP");
upstream db {
    sqldb_server 127.0.0.1:$P $k0;
    sqldb_server 127.0.0.1:$S $k0;
    # (No spare connection: a quick query that a busy machine holds past
    # the default slow=5ms would open one, which the counts would see.)
    sqldb_pipeline on slow=60s;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    add_header X-Addr \$upstream_addr always;
    location /standby { sqldb_pass db; sqldb_target standby; sqldb_query "select $who"; }
    location /primary { sqldb_pass db; sqldb_target primary; sqldb_query "select $who"; }
    location /prefer { sqldb_pass db; sqldb_target prefer-standby; sqldb_query "select $who"; }
}
HTTP
    my ($st, $body, $addr) = get_addr($port0, '/standby');
    is("$st $body", "200 true $S", 'first request, standby: served by the standby');
    like($addr, qr/^(127\.0\.0\.1:$P, )?127\.0\.0\.1:$S$/, "\$upstream_addr shows the servers tried ($addr)");
    if ($addr =~ /,/) {
        is(gateway_conns($primary, 'fresh'), 1, 'the primary, tried and skipped, keeps its connection');
    }
    ($st, $body) = get_addr($port0, '/primary');
    is("$st $body", "200 false $P", 'then primary: served by the primary');
    is(gateway_conns($primary, 'fresh'), 1, 'on that connection (no other opened)');
    my @prefer = map { my (undef, $b) = get_addr($port0, '/prefer'); $b } 1 .. 4;
    is_deeply(\@prefer, [("true $S") x 4], 'prefer-standby: the known standby');
    ($st, $body, $addr) = get_addr($port0, '/primary');
    is($addr, "127.0.0.1:$P", 'a known role: straight to the right server');
    stop_nginx();
}

# prefer-standby as libpq does it: a server whose role is not known yet is
# tried before a known primary takes a read, so a fresh worker learns where
# its standby is first. The primary is listed first (the balancer offers it
# first): every request, the very first included, is served by the standby,
# and the primary's session, which only said what the server is, never ran
# a query. With the standby stopped, the primary serves (on a running nginx
# and on a fresh one, where sqldb_next_upstream off does not stop it: the
# primary was only skipped, never tried).
sub prefer_conf {
    my ($app) = @_;
    my $k = qq{dbname=gateway_test user=gateway "password=it's a secret" application_name=$app};
    return <<"HTTP";
upstream db {
    sqldb_server 127.0.0.1:$P $k;
    sqldb_server 127.0.0.1:$S $k;
    sqldb_pipeline on slow=60s;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    add_header X-Addr \$upstream_addr always;
    location /prefer { sqldb_pass db; sqldb_target prefer-standby; sqldb_query "select $who"; }
    location /strict { sqldb_pass db; sqldb_target prefer-standby; sqldb_next_upstream off; sqldb_query "select $who"; }
}
HTTP
}
sub served {
    my ($port, $path, $n) = @_;
    return [map { my ($st, $b) = get_addr($port, $path); "$st " . ($b // '') } 1 .. $n];
}
# The gateway's sessions on a server whose last query was a request's (not
# the gateway's own check of its backend PID when a session starts).
sub ran_on {
    my ($pg, $app) = @_;
    return sql_on($pg, "select count(*) from pg_stat_activity where application_name = '$app' and query like '%pg_is_in_recovery%'") + 0;
}
for my $workers (1, 2) {
    my $app = "prefer$workers";
    my $port0 = nginx_start(prefer_conf($app), workers => $workers);
    my ($st, $body, $addr) = get_addr($port0, '/prefer');
    is("$st $body", "200 true $S", "prefer-standby, fresh start ($workers worker(s)): the first request on the standby");
    like($addr, qr/^(127\.0\.0\.1:$P, )?127\.0\.0\.1:$S$/, "\$upstream_addr shows the servers tried ($addr)");
    is_deeply(served($port0, '/prefer', 19), [("200 true $S") x 19], 'and the next 19');
    is(ran_on($primary, $app), 0, 'no request\'s query ran on the primary (pg_stat_activity)');
    cmp_ok(ran_on($standby, $app), '>=', 1, 'they ran on the standby');
    if ($workers == 1) {
        is(gateway_conns($primary, $app), 1, 'the primary, tried and skipped, keeps its connection');
        like(nginx_error_log(), qr/\[info\].*sqldb: 127\.0\.0\.1:$P is a primary, not what "sqldb_target prefer-standby" asks: trying another server/,
            'the log says why the first request moved on (info)');
    }
    unlike(nginx_error_log(), qr/\[error\]/, 'no error');
    if ($workers == 2) {
        pg_stop($standby);
        is_deeply(served($port0, '/prefer', 6), [("200 false $P") x 6], 'the standby stopped: the primary serves');
        stop_nginx();
        # (One worker: its balancer offers the primary first, which is
        # skipped, then the standby, refused: the primary serves although
        # sqldb_next_upstream is off. With the standby offered first and
        # not skipped over anything, off means its refusal is the answer.)
        $port0 = nginx_start(prefer_conf("$app-down"));
        is_deeply(served($port0, '/strict', 3), [("200 false $P") x 3], 'fresh start, the standby down: the primary serves, with sqldb_next_upstream off too');
        is_deeply(served($port0, '/prefer', 3), [("200 false $P") x 3], 'and with it on');
        GatewayTest::pg_start($standby);
        ok(wait_until(sub { (eval { sql_on($standby, 'select pg_is_in_recovery()') } // '') eq 't' }, 20), 'the standby is back');
    }
    stop_nginx();
}

# Requests that need their connection alone (a stream, several statements),
# and a crowd arriving at once, on a fresh worker: those that waited on a
# connection to a server that does not fit all go on to the next one; a
# client that leaves while its server's role is being learned leaves
# nothing behind.
for my $case (['/stream', 'a stream'], ['/several', 'several statements'], ['/crowd', 'twenty at once']) {
    my ($path, $what) = @$case;
    my $k1 = qq{dbname=gateway_test user=gateway "password=it's a secret" application_name=fresh1};
    my $port1 = nginx_start(<<"HTTP");
upstream db {
    sqldb_server 127.0.0.1:$P $k1;
    sqldb_server 127.0.0.1:$S $k1;
    sqldb_keepalive max=2;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_target standby;
    location /stream { sqldb_pass db; sqldb_stream on; sqldb_output csv; sqldb_query "select $who as w"; }
    location /several { sqldb_pass db; sqldb_output value; sqldb_query "select 1; select $who"; }
    location /crowd { sqldb_pass db; sqldb_output value; sqldb_query "select $who"; }
    location /leave { sqldb_pass db; sqldb_output value; sqldb_query "select $who"; }
}
HTTP
    my @socks = map { GatewayTest::http_send($port1, $path) } 1 .. ($path eq '/crowd' ? 20 : 1);
    # (A stream is chunked, in CSV with a header line: the value is found in it.)
    my @got = map { my ($st, $b) = GatewayTest::http_read($_); ($b // '') =~ /\b(true|false) (\d+)/ ? "$st $1 $2" : "$st ?" } @socks;
    is_deeply(\@got, [("200 true $S") x @socks], "$what, fresh worker: on the standby");
    if ($path eq '/crowd') {
        like(nginx_error_log(), qr/\[info\].*sqldb: 127\.0\.0\.1:$P is a primary, not what "sqldb_target standby" asks: trying another server/,
            'those offered the primary first were told why they moved on (info)');
        unlike(nginx_error_log(), qr/\[error\]/, 'and no error');
    }
    my $c = GatewayTest::http_send($port1, '/leave');
    close $c;
    my ($st, $b) = http_get($port1, '/leave');
    is("$st $b", "200 true $S", "$what: after a client that left, the next request");
    cmp_ok(gateway_conns($primary, 'fresh1') + gateway_conns($standby, 'fresh1'), '<=', 4, 'within max per server');
    stop_nginx();
}

my $port = nginx_start(<<"HTTP");
upstream db {
    sqldb_server 127.0.0.1:$P fail_timeout=1s $keywords;
    sqldb_server 127.0.0.1:$S fail_timeout=1s $keywords;
    sqldb_keepalive max=4;
}
upstream single {
    sqldb_server 127.0.0.1:$P $keywords;
    sqldb_server 127.0.0.1:$S $keywords;
    sqldb_keepalive max=4 mode=single;
}
upstream standbys { sqldb_server 127.0.0.1:$S $keywords; }
upstream primaries { sqldb_server 127.0.0.1:$P $keywords; }
server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    location /any { sqldb_pass db; sqldb_query "select $who"; }
    location /primary { sqldb_pass db; sqldb_target primary; sqldb_query "select $who"; }
    location /standby { sqldb_pass db; sqldb_target standby; sqldb_query "select $who"; }
    location /prefer { sqldb_pass db; sqldb_target prefer-standby; sqldb_query "select $who"; }
    location /ro { sqldb_pass db; sqldb_target read-only; sqldb_query "select $who"; }
    location /rw { sqldb_pass db; sqldb_target read-write; sqldb_query "select $who"; }
    location /split {
        sqldb_pass db;
        sqldb_target GET HEAD prefer-standby;
        sqldb_target primary;
        sqldb_query GET "select $who";
        sqldb_query POST "insert into target_log (at) values ('split') returning $who";
    }
    location /write {
        sqldb_pass db;
        sqldb_target primary;
        sqldb_query "insert into target_log (at) values ('write') returning $who";
    }
    location /if {
        sqldb_pass db;
        sqldb_target standby;
        sqldb_query "select $who";
        if (\$arg_w) { sqldb_target primary; }
    }
    location /outer {
        sqldb_target read-write;
        location /outer/inner { sqldb_pass db; sqldb_query "select $who"; }
    }
    location /single/primary { sqldb_pass single; sqldb_target primary; sqldb_query "select $who"; }
    location /single/standby { sqldb_pass single; sqldb_target standby; sqldb_query "select $who"; }
    location /single/any { sqldb_pass single; sqldb_query "select $who"; }
    location /no-primary { sqldb_pass standbys; sqldb_target primary; sqldb_query "select $who"; }
    location /no-standby { sqldb_pass primaries; sqldb_target standby; sqldb_query "select $who"; }
    location /no-rw { sqldb_pass standbys; sqldb_target read-write; sqldb_query "select $who"; }
}
HTTP

sub bodies {
    my ($path, $n) = @_;
    return [map { my ($st, $b) = http_get($port, $path); $st == 200 ? $b : "status $st" } 1 .. $n];
}

sub post {
    my ($path) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!";
    print $s "POST $path HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    return GatewayTest::http_read($s);
}

my %seen = map { $_ => 1 } @{ bodies('/any', 6) };
is_deeply([sort keys %seen], [sort "false $P", "true $S"], 'any: both servers serve (round robin, as before)');

is_deeply(bodies('/primary', 6), [("false $P") x 6], 'primary: every request on the primary');
is_deeply(bodies('/standby', 6), [("true $S") x 6], 'standby: every request on the standby');
is_deeply(bodies('/prefer', 6), [("true $S") x 6], 'prefer-standby: on the standby');
is_deeply(bodies('/ro', 4), [("true $S") x 4], 'read-only: on the standby');
is_deeply(bodies('/rw', 4), [("false $P") x 4], 'read-write: on the primary');
is_deeply(bodies('/split', 4), [("true $S") x 4], 'by method: GET prefers the standby');
is_deeply([map { [post('/split')] } 1 .. 3], [([200, "false $P"]) x 3], 'by method: POST goes to the primary');
is_deeply(bodies('/if', 2), [("true $S") x 2], 'an if block without a target: the location\'s');
is_deeply(bodies('/if?w=1', 2), [("false $P") x 2], 'an if block with its own target');
is_deeply(bodies('/outer/inner', 2), [("false $P") x 2], 'a location without a target inherits the outer one');

# mode=single takes any idle connection of the upstream: only one to a
# server that meets the target.
for (1 .. 2) {
    is_deeply(bodies('/single/standby', 3), [("true $S") x 3], 'mode=single: standby');
    is_deeply(bodies('/single/primary', 3), [("false $P") x 3], 'mode=single: primary');
}
my %single = map { $_ => 1 } @{ bodies('/single/any', 6) };
ok(scalar(keys %single) >= 1, 'mode=single: any still takes any idle connection');

for my $case (['/no-primary', 'standbys', 'a primary', 'primary'],
    ['/no-standby', 'primaries', 'a standby', 'standby'],
    ['/no-rw', 'standbys', 'read-write', 'read-write']) {
    my ($path, $up, $is, $target) = @$case;
    my $mark = length nginx_error_log();
    my ($st) = http_get($port, $path);
    is($st, 502, "$path: no server meets the target: 502");
    my $log = substr(nginx_error_log(), $mark);
    like($log, qr/\[error\].*sqldb: no server of upstream "\Q$up\E" is \Q$is\E \(target "\Q$target\E"\)/,
        "$path: the log says which target was not met");
    my @errors = $log =~ /\[error\]/g;
    is(scalar @errors, 1, "$path: one error line");
    ($st) = http_get($port, $path);
    is($st, 502, "$path: again (the role is remembered)");
}

# Promotion: the primary stops, the standby is promoted; no reload.
is_deeply(bodies('/write', 2), [("false $P") x 2], 'writes go to the primary');
pg_stop($primary);
my ($st) = http_get($port, '/write');
is($st, 502, 'the primary is down: a write fails');
my $t0 = time;
GatewayTest::pg_ctl($standby, 'promote');
my $promoted = time;
my ($ok, $body);
while (time < $t0 + stretch(10)) {
    ($st, $body) = http_get($port, '/write');
    if ($st == 200) { $ok = time; last }
    sleep 0.05;
}
ok($ok, 'a write succeeds after the promotion');
my $took = ($ok // time) - $promoted;
cmp_ok($took, '<', stretch(2), sprintf('within 2 s of the promotion (%.2f s; pg_ctl promote itself took %.2f s)', $took, $promoted - $t0));
is($body, "false $S", 'on the promoted server');
is_deeply(bodies('/write', 5), [("false $S") x 5], 'the next writes too');
is_deeply([map { [post('/split')] } 1 .. 2], [([200, "false $S"]) x 2], 'POST by method too');
is_deeply(bodies('/prefer', 4), [("false $S") x 4], 'prefer-standby: no standby left, the primary');
is_deeply(bodies('/split', 3), [("false $S") x 3], 'GET by method: the same');
is_deeply(bodies('/any', 3), [("false $S") x 3], 'any: the server that is up');
my $mark = length nginx_error_log();
($st) = http_get($port, '/standby');
is($st, 502, 'standby: none is left');
like(substr(nginx_error_log(), $mark), qr/sqldb: no server of upstream "db" is a standby \(target "standby"\)/, 'and the log says so');
like(nginx_error_log(), qr/\[notice\].*sqldb: 127\.0\.0\.1:$S now reports being a primary/, 'the change of role is logged');
cmp_ok(sql_on($standby, "select count(*) from pg_stat_activity where application_name = 'target'"), '<=', 5,
    'the promoted server holds a bounded number of the gateway\'s connections');
is(sql_on($standby, "select count(*) from target_log where at = 'write'") + 0, 2 + 1 + 5, 'every write that answered 200 is there once')
    or diag(sql_on($standby, "select count(*) from target_log"));

# The old primary comes back (on its own, a second primary): once nginx's
# fail_timeout has passed it is tried again and its role learned anew; no
# role remembered from before its failure keeps it out.
GatewayTest::pg_start($primary);
my %back;
ok(wait_until(sub { my (undef, $b) = http_get($port, '/primary'); $back{ $b // '' }++; $back{"false $P"} }, 5),
    'a server that failed is tried again after fail_timeout, and serves its target');
is_deeply([sort grep { length } keys %back], [sort grep { $back{$_} } "false $P", "false $S"], 'only primaries served meanwhile');

# A server that failed (max_fails) is not offered by the balancer until its
# fail_timeout passes: when the one wanted may be it, the log says so
# (found by outside testing: "no server is a primary" while the primary
# was only taken out for a lost connection).
{
    my $closed = GatewayTest::free_port();
    my $p2 = nginx_start(<<"HTTP");
upstream mix { sqldb_server 127.0.0.1:$S $keywords; sqldb_server 127.0.0.1:$closed $keywords; }
server { listen 127.0.0.1:\$PORT; location / { sqldb_pass mix; sqldb_target standby; sqldb_query "select 1"; } }
HTTP
    my @st = map { (http_get($p2, '/'))[0] } 1 .. 3;
    is_deeply(\@st, [502, 502, 502], 'no standby: 502');
    like(nginx_error_log(), qr/\[error\].*sqldb: no server of upstream "mix" is a standby \(target "standby"\); 1 of its 2 servers not tried \(down, or failed within fail_timeout\)/,
        'the log says a server was not tried');
    stop_nginx();
}

done_testing();
