# The JSON CRUD example of nginx-conf/crud.conf, included as it is.
use lib 't/lib';
use Cwd qw(getcwd);
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

$ENV{TEST_NGINX_CRUD_CONF} = getcwd() . '/nginx-conf/crud.conf';

run_tests();

__DATA__

=== TEST 1: list, create (201), read, update, delete (204), then 404
--- http_config
upstream demo_db { sqldb_server $TEST_NGINX_PG_SERVER; }
--- config
include $TEST_NGINX_CRUD_CONF;
--- request eval
["GET /api/cats",
 "POST /api/cats\n{\"name\": \"Nova\", \"age\": 1}",
 "GET /api/cats/4",
 "PUT /api/cats/4\n{\"age\": 2, \"indoor\": true}",
 "DELETE /api/cats/4",
 "GET /api/cats/4",
 "DELETE /api/cats/4",
 "GET /api/cats/abc"]
--- error_code eval
[200, 201, 200, 200, 204, 404, 404, 400]
--- response_body eval
['[{"id":1,"name":"Tom","age":3,"indoor":true},{"id":2,"name":"Bob","age":7,"indoor":false},{"id":3,"name":"Jerry","age":null,"indoor":null}]',
 '[{"id":4,"name":"Nova","age":1,"indoor":null}]',
 '[{"id":4,"name":"Nova","age":1,"indoor":null}]',
 '[{"id":4,"name":"Nova","age":2,"indoor":true}]',
 '', undef, undef, undef]
