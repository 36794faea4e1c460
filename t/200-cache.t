# The cache gateway: commands from the method, statuses, the specified errors.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

our $redis = GatewayTest::start_redis(unix => 1);
my $locked = GatewayTest::start_redis(password => 'pass word');
$ENV{TEST_NGINX_REDIS_PORT} = $redis->{port};
$ENV{TEST_NGINX_REDIS_AUTH_PORT} = $locked->{port};
$ENV{TEST_NGINX_REDIS_SOCKET} = $redis->{socket};
$ENV{TEST_NGINX_GARBAGE_PORT} = GatewayTest::garbage_port();
GatewayTest::redis_cli($redis, 'RPUSH', 'a-list', 'x');

add_block_preprocessor(sub {
    my $block = shift;
    $block->set_value(http_config => "upstream redis { server 127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}; keepalive 4; }")
        unless defined $block->http_config;
});

run_tests();

__DATA__

=== TEST 1: GET of a missing key: 404
--- config
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request
GET /c/missing
--- error_code: 404



=== TEST 2: PUT stores the body (201), GET returns it with default_type, HEAD the headers only
--- config
default_type application/x-cached;
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request eval
["PUT /c/k2\nhello world", "GET /c/k2", "HEAD /c/k2"]
--- error_code eval
[201, 200, 200]
--- response_body eval
["", "hello world", ""]



=== TEST 2b: a hit has default_type as Content-Type and its length
--- config
default_type application/x-cached;
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- init
GatewayTest::redis_cli($main::redis, 'SET', '/c/k2b', 'twelve bytes');
--- request
GET /c/k2b
--- response_headers
Content-Type: application/x-cached
Content-Length: 12
--- response_body chomp
twelve bytes



=== TEST 3: POST stores too; DELETE deletes (204), then there is nothing to delete (404)
--- config
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request eval
["POST /c/k3\nvalue", "DELETE /c/k3", "DELETE /c/k3", "GET /c/k3"]
--- error_code eval
[201, 204, 404, 404]



=== TEST 4: other methods: 405
--- config
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request
PATCH /c/k4
--- error_code: 405



=== TEST 5: a value with NUL bytes and CRLF inside comes back whole
--- config
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request eval
["PUT /c/bin\n\x00\r\n\$5\r\n:1\r\n\xff\x00", "GET /c/bin"]
--- error_code eval
[201, 200]
--- response_body eval
["", "\x00\r\n\$5\r\n:1\r\n\xff\x00"]



=== TEST 6: $cache_db selects the database in the same round trip
--- config
location /db/ {
    set $cache_key $uri;
    set $cache_db $arg_db;
    cache_pass redis;
}
--- request eval
["PUT /db/k6?db=3\nin three", "GET /db/k6?db=3", "GET /db/k6?db=0", "GET /db/k6"]
--- error_code eval
[201, 200, 404, 404]
--- response_body eval
["", "in three", undef, undef]



=== TEST 6b: a database Redis refuses (16 of 16), or a number beyond SELECT's int: 400 at info
--- config
location /db/ {
    set $cache_key $uri;
    set $cache_db $arg_db;
    cache_pass redis;
}
--- request eval
["GET /db/k6b?db=16", "GET /db/k6b?db=2147483648", "GET /db/k6b?db=99999999999", "GET /db/k6b?db=15"]
--- error_code eval
[400, 400, 400, 404]
--- error_log eval
[qr/\[info\].*cache: redis refused SELECT 16 \("\$cache_db"\): ERR DB index is out of range/,
 qr/\[info\].*cache: "\$cache_db" is not a database number \(0 to 2147483647\): "2147483648"/,
 qr/\[info\].*cache: "\$cache_db" is not a database number \(0 to 2147483647\): "99999999999"/]
--- no_error_log
[error]



=== TEST 7: cache_auth against a server with requirepass
--- http_config
upstream locked { server 127.0.0.1:$TEST_NGINX_REDIS_AUTH_PORT; }
--- config
location /a/ {
    set $cache_key $uri;
    cache_auth "pass word";
    cache_pass locked;
}
--- request eval
["PUT /a/k7\nsecret", "GET /a/k7"]
--- error_code eval
[201, 200]
--- response_body eval
["", "secret"]



=== TEST 8: a wrong password: 502, Redis's reason in the log
--- http_config
upstream locked { server 127.0.0.1:$TEST_NGINX_REDIS_AUTH_PORT; }
--- config
location /a/ {
    set $cache_key $uri;
    cache_auth wrong;
    cache_pass locked;
}
--- request
GET /a/k8
--- error_code: 502
--- response_body_like: 502 Bad Gateway
--- error_log eval
qr/\[error\].*cache: AUTH was refused: (WRONGPASS|ERR)/



