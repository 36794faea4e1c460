# nginx's upstream framework around the database gateway: $upstream_*
# variables, balancing over several servers, trying the next server.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

run_tests();

__DATA__

=== TEST 1: $upstream_addr, $upstream_status, $upstream_response_time are filled in
--- http_config
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
location /vars {
    sqldb_pass database;
    sqldb_query "select 1 as one";
    add_header X-Addr $upstream_addr;
    add_header X-Status $upstream_status;
    add_header X-Time $upstream_response_time;
    add_header X-Connect $upstream_connect_time;
}
--- request
GET /vars
--- response_headers_like
X-Addr: ^127\.0\.0\.1:\d+$
X-Status: ^200$
X-Time: ^\d+\.\d{3}$
X-Connect: ^\d+\.\d{3}$



=== TEST 2: on an error the variables say what happened
--- http_config
upstream database { sqldb_server 127.0.0.1:$TEST_NGINX_CLOSED_PORT dbname=x user=y password=z; }
--- config
location /vars {
    sqldb_pass database;
    sqldb_query "select 1 as one";
    add_header X-Addr $upstream_addr always;
    add_header X-Status $upstream_status always;
}
--- request
GET /vars
--- error_code: 502
--- response_headers_like
X-Addr: ^127\.0\.0\.1:\d+$
X-Status: ^502$



=== TEST 3: a refused server is skipped for the next one; both show in $upstream_addr
--- http_config
upstream database {
    sqldb_server 127.0.0.1:$TEST_NGINX_CLOSED_PORT dbname=x user=y password=z;
    sqldb_server $TEST_NGINX_PG_SERVER;
}
--- config
location /next {
    sqldb_pass database;
    sqldb_query "select 'second' as echo";
    add_header X-Addr $upstream_addr;
    add_header X-Status $upstream_status;
}
--- request eval
["GET /next", "GET /next", "GET /next"]
--- response_body eval
[GatewayTest::rds('echo', 'second'), GatewayTest::rds('echo', 'second'), GatewayTest::rds('echo', 'second')]
--- no_error_log
[alert]



=== TEST 4: a server that never answers is given up after the connect timeout for the next one
--- http_config
upstream database {
    sqldb_server 127.0.0.1:$TEST_NGINX_SILENT_PORT dbname=x user=y password=z;
    sqldb_server $TEST_NGINX_PG_SERVER;
}
--- config
location /next {
    sqldb_connect_timeout 1s;
    sqldb_pass database;
    sqldb_query "select 'second' as echo";
    add_header X-Status $upstream_status;
}
--- request
GET /next
--- response_body eval
GatewayTest::rds('echo', 'second')
--- response_headers_like
X-Status: ^504, 200$
--- skip_valgrind: 3: the 1 s connect timeout also covers the second server's connection, whose SCRAM authentication alone can take that long under valgrind



=== TEST 5: a server marked down is never used
--- http_config
upstream database {
    sqldb_server 127.0.0.1:$TEST_NGINX_CLOSED_PORT dbname=x user=y password=z down;
    sqldb_server $TEST_NGINX_PG_SERVER;
}
--- config
location /down {
    sqldb_pass database;
    sqldb_query "select 'up' as echo";
}
--- request eval
["GET /down", "GET /down"]
--- response_body eval
[GatewayTest::rds('echo', 'up'), GatewayTest::rds('echo', 'up')]
--- no_error_log
Connection refused



=== TEST 6: least_conn and hash balancers work with sqldb_server
--- http_config
upstream lc {
    least_conn;
    sqldb_server $TEST_NGINX_PG_SERVER;
}
upstream hashed {
    hash $arg_k consistent;
    sqldb_server $TEST_NGINX_PG_SERVER;
    sqldb_server unix:$TEST_NGINX_PG_SOCKET_DIR port=$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER "password=$TEST_NGINX_PG_PASSWORD";
}
--- config
location /lc { sqldb_pass lc; sqldb_query "select 'lc' as echo"; }
location /hash { sqldb_pass hashed; sqldb_query "select 'hash' as echo"; }
--- request eval
["GET /lc", "GET /hash?k=1", "GET /hash?k=2", "GET /hash?k=3"]
--- response_body eval
[GatewayTest::rds('echo', 'lc'), GatewayTest::rds('echo', 'hash'), GatewayTest::rds('echo', 'hash'), GatewayTest::rds('echo', 'hash')]



=== TEST 7: a backup server takes over only while the primary is down
--- http_config
upstream database {
    sqldb_server 127.0.0.1:$TEST_NGINX_CLOSED_PORT dbname=x user=y password=z;
    sqldb_server unix:$TEST_NGINX_PG_SOCKET_DIR port=$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER "password=$TEST_NGINX_PG_PASSWORD" backup;
}
--- config
location /b {
    sqldb_pass database;
    sqldb_query "select coalesce(host(inet_client_addr()), 'unix') as via";
}
--- request eval
["GET /b", "GET /b"]
--- response_body eval
[GatewayTest::rds('via', 'unix'), GatewayTest::rds('via', 'unix')]



=== TEST 8: weights: three requests out of four go to the server of weight 3
--- http_config
upstream database {
    sqldb_server $TEST_NGINX_PG_SERVER weight=3;
    sqldb_server unix:$TEST_NGINX_PG_SOCKET_DIR port=$TEST_NGINX_PG_PORT dbname=$TEST_NGINX_PG_DB user=$TEST_NGINX_PG_USER "password=$TEST_NGINX_PG_PASSWORD";
}
--- config
location /w {
    sqldb_pass database;
    sqldb_query "select coalesce(host(inet_client_addr()), 'unix') as via";
}
--- request eval
["GET /w", "GET /w", "GET /w", "GET /w", "GET /w", "GET /w", "GET /w", "GET /w"]
--- response_body eval
[map { GatewayTest::rds('via', $_) } qw(127.0.0.1 127.0.0.1 unix 127.0.0.1 127.0.0.1 127.0.0.1 unix 127.0.0.1)]



=== TEST 8b: two server lines with the same address and other parameters: each peer connects with its own line's
--- http_config
upstream database {
    sqldb_server $TEST_NGINX_PG_SERVER application_name=first;
    sqldb_server $TEST_NGINX_PG_SERVER application_name=second;
}
--- config
location /n {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select current_setting('application_name')";
}
--- request eval
["GET /n", "GET /n", "GET /n", "GET /n"]
--- response_body eval
["first", "second", "first", "second"]



=== TEST 9: sqldb_next_upstream off: a refused server is not skipped
--- http_config
upstream database {
    sqldb_server 127.0.0.1:$TEST_NGINX_CLOSED_PORT dbname=x user=y password=z;
    sqldb_server $TEST_NGINX_PG_SERVER;
}
--- config
location /n {
    sqldb_next_upstream off;
    sqldb_pass database;
    sqldb_query "select 'second' as echo";
}
--- request
GET /n
--- error_code: 502
