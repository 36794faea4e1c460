# Through PgBouncer in transaction pooling mode (Debian's pgbouncer, which
# does not keep protocol-level prepared statements): server sessions are
# shared between the gateway's connections and every other client of the
# pooler, so a statement prepared there could be missing on the next
# session, or replaced by anyone who logs in through PgBouncer. The gateway
# asks each new session its PID: PgBouncer reported one of its own making,
# so no statement is prepared there at all, the log says so once (when a
# query would have been prepared), and every request gets its own answer.
# With `sqldb_prepare off` (the documented setting) there is nothing to say.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read psql free_port);
use File::Temp qw(tempdir);
use Test::More;
use Time::HiRes qw(sleep time);
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64url);

my $bouncer = '/usr/sbin/pgbouncer';
plan skip_all => 'pgbouncer is not installed' unless -x $bouncer;

GatewayTest::start_servers();
my $dir = tempdir('ngx-gateway-bouncer-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0777, $dir;
my $port = free_port();
my ($db, $user, $pw) = @ENV{qw(TEST_NGINX_PG_DB TEST_NGINX_PG_USER TEST_NGINX_PG_PASSWORD)};
(my $quoted = $pw) =~ s/"/""/g;
open my $ul, '>', "$dir/users.txt" or die $!;
print $ul qq{"$user" "$quoted"\n};
close $ul;
open my $ini, '>', "$dir/pgbouncer.ini" or die $!;
print $ini <<"INI";
[databases]
$db = host=127.0.0.1 port=$ENV{TEST_NGINX_PG_PORT} dbname=$db
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = plain
auth_file = $dir/users.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
close $ini;
chmod 0644, "$dir/pgbouncer.ini", "$dir/users.txt";
my @as = $> == 0 ? ('su', 'postgres', '-s', '/bin/sh', '-c', "$bouncer -d -q $dir/pgbouncer.ini") : ($bouncer, '-d', '-q', "$dir/pgbouncer.ini");
system(@as) == 0 or BAIL_OUT('pgbouncer did not start');
my $up = time + 5;
sleep 0.05 while time < $up && !IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port);
END {
    if ($dir && open my $pf, '<', "$dir/pgbouncer.pid") {
        my $pid = <$pf>;
        kill 'TERM', $pid if $pid;
    }
}

my $line = "127.0.0.1:$port dbname=$db user=$user \"password=$pw\" application_name=bounced";
# Six gateway connections with shallow pipelines over PgBouncer's two
# server sessions: statements meet sessions other connections prepared on.
my $upstream = <<"HTTP";
upstream bounced {
    sqldb_server $line;
    sqldb_keepalive max=6;
    sqldb_pipeline on depth=2;
}
HTTP
my $http = <<"HTTP";
${upstream}server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    PREPARE
    location /inc { sqldb_pass bounced; sqldb_query "select \$arg_n::int + 1"; }
    location /tag { sqldb_pass bounced; sqldb_query "select 'tag-' || \$arg_n::text"; }
    location /same { sqldb_pass bounced; sqldb_query "select 'same'"; }
    location /held {
        sqldb_pass bounced;
        sqldb_prepare off;
        sqldb_query "select count(*) from pg_prepared_statements where name like 'ngx\\_gateway\\_%'";
    }
}
HTTP

