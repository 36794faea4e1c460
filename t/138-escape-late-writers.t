# sqldb_escape escapes as the content handler starts, after every phase
# before it: a variable that a later phase writes (auth_request_set, in
# the access phase) is escaped with the value it ends with, never sent
# raw; a location without sqldb_pass leaves the variables as they are.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_request);
use Test::More;

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
}
HTTP

my $hostile = "1 as w, current_user as pwned --";
for my $path ('/server-level', '/own', '/from') {
    my ($status, $body) = http_request($port, 'GET', $path, undef, "X-W: $hostile");
    is("$status $body", "200 $hostile", "$path: the value auth_request_set wrote is escaped, whole");
    ($status, $body) = http_request($port, 'GET', $path, undef, "X-W: it's");
    is("$status $body", "200 it's", "$path: a quote in it");
}
my ($status, $body) = http_request($port, 'GET', "/plain?w=it's");
is("$status $body", "200 [it's]", 'a location without sqldb_pass: the variable as it was set');
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
stop_nginx();
done_testing();
