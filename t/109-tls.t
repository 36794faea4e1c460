# Connection options: TLS with libpq's ssl keywords against a server with a
# self-signed certificate, and IPv6 addresses.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_get rds rds_rows start_extra_pg psql);
use Test::More;

my $tls = start_extra_pg(ssl => 1, ipv6 => 1);
my $auth = "dbname=gateway_test user=gateway \"password=it's a secret\"";

# A role the server takes only without TLS (hostssl ... reject comes
# first): with libpq's default sslmode=prefer, libpq tries TLS, is refused,
# and tries again without it on a new socket.
{
    local $ENV{TEST_NGINX_PG_PORT} = $tls->{port};
    local $ENV{TEST_NGINX_PG_SUPERPW} = $tls->{super};
    psql("create role plain_only login password 'plain pw'; grant connect on database gateway_test to plain_only");
    my $hba = "$tls->{data}/pg_hba.conf";
    open my $in, '<', $hba or die "$hba: $!";
    my $rules = do { local $/; <$in> };
    close $in;
    open my $out, '>', $hba or die "$hba: $!";
    print $out "hostssl all plain_only 127.0.0.1/32 reject\n$rules";
    close $out;
    psql('select pg_reload_conf()');
}
my $plain_only = "dbname=gateway_test user=plain_only \"password=plain pw\"";

my $port = nginx_start(<<"HTTP");
upstream tls_required { sqldb_server 127.0.0.1:$tls->{port} $auth sslmode=require; }
upstream tls_verified { sqldb_server 127.0.0.1:$tls->{port} $auth sslmode=verify-ca sslrootcert=$tls->{dir}/cert.pem; }
upstream tls_wrong_ca { sqldb_server 127.0.0.1:$tls->{port} $auth sslmode=verify-ca sslrootcert=/etc/ssl/certs/ca-certificates.crt; }
upstream plain_required { sqldb_server \$TEST_NGINX_PG_SERVER sslmode=require; }
upstream ipv6 { sqldb_server [::1]:$tls->{port} $auth sslmode=disable; }
upstream prefer_refused { sqldb_server 127.0.0.1:$tls->{port} $plain_only; sqldb_pipeline off; }
upstream prefer_badpw { sqldb_server 127.0.0.1:$tls->{port} dbname=gateway_test user=gateway "password=wrong"; }
server {
    listen 127.0.0.1:\$PORT;
    location /required { sqldb_pass tls_required; sqldb_query "select ssl::text as ssl from pg_stat_ssl where pid = pg_backend_pid()"; }
    location /verified { sqldb_pass tls_verified; sqldb_query "select ssl::text as ssl from pg_stat_ssl where pid = pg_backend_pid()"; }
    location /wrong_ca { sqldb_pass tls_wrong_ca; sqldb_query "select 1 as one"; }
    location /plain { sqldb_pass plain_required; sqldb_query "select 1 as one"; }
    location /prefer_refused { sqldb_pass prefer_refused; sqldb_query "select coalesce((select ssl::text from pg_stat_ssl where pid = pg_backend_pid()), 'none') as ssl"; }
    location /prefer_badpw { sqldb_pass prefer_badpw; sqldb_query "select 1 as one"; }
    location /ipv6 { sqldb_pass ipv6; sqldb_query "select host(inet_client_addr()) as client"; add_header X-Addr \$upstream_addr; }
}
HTTP

my $ssl_on = rds_rows([['ssl', 25]], [['true']]);
for (1 .. 3) {
    my ($st, $body) = http_get($port, '/required');
    is($st, 200, "sslmode=require: request $_");
    is($body, $ssl_on, 'the session is encrypted');
}
my ($st, $body) = http_get($port, '/verified');
is($st, 200, 'sslmode=verify-ca with the server certificate as root');
is($body, $ssl_on, 'encrypted');
($st) = http_get($port, '/wrong_ca');
is($st, 502, 'a certificate that does not verify: 502');
like(nginx_error_log(), qr/sqldb: connecting failed: .*certificate verify failed/, 'with the TLS reason in the log');
($st) = http_get($port, '/plain');
is($st, 502, 'sslmode=require against a server without TLS: 502');
like(nginx_error_log(), qr/server does not support SSL/, 'logged');
($st, $body) = http_get($port, '/ipv6');
is($st, 200, 'an IPv6 address');
is($body, rds_rows([['client', 25]], [['::1']]), 'the connection came over ::1');
# sslmode=prefer (libpq's default): refused over TLS, the connection is
# made again without it, on a new socket that nginx then watches.
my @prefer = map { [http_get($port, '/prefer_refused')] } 1 .. 4;
is_deeply([map { $_->[0] } @prefer], [200, 200, 200, 200],
    'sslmode=prefer, a role refused over TLS: libpq tries again without it, and the gateway follows its new socket');
is($prefer[0][1], rds_rows([['ssl', 25]], [['false']]), 'the session is not encrypted');
($st) = http_get($port, '/prefer_badpw');
is($st, 502, 'sslmode=prefer and a wrong password: 502');
like(nginx_error_log(), qr/sqldb: connecting failed: .*password authentication failed for user "gateway"/,
    "with the server's reason in the log (after TLS, libpq tries without it too)");
unlike(nginx_error_log(), qr/\[alert\]|exited on signal|event error/, 'no alert, no crash, no lost socket');
stop_nginx();
done_testing();
