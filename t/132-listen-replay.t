# sqldb_listen_retry and cache_subscribe_retry: the retry: field (ms)
# first in each stream, from the http, server or location level; none
# where it is not set; nginx -t.
use strict;
use warnings;
use lib 't/lib';
use SseClient qw(open_sse pump body events subscribed);
use GatewayTest qw(conf_line_of free_port nginx_start stop_nginx start_redis redis_cli);
use Test::More;

my $server = GatewayTest::pg_server_line('replay');

# 1. sqldb_listen_retry: from http, and a location's own.
my $port = nginx_start(<<"HTTP", workers => 2);
upstream db { sqldb_server $server; }
sqldb_listen_retry 2500ms;
server {
    listen 127.0.0.1:\$PORT;
    location /events { sqldb_pass db; sqldb_listen \$arg_channel; }
    location /plain { sqldb_pass db; sqldb_listen \$arg_channel; sqldb_listen_retry 1s; }
}
HTTP
my @s = (open_sse($port, '/events?channel=orders'), open_sse($port, '/plain?channel=orders'));
pump(\@s, 5, subscribed(@s));
like(body($s[0]), qr/^retry: 2500\n\n: subscribed\n\n/, 'sqldb_listen_retry (http level): the retry: field comes first');
like(body($s[1]), qr/^retry: 1000\n\n: subscribed\n\n/, 'the location\'s own');
close $_->{s} for @s;
stop_nginx();

# 2. cache_subscribe_retry: the retry: field first, from the server level
# or the location's own; no retry: line where neither gateway has one.
my $redis = start_redis();
my $port2 = free_port();
$port = nginx_start(<<"HTTP");
upstream db { sqldb_server $server; }
upstream red { server 127.0.0.1:$redis->{port}; }
server {
    listen 127.0.0.1:\$PORT;
    cache_subscribe_retry 3s;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /own { cache_pass red; cache_subscribe \$arg_channel; cache_subscribe_retry 250ms; }
}
server {
    listen 127.0.0.1:$port2;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /events { sqldb_pass db; sqldb_listen \$arg_channel; }
}
HTTP
my @cs = (open_sse($port, '/sub?channel=news'), open_sse($port, '/own?channel=news'));
my @none = (open_sse($port2, '/sub?channel=news'), open_sse($port2, '/events?channel=news'));
pump([@cs, @none], 5, subscribed(@cs, @none));
like(body($cs[0]), qr/^retry: 3000\n\n: subscribed\n\n/, 'cache_subscribe_retry (server level): first');
like(body($cs[1]), qr/^retry: 250\n\n: subscribed\n\n/, 'the location\'s own');
is(body($none[0]), ": subscribed\n\n", 'none set: no retry: line (cache_subscribe)');
is(body($none[1]), ": subscribed\n\n", 'none set: no retry: line (sqldb_listen)');
redis_cli($redis, 'publish', 'news', 'hello');
pump(\@cs, 5, sub { !grep { scalar(events($_)) < 1 } @cs });
is_deeply([map { [events($_)] } @cs], [['news=hello'], ['news=hello']], 'the events follow');
close $_->{s} for @cs, @none;
stop_nginx();

# 3. nginx -t
for my $case (
    ['location /a { sqldb_pass db; sqldb_listen c;' . "\n" . 'sqldb_listen_retry abc; }', qr/"sqldb_listen_retry" directive invalid value in \S+nginx\.conf:\d+/, qr/^sqldb_listen_retry abc/],
    ['location /a { sqldb_pass db; sqldb_listen c;' . "\n" . 'sqldb_listen_retry 0; }', qr/"sqldb_listen_retry" must be more than 0/, qr/^sqldb_listen_retry 0/],
    ["location /a { cache_pass 127.0.0.1:1; cache_subscribe c;\ncache_subscribe_retry 5x; }", qr/"cache_subscribe_retry" directive invalid value in \S+nginx\.conf:\d+/,
        qr/^cache_subscribe_retry 5x/],
  )
{
    my ($loc, $want, $line) = @$case;
    my $err = eval {
        nginx_start("upstream db { sqldb_server $server; }\nserver { listen 127.0.0.1:\$PORT;\n$loc\n}");
        stop_nginx();
        'started';
    } // $@;
    like($err, $want, "nginx refuses: $loc");
    like(conf_line_of($err), $line, "and names the directive's line");
}

done_testing();
