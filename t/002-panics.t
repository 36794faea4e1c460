# Every function nginx calls survives a panic inside it: the build with
# fault injection (make fault) makes the entry point named by
# NGX_GATEWAY_PANIC panic; the request gets an error status (or its answer
# when the panic comes after it), one alert line names the entry point, and
# the worker lives on (the harness fails a block whose worker died).
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket;

BEGIN {
    if (!$ENV{TEST_NGINX_FAULT_MODULE} || !-f $ENV{TEST_NGINX_FAULT_MODULE}) {
        Test::More::plan(skip_all => 'the fault-injection build is made for Debian\'s nginx only (make fault)');
    }
    $ENV{TEST_NGINX_LOAD_MODULES} = $ENV{TEST_NGINX_FAULT_MODULE};
    $ENV{TEST_NGINX_ALLOW_PANICS} = 1;
}

plan 'no_plan';

our $redis = GatewayTest::start_redis();
$ENV{TEST_NGINX_REDIS_PORT} = $redis->{port};
GatewayTest::redis_cli($redis, 'SET', '/c/there', 'value');

add_block_preprocessor(sub {
    my $block = shift;
    $block->set_value(http_config => "upstream database { sqldb_server $ENV{TEST_NGINX_PG_SERVER}; }\n"
        . "upstream redis { server 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}; keepalive 2; }\n"
        . ($block->http_config // ''));
    my $entry = $block->entry;
    chomp $entry;
    $block->set_value(main_config => "env \"NGX_GATEWAY_PANIC=$entry\";");
    $block->set_value(config => ($block->config // '') . "\nlocation = /alive { return 200 \"alive\"; }\n"
        . "location /q { sqldb_pass database; sqldb_output value; sqldb_query \"select 'ok'\"; }\n"
        . "location /c/ { set \$cache_key \$uri; cache_pass redis; }\n"
        . "location /off/c/ { set \$cache_key /c/there; cache_pipeline off; cache_pass redis; }\n");
    $block->set_value(error_log => "gateway: internal error (panic) in $entry");
});

run_tests();

# While the configuration is read: a panic in a directive, a merge or a
# post-configuration step is a configuration error (nginx -t fails, naming
# the entry point), not a crash of the master.
for my $entry ('cmd_sqldb_query', 'cmd_sqldb_server', 'merge_loc_conf', 'postconfiguration', 'cmd_cache_pass',
    'cache merge_loc_conf', 'create_loc_conf')
{
    local $ENV{NGX_GATEWAY_PANIC} = $entry;
    my $ok = eval {
        GatewayTest::nginx_start(<<'HTTP');
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
server {
    listen 127.0.0.1:$PORT;
    location /q { sqldb_pass database; sqldb_query "select 1"; }
    location /c/ { set $cache_key $uri; cache_pass 127.0.0.1:6379; }
}
HTTP
        1;
    };
    my $err = $@;
    ok(!$ok, "a panic in $entry: nginx does not start");
    like($err, qr/\[alert\].*gateway: internal error \(panic\) in \Q$entry\E/, "and says where");
    unlike($err, qr/exited on signal|core dumped/, 'no crash');
}

# Inside the module's work, not at an entry point's start: the fault point
# NGX_GATEWAY_PANIC names panics the first time the worker reaches it (a
# hub call, a connection's step, a delivery to a request). The panic is
# caught where it happens; what the module had lent (a hub, a connection)
# is given back as it unwinds, and the worker serves the same
# subscriptions and requests afterwards.
{
    use SseClient qw(open_sse pump events subscribed);
    use GatewayTest qw(nginx_start stop_nginx http_request nginx_error_log psql);
    my $rport = $redis->{port};
    my $conf = <<"HTTP";
upstream red { server 127.0.0.1:$rport; }
upstream db { sqldb_server \$TEST_NGINX_PG_SERVER; }
server {
    listen 127.0.0.1:\$PORT;
    location /sub { cache_pass red; cache_subscribe \$arg_channel; }
    location /listen { sqldb_pass db; sqldb_listen \$arg_channel; }
    location /c/ { set \$cache_key \$uri; cache_pass red; }
}
HTTP
    my $start = sub {
        my ($point) = @_;
        return nginx_start($conf, main => "env \"NGX_GATEWAY_PANIC=$point\";\n");
    };
    # A subscriber that gets its ": subscribed" line, then what is
    # published: true when both came.
    my $hears = sub {
        my ($port, $path, $publish, $what) = @_;
        my $sub = open_sse($port, $path);
        pump([$sub], 10, subscribed($sub));
        return 0 if $sub->{buf} !~ /: subscribed/;
        $publish->();
        pump([$sub], 5, sub { $sub->{buf} =~ /\Q$what\E/ });
        close $sub->{s};
        return $sub->{buf} =~ /\Q$what\E/ ? 1 : 0;
    };
    my $publish = sub { GatewayTest::redis_cli($redis, 'PUBLISH', 'news', 'hello') };

    # A hub call: the first subscriber's request ends (its header had gone
    # out: the stream is cut); the hub is not left lent, so the next one
    # subscribes and hears what comes.
    my $port = $start->('hub call');
    my $first = open_sse($port, '/sub?channel=news');
    pump([$first], 5, sub { $first->{eof} });
    ok($first->{eof} && $first->{buf} !~ /: subscribed/, 'a panic in a hub call: that subscription ends');
    my $st;
    ok($hears->($port, '/sub?channel=news', $publish, 'data: hello'), 'the next subscriber of that hub is served');
    like(nginx_error_log(), qr/internal error \(panic\) in .*injected panic in hub call/, 'one alert names it');
    unlike(nginx_error_log(), qr/lent twice/, 'no hub is found lent afterwards');

    # A step of the subscribing connection: it is lost (and made again),
    # its hub is not left lent: the subscriber is served.
    $port = $start->('connection step');
    ok($hears->($port, '/sub?channel=news', $publish, 'data: hello'), 'a panic in a subscribing connection\'s step: its subscriber is served');
    like(nginx_error_log(), qr/injected panic in connection step/, 'the panic was there');
    unlike(nginx_error_log(), qr/lent twice/, 'no hub is found lent afterwards');

    # The same in the listening connection of sqldb_listen.
    $port = $start->('connection step');
    ok($hears->($port, '/listen?channel=orders', sub { psql("notify orders, 'n1'") }, 'data: n1'),
        'a panic in the listening connection\'s step: its subscriber is served');
    like(nginx_error_log(), qr/injected panic in connection step/, 'the panic was there');

    # A delivery to a pipelined request: that request ends (500), the
    # connection it came from serves the next ones.
    $port = $start->('delivery');
    ($st) = http_request($port, 'GET', '/c/there');
    is($st, 500, 'a panic in a delivery: that request gets 500');
    my ($st2, $body) = http_request($port, 'GET', '/c/there');
    is("$st2 $body", '200 value', 'the next request is served');
    ok($hears->($port, '/sub?channel=news', $publish, 'data: hello'), 'and so is a subscriber');
    stop_nginx();
}

__DATA__

=== TEST 1: the database content handler
--- entry: content_handler
--- request eval
["GET /q", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 2: the request body handler
--- entry: body_read
--- request eval
["POST /q\nbody", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 3: the balancer wrappers
--- entry: peer_init
--- request eval
["GET /q", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 4: picking a connection
--- entry: peer_get
--- request eval
["GET /q", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 5: freeing the peer (after the answer)
--- entry: peer_free
--- request eval
["GET /q", "GET /q", "GET /alive"]
--- response_body eval
["ok", "ok", "alive"]



=== TEST 6: the events of database connections
--- entry: database connection event
--- request eval
["GET /q", "GET /alive"]
--- error_code eval
[502, 200]



=== TEST 7: a request's timer
--- entry: request_timer
--- config
location /slow { sqldb_pass database; sqldb_result_timeout 100ms; sqldb_query "select pg_sleep(1)"; }
--- request eval
["GET /slow", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 8: the $sqldb_* variables
--- entry: variable
--- config
location /v { sqldb_pass database; sqldb_query "select 1"; add_header X-Error "[$sqldb_error]"; }
--- request eval
["GET /v", "GET /alive"]
--- response_body_like eval
["", "alive"]



=== TEST 9: the cache content handler
--- entry: cache content handler
--- request eval
["GET /c/there", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 10: the cache's (cache_pipeline off) request
--- entry: cache create_request
--- request eval
["GET /off/c/there", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 11: the cache's (cache_pipeline off) reply header
--- entry: cache process_header
--- request eval
["GET /off/c/there", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 12: the cache's (cache_pipeline off) value filter
--- entry: cache input_filter_init
--- request
GET /off/c/there
--- ignore_response



=== TEST 13b: the end of the cache's reply, on a shared connection (the value's last bytes go out with it: the response is cut, as for any failure after the header)
--- entry: cache reply
--- request
GET /c/there
--- ignore_response



=== TEST 13c: the cache's answer, on a shared connection (the status is not sent)
--- entry: cache answer
--- request eval
["GET /c/there", "GET /alive"]
--- error_code eval
[502, 200]



=== TEST 13d: a shared connection's events: the connection closes, its requests get 502
--- entry: cache pipelined connection event
--- request eval
["GET /c/there", "GET /alive"]
--- error_code eval
[502, 200]



=== TEST 13e: the body of a store on a shared connection
--- entry: cache body_read
--- request eval
["PUT /c/stored\nvalue", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 13f: a replay of sqldb_listen_replay: the client that resumes gets 500
--- entry: sqldb replay
--- config
location /r {
    sqldb_pass database; sqldb_listen $arg_channel;
    sqldb_listen_replay "select 1::bigint, 'x' where $sqldb_last_event_id::bigint > 0 limit 1";
}
--- request eval
["GET /r?channel=x&last_event_id=1", "GET /alive"]
--- error_code eval
[500, 200]



=== TEST 13: the finalizer of the database upstream (a client that leaves mid-query)
--- entry: finalize_request
--- config
location /slow { sqldb_pass database; sqldb_query "select pg_sleep(1)"; }
--- request
GET /slow
--- timeout: 0.3
--- abort
--- wait: 0.5