# Requests in waves of 24 at once; returns how many got their own answer.
sub load {
    my ($port, $total) = @_;
    my ($good, @bad) = (0);
    for (my $i = 0; $i < $total; $i += 24) {
        my @wave;
        for my $n ($i .. $i + 23) {
            my $kind = $n % 3;
            my ($path, $want) = $kind == 0 ? ("/inc?n=$n", $n + 1) : $kind == 1 ? ("/tag?n=$n", "tag-$n") : ('/same', 'same');
            push @wave, [$path, $want, http_send($port, $path)];
        }
        for my $w (@wave) {
            my ($path, $want, $sock) = @$w;
            my ($status, $body) = http_read($sock, 20);
            if (($status // 0) == 200 && ($body // '') eq $want) { $good++ }
            else { push @bad, "$path: " . ($status // 'none') . ' ' . ($body // '') }
        }
    }
    diag("first wrong answers: @bad[0 .. ($#bad < 4 ? $#bad : 4)]") if @bad;
    return $good;
}

for my $case (['', 'prepared statements on (the default)'], ['sqldb_prepare off;', 'sqldb_prepare off']) {
    my ($prepare, $label) = @$case;
    (my $conf = $http) =~ s/PREPARE/$prepare/;
    my $nport = nginx_start($conf);
    is(load($nport, 480), 480, "$label: 480 requests through PgBouncer, each with its own answer");
    my $log = nginx_error_log();
    my @pooler = $log =~ /sqldb: 127\.0\.0\.1:\d+ is a pooler, not PostgreSQL's own session .*set "sqldb_prepare off"/g;
    if ($prepare) {
        is(scalar @pooler, 0, "$label: nothing to say");
    } else {
        is(scalar @pooler, 1, "$label: the pooler is found before anything is prepared, and said once (per worker)");
    }
    # Whichever of PgBouncer's two server sessions answers: nothing of the
    # gateway's is prepared there, for anyone to replace.
    my %held;
    for (1 .. 20) {
        my ($st, $n) = http_read(http_send($nport, '/held'), 10);
        $held{($st // 'none') . " $n"}++;
    }
    is(join(',', sort keys %held), '200 0', "$label: no statement prepared on PgBouncer's sessions (20 answers)");
    unlike($log, qr/\[(error|alert|crit|emerg)\]/, "$label: no request failed") or diag($log);
    stop_nginx();
}

# Bearer tokens through PgBouncer: the role, the claims and the settings are
# set in the transaction of the query (one sync segment), so they reach the
# server session that runs it and end with it. Two users, anonymous
# requests and a location without a key share the upstream; every answer
# must be the caller's own, whichever server session it ran on.
psql(<<"SQL");
do \$\$ begin
  if not exists (select from pg_roles where rolname = 'pgb_user') then create role pgb_user nologin; end if;
  if not exists (select from pg_roles where rolname = 'pgb_anon') then create role pgb_anon nologin; end if;
end \$\$;
grant pgb_user, pgb_anon to $user;
SQL
my $secret = 'the secret of the bounced tokens, over 32 bytes';
open my $sf, '>', "$dir/secret" or die $!;
print $sf "$secret\n";
close $sf;
chmod 0644, "$dir/secret";
sub token {
    my ($sub) = @_;
    my $msg = encode_base64url('{"alg":"HS256"}') . '.'
        . encode_base64url(sprintf '{"sub":"%s","role":"pgb_user","exp":%d}', $sub, time + 600);
    return "$msg." . encode_base64url(hmac_sha256($msg, $secret));
}
my %tokens = (alice => token('alice'), bob => token('bob'));
my $show = q{current_user || ':' || coalesce(nullif(current_setting('request.jwt.claims', true), '')::json->>'sub', '-')}
    . q{ || ':' || coalesce(nullif(current_setting('request.tenant', true), ''), '-')};
my $bport = nginx_start(<<"HTTP");
${upstream}server {
    listen 127.0.0.1:\$PORT;
    sqldb_output value;
    location /who {
        sqldb_pass bounced;
        sqldb_jwt_key $dir/secret;
        sqldb_anonymous_role pgb_anon;
        sqldb_setting request.tenant \$arg_t;
        sqldb_query "select $show";
    }
    location /plain { sqldb_pass bounced; sqldb_query "select $show"; }
}
HTTP
my ($good, @bad) = (0);
for my $wave (0 .. 19) {
    my @sent;
    for my $n (0 .. 23) {
        my $kind = ($wave + $n) % 4;
        my ($path, %h, $want);
        if ($kind == 0) { ($path, $want) = ("/who?t=a$n", "pgb_user:alice:a$n"); $h{Authorization} = "Bearer $tokens{alice}" }
        elsif ($kind == 1) { ($path, $want) = ("/who?t=b$n", "pgb_user:bob:b$n"); $h{Authorization} = "Bearer $tokens{bob}" }
        elsif ($kind == 2) { ($path, $want) = ("/who?t=n$n", "pgb_anon:-:n$n") }
        else { ($path, $want) = ('/plain', "$user:-:-") }
        push @sent, [$path, $want, http_send($bport, $path, %h)];
    }
    for my $s (@sent) {
        my ($path, $want, $sock) = @$s;
        my ($status, $body) = http_read($sock, 20);
        if (($status // 0) == 200 && ($body // '') eq $want) { $good++ }
        else { push @bad, "$path: want $want, got " . ($status // 'none') . ' ' . ($body // '') }
    }
}
is($good, 480, 'tokens through PgBouncer: 480 requests of two users, anonymous and without a key, each its own role, claims and setting')
    or diag("first wrong answers: @bad[0 .. ($#bad < 4 ? $#bad : 4)]");
unlike(nginx_error_log(), qr/\[(error|alert|crit|emerg)\]/, 'tokens through PgBouncer: no request failed');
stop_nginx();
done_testing();
