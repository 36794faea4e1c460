# A cache in front of the database gateway, with Debian's srcache-filter
# module: the first request runs the query, the next ones are served from
# Redis. Debian's nginx only (the srcache module is built for it).
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_get psql rds start_redis redis_cli);
use Test::More;

my $modules = '/usr/lib/nginx/modules';
my $bin = $ENV{TEST_NGINX_BINARY} // '';
plan skip_all => 'srcache-filter is built for Debian\'s nginx only'
    unless $bin eq '/usr/sbin/nginx' && -f "$modules/ngx_http_srcache_filter_module.so";

my $redis = start_redis();
psql('create sequence hits', undef, 'gateway');

my $port = nginx_start(<<"HTTP", main => "load_module $modules/ndk_http_module.so;\nload_module $modules/ngx_http_srcache_filter_module.so;\n");
upstream database { sqldb_server \$TEST_NGINX_PG_SERVER; }
upstream redis { server 127.0.0.1:$redis->{port}; keepalive 4; }
server {
    listen 127.0.0.1:\$PORT;
    location = /redis-get { internal; set \$cache_key \$arg_key; cache_pass redis; }
    location = /redis-put { internal; set \$cache_key \$arg_key; set \$cache_exptime 300; cache_pass redis; }
    location = /hits {
        srcache_fetch GET /redis-get key=hits;
        srcache_store PUT /redis-put key=hits;
        add_header X-Fetch \$srcache_fetch_status;
        sqldb_pass database;
        sqldb_query "select nextval('hits')::text as n";
    }
}
HTTP

my $want = rds('n', '1');
my ($st, $body) = http_get($port, '/hits');
is($st, 200, 'first request');
is($body, $want, 'runs the query');
for my $i (2 .. 4) {
    ($st, $body) = http_get($port, '/hits');
    is($body, $want, "request $i is served from the cache");
}
is(psql('select last_value from hits'), 1, 'the database ran the query once');
like(redis_cli($redis, 'GET', 'hits'), qr/application\/x-gateway-dbd-stream/, 'Redis holds the stored response');
cmp_ok(redis_cli($redis, 'TTL', 'hits'), '>', 200, 'with the expiry from $cache_exptime');
unlike(nginx_error_log(), qr/\[alert\]|\[crit\]|\[error\]|exited on signal/, 'no error, no crash');
stop_nginx();
done_testing();