=== TEST 9: no password for a server that needs one: 502 with NOAUTH
--- http_config
upstream locked { server 127.0.0.1:$TEST_NGINX_REDIS_AUTH_PORT; }
--- config
location /a/ {
    set $cache_key $uri;
    cache_pass locked;
}
--- request
GET /a/k9
--- error_code: 502
--- error_log
cache: PING was refused: NOAUTH



=== TEST 9b: a cache_auth whose variables make it empty sends no AUTH (on a server with no password, AUTH "" would be refused)
--- config
location /p/ {
    set $cache_key $uri;
    cache_auth $http_x_pass;
    cache_pass redis;
}
location /q/ {
    set $cache_key $uri;
    cache_auth $http_x_pass;
    cache_pipeline off;
    cache_pass redis;
}
--- request eval
["PUT /p/k9b\nshared", "GET /p/k9b", "PUT /q/k9b\nown", "GET /q/k9b"]
--- error_code eval
[201, 200, 201, 200]
--- response_body eval
["", "shared", "", "own"]
--- no_error_log
[error]



=== TEST 10: a Redis error reply (WRONGTYPE): 502 and one log line
--- config
location /t/ {
    set $cache_key a-list;
    cache_pass redis;
}
--- request
GET /t/
--- error_code: 502
--- error_log
cache: redis answered GET with an error: WRONGTYPE



=== TEST 11: a reply that is not RESP: 502
--- config
location /g/ {
    set $cache_key $uri;
    cache_pass 127.0.0.1:$TEST_NGINX_GARBAGE_PORT;
}
--- request
GET /g/x
--- error_code: 502
--- error_log
cache: redis sent an invalid reply to PING



=== TEST 12: a variable naming no known backend: 500
--- config
location /v/ {
    set $cache_key $uri;
    set $backend nosuch;
    cache_pass $backend;
}
--- request
GET /v/x
--- error_code: 500
--- response_body_like: 500 Internal Server Error
--- error_log
cache: "cache_pass" value "nosuch" names no known backend



=== TEST 13: the backend refuses the connection: 502
--- config
location /r/ {
    set $cache_key $uri;
    cache_pass 127.0.0.1:$TEST_NGINX_CLOSED_PORT;
}
--- request
GET /r/x
--- error_code: 502
--- response_body_like: 502 Bad Gateway
--- error_log
Connection refused



=== TEST 14: a variable naming an upstream, or host:port
--- config
location /v/ {
    set $cache_key /c/vk;
    cache_pass $arg_to;
}
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request eval
["PUT /c/vk\nvia variable", "GET /v/?to=redis", "GET /v/?to=127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}"]
--- error_code eval
[201, 200, 200]
--- response_body eval
["", "via variable", "via variable"]



=== TEST 15: an empty key at run time: 400
--- config
location /e/ {
    set $cache_key $arg_k;
    cache_pass redis;
}
--- request
GET /e/
--- error_code: 400
--- error_log
cache: the "$cache_key" variable is empty



=== TEST 16: cache_pass without $cache_key anywhere: nginx -t refuses
--- http_config
upstream redis { server 127.0.0.1:6379; }
--- config
location /x/ {
    cache_pass redis;
}
--- must_die
--- error_log eval
qr/\[emerg\].*"cache_pass" needs the \$cache_key variable, which no "set \$cache_key \.\.\." defines, in \S+nginx\.conf:\d+/



=== TEST 16b: nginx -t refuses a cache_buffer_size too small for the first reply lines
--- config
location /c/ {
    set $cache_key $uri;
    cache_buffer_size 127;
    cache_pass redis;
}
--- must_die
--- error_log eval
qr/\[emerg\].*"cache_buffer_size" must be at least 128 bytes.*, not 127 in \S+nginx\.conf:\d+/



=== TEST 16c: and a cache_buffer_size that is no size, as nginx says it
--- config
location /c/ {
    set $cache_key $uri;
    cache_buffer_size 4x;
    cache_pass redis;
}
--- must_die
--- error_log eval
qr/\[emerg\].*"cache_buffer_size" directive invalid value in \S+nginx\.conf:\d+/



=== TEST 16e: and one given twice
--- config
location /d/ {
    set $cache_key $uri;
    cache_buffer_size 4k;
    cache_buffer_size 8k;
    cache_pass redis;
}
--- must_die
--- error_log eval
qr/\[emerg\].*"cache_buffer_size" directive is duplicate in \S+nginx\.conf:\d+/



