# sqldb_escape makes its literals right before the query is built: a
# variable that a later phase writes (auth_request_set, in the access
# phase), or a subrequest while the body comes (mirror), is escaped with
# the value it ends with, never sent raw; a location without sqldb_pass
# leaves the variables as they are.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_request);
use Test::More;
use IO::Socket::INET;
use Time::HiRes qw(sleep);

my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
plan skip_all => 'needs an nginx built with http_auth_request_module'
    unless `$bin -V 2>&1` =~ /http_auth_request_module/;

my $server = GatewayTest::pg_server_line('late');
my $port = nginx_start(<<"HTTP");
upstream database { sqldb_server $server; }
server {
    listen 127.0.0.1:\$PORT;
    sqldb_escape =\$w;
    location = /auth { internal; return 204; }
    location /server-level {
        auth_request /auth;
        auth_request_set \$w \$http_x_w;
        sqldb_pass database;
        sqldb_output value;
        sqldb_query "select \$w";
    }
    location /own {
        sqldb_escape =\$w;
        auth_request /auth;
        auth_request_set \$w \$http_x_w;
        sqldb_pass database;
        sqldb_output value;
        sqldb_query "select \$w";
    }
    location /from {
        sqldb_escape \$e =\$w;
        auth_request /auth;
        auth_request_set \$w \$http_x_w;
        sqldb_pass database;
        sqldb_output value;
        sqldb_query "select \$e";
    }
    location /plain { set \$w \$arg_w; return 200 "[\$w]"; }
    location /race {
        mirror /setter;
        mirror_request_body off;
        set \$v \$arg_x;
        sqldb_escape =\$v;
        sqldb_pass database;
        sqldb_output value;
        sqldb_query "select \$v || \$request_body::text";
    }
    location = /setter { internal; set \$v \$arg_y; return 204; }
}
HTTP

my $hostile = "1 as w, current_user as pwned --";
for my $path ('/server-level', '/own', '/from') {
    my ($status, $body) = http_request($port, 'GET', $path, undef, "X-W: $hostile");
    is("$status $body", "200 $hostile", "$path: the value auth_request_set wrote is escaped, whole");
    ($status, $body) = http_request($port, 'GET', $path, undef, "X-W: it's");
    is("$status $body", "200 it's", "$path: a quote in it");
}
# The body in two parts: the mirror subrequest runs (and sets $v to the
# raw y) while the second is on its way.
my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
print $s "POST /race?x=it's&y=(select/**/current_user) HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    . "Content-Length: 4\r\n\r\nab";
sleep 1;
print $s "cd";
my $reply = do { local $/; <$s> } // '';
like($reply, qr{^HTTP/1\.1 200 }, 'the request with its body in two parts: 200') or diag($reply);
close $s;
my ($value) = $reply =~ /\r\n\r\n(?:[0-9a-f]+\r\n)?(.*?)(?:\r\n0\r\n\r\n)?\z/s;
is($value, '(select/**/current_user)abcd', 'the value a subrequest wrote while the body came is escaped (a string, not run)');
my ($status, $body) = http_request($port, 'GET', "/plain?w=it's");
is("$status $body", "200 [it's]", 'a location without sqldb_pass: the variable as it was set');
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
stop_nginx();
done_testing();