=== TEST 16d: cache_buffer_size at http level applies below; 128 bytes is enough
--- http_config
upstream redis { server 127.0.0.1:$TEST_NGINX_REDIS_PORT; keepalive 4; }
cache_buffer_size 128;
--- config
location /c/ {
    set $cache_key $uri;
    set $cache_db $arg_db;
    cache_pass redis;
}
--- request eval
["PUT /c/k16d?db=5\n" . ("x" x 1000), "GET /c/k16d?db=5", "GET /c/k16d"]
--- error_code eval
[201, 200, 404]
--- response_body eval
["", "x" x 1000, undef]



=== TEST 17: a server that never answers: 504 after cache_read_timeout
--- config
location /s/ {
    set $cache_key $uri;
    cache_read_timeout 300ms;
    cache_pass 127.0.0.1:$TEST_NGINX_SILENT_PORT;
}
--- request
GET /s/x
--- error_code: 504
--- error_log
upstream timed out



=== TEST 18: cache_pass inside "if" in location
--- config
location /if/ {
    set $cache_key /c/k18;
    if ($arg_cached) {
        cache_pass redis;
    }
}
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request eval
["PUT /c/k18\nfrom if", "GET /if/?cached=1"]
--- error_code eval
[201, 200]
--- response_body eval
["", "from if"]



=== TEST 19: $upstream_addr and $upstream_status are filled in
--- config
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
    add_header X-Addr $upstream_addr always;
    add_header X-Status $upstream_status always;
}
--- request
GET /c/nothing-here
--- error_code: 404
--- response_headers_like
X-Addr: ^127\.0\.0\.1:\d+$
X-Status: ^404$



=== TEST 20: cache_next_upstream not_found tries the next server
--- http_config
upstream two {
    server 127.0.0.1:$TEST_NGINX_REDIS_AUTH_PORT;
    server 127.0.0.1:$TEST_NGINX_REDIS_PORT;
}
upstream redis { server 127.0.0.1:$TEST_NGINX_REDIS_PORT; }
--- config
location /n/ {
    set $cache_key /c/k20;
    cache_next_upstream error invalid_response not_found;
    cache_pass two;
}
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request eval
["PUT /c/k20\nnext", "GET /n/", "GET /n/"]
--- error_code eval
[201, 200, 200]
--- response_body eval
["", "next", "next"]



=== TEST 21: a unix socket address
--- config
location /u/ {
    set $cache_key /c/k21;
    cache_pass unix:$TEST_NGINX_REDIS_SOCKET;
}
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request eval
["PUT /c/k21\nover a socket", "GET /u/"]
--- error_code eval
[201, 200]
--- response_body eval
["", "over a socket"]



=== TEST 21b: a unix socket that is not there: 502, and one line, nginx's, as for its upstream: why connect() failed, while connecting to upstream, for which request
--- config
location /u/ {
    set $cache_key /c/k21b;
    cache_pass unix:/nonexistent/redis.sock;
}
--- request
GET /u/
--- error_code: 502
--- error_log eval
qr/\[crit\].*connect\(\) to unix:\/nonexistent\/redis\.sock failed \(2: No such file or directory\) while connecting to upstream, client: .*, request: "GET \/u\/ HTTP\/1\.1"/
--- no_error_log
cache: connect() failed



=== TEST 22: a backup server serves while the primary refuses
--- http_config
upstream withbackup {
    server 127.0.0.1:$TEST_NGINX_CLOSED_PORT;
    server 127.0.0.1:$TEST_NGINX_REDIS_PORT backup;
}
upstream redis { server 127.0.0.1:$TEST_NGINX_REDIS_PORT; }
--- config
location /bk/ {
    set $cache_key /c/k22;
    cache_pass withbackup;
}
location /c/ {
    set $cache_key $uri;
    cache_pass redis;
}
--- request eval
["PUT /c/k22\nfrom backup", "GET /bk/", "GET /bk/"]
--- error_code eval
[201, 200, 200]
--- response_body eval
["", "from backup", "from backup"]



=== TEST 23: a value far larger than cache_buffer_size streams through it
--- config
location /c/ {
    set $cache_key $uri;
    cache_buffer_size 128;
    cache_pass redis;
}
--- request eval
["PUT /c/k23\n" . ("0123456789abcdef" x 4096), "GET /c/k23"]
--- error_code eval
[201, 200]
--- response_body eval
["", "0123456789abcdef" x 4096]
