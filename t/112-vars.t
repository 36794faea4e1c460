# Values out of the result into nginx: $sqldb_* variables, sqldb_set,
# sqldb_rewrite, sqldb_escape.
use lib 't/lib';
use GatewayTest;
use Test::Nginx::Socket 'no_plan';

GatewayTest::default_upstream();

run_tests();

__DATA__

=== TEST 1: $sqldb_columns, $sqldb_rows, $sqldb_query in headers; no $sqldb_affected for a SELECT
--- config
location /c {
    sqldb_pass database;
    sqldb_query "select id, name from cats where id <= $arg_n::int";
    add_header X-Cols $sqldb_columns;
    add_header X-Rows $sqldb_rows;
    add_header X-Affected $sqldb_affected;
    add_header X-Query $sqldb_query;
}
--- request
GET /c?n=2
--- response_headers
X-Cols: 2
X-Rows: 2
!X-Affected
X-Query: select id, name from cats where id <= $1::int



=== TEST 2: $sqldb_affected of a statement
--- config
location /u {
    sqldb_pass database;
    sqldb_output none;
    sqldb_query "update cats set age = age where id in (1, 2)";
    add_header X-Affected $sqldb_affected;
}
--- request
POST /u
--- response_headers
X-Affected: 2



=== TEST 3: $sqldb_error in an error_page location
--- config
location /bad {
    sqldb_pass database;
    sqldb_query "select * from nowhere";
    error_page 500 = /oops;
}
location = /oops {
    internal;
    return 200 "failed: $sqldb_error\n";
}
--- request
GET /bad
--- response_body
failed: ERROR: relation "nowhere" does not exist (SQLSTATE 42P01)



=== TEST 4: sqldb_set by column number and by name, used by add_header
--- config
location /s {
    sqldb_pass database;
    sqldb_query "select id, name from cats where id = $arg_id::int";
    sqldb_set $cat_name 0 name;
    sqldb_set $cat_id 0 0 required;
    add_header X-Name $cat_name;
    add_header X-Id $cat_id;
}
--- request
GET /s?id=2
--- response_headers
X-Name: Bob
X-Id: 2



=== TEST 5: sqldb_set required with no such row: 500
--- config
location /s {
    sqldb_pass database;
    sqldb_query "select id, name from cats where id = $arg_id::int";
    sqldb_set $cat_name 0 name required;
}
--- request
GET /s?id=999
--- error_code: 500
--- error_log
sqldb: "sqldb_set $cat_name" is required, the result has no value at row 0



=== TEST 6: sqldb_set required with an empty value: 500; optional: fine
--- config
location /r {
    sqldb_pass database;
    sqldb_query "select notes from cats where id = 2";
    sqldb_set $notes 0 0 required;
}
location /o {
    sqldb_pass database;
    sqldb_query "select notes from cats where id = 1";
    sqldb_set $notes 0 0;
    add_header X-Notes "[$notes]";
}
--- request eval
["GET /r", "GET /o"]
--- error_code eval
[500, 200]



=== TEST 7: sqldb_rewrite: no_rows to nginx's 404 page, rows kept
--- config
location /cat {
    sqldb_pass database;
    sqldb_output value;
    sqldb_query "select name from cats where id = $arg_id::int";
    sqldb_rewrite no_rows 404;
}
--- request eval
["GET /cat?id=1", "GET /cat?id=999"]
--- error_code eval
[200, 404]
--- response_body_like eval
["^Tom\$", "404 Not Found"]



=== TEST 8: sqldb_rewrite: changes =201 keeps the body, no_changes 410, per method
--- config
location /add {
    sqldb_pass database;
    sqldb_output json;
    sqldb_query POST "insert into kv values ('$arg_k', 'v') on conflict do nothing";
    sqldb_rewrite POST changes =201;
    sqldb_rewrite POST no_changes 409;
}
--- request eval
["POST /add?k=one", "POST /add?k=one"]
--- error_code eval
[201, 409]
--- response_body_like eval
['^\{"affected":1\}$', "409 Conflict"]



=== TEST 9: sqldb_rewrite to a 2xx without "=" keeps the result (204 has no body by HTTP)
--- config
location /del {
    sqldb_pass database;
    sqldb_query DELETE "delete from kv where k = $arg_k::text";
    sqldb_rewrite DELETE changes 204;
    sqldb_rewrite DELETE no_changes 404;
}
location /made {
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "select 1 as made";
    sqldb_rewrite rows 201;
}
--- request eval
["POST /del", "DELETE /del?k=absent", "GET /made"]
--- error_code eval
[405, 404, 201]
--- response_body_like eval
["405 Not Allowed", "404 Not Found", '^\[\{"made":1\}\]$']



=== TEST 10: sqldb_escape: quotes, backslashes, empty and missing values
--- config
location /e {
    sqldb_escape $q $arg_v;
    sqldb_escape $q2 =$arg_v;
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "select $q as v, $q2 as v2";
}
--- request eval
["GET /e?v=it's", "GET /e?v=a%5C'b", "GET /e?v=", "GET /e"]
--- response_body eval
['[{"v":"it\'s","v2":"it\'s"}]', '[{"v":"a%5C\'b","v2":"a%5C\'b"}]', '[{"v":null,"v2":""}]', '[{"v":null,"v2":""}]']



=== TEST 11: sqldb_escape of a value with a backslash (set), and in place
--- config
location /e {
    set $raw "a\\'; drop table cats; --";
    sqldb_escape $lit $raw;
    set $inplace "x'y";
    sqldb_escape $inplace;
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "select $lit as v, $inplace as w, (select count(*) from cats)::int as cats";
}
--- request
GET /e
--- response_body chomp
[{"v":"a\\'; drop table cats; --","w":"x'y","cats":3}]



=== TEST 12: invalid sqldb_set / sqldb_rewrite
--- config
location /x {
    sqldb_pass database;
    sqldb_query "select 1";
    sqldb_rewrite no_rows 99;
}
--- must_die
--- error_log eval
qr/\[emerg\].*invalid status "99" in "sqldb_rewrite" directive in \S+nginx\.conf:\d+/



=== TEST 13: sqldb_escape cannot write a variable of the request ($arg_x): it would be the client's own where the rule does not apply
--- config
location /e {
    sqldb_escape =$arg_name;
    sqldb_pass database;
    sqldb_query "select $arg_name";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_escape" cannot write "\$arg_name", a variable of the request \("\$arg_"\): use one of your own in \S+nginx\.conf:\d+/



=== TEST 14: ... in any letter case, nor sqldb_set ($COOKIE_x)
--- config
location /s {
    sqldb_set $COOKIE_c 0 0;
    sqldb_pass database;
    sqldb_query "select 1";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_set" cannot write "\$COOKIE_c", a variable of the request \("\$cookie_"\): use one of your own in \S+nginx\.conf:\d+/



=== TEST 15: the escapes of outer levels apply too; a location's rule for the same variable takes the place of the outer one
--- config
set $v $arg_v;
set $w $arg_w;
sqldb_escape =$v;
sqldb_escape =$w;
location /e {
    sqldb_escape $x $arg_x;
    sqldb_escape =$w;
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "select $v as v, $w as w, $x as x";
}
--- request
GET /e?v=current_user%20as%20v--&w=it's&x=a'b
--- response_body chomp
[{"v":"current_user%20as%20v--","w":"it's","x":"a'b"}]



=== TEST 16: sqldb_escape of nginx's $args (changeable, with a value of the request)
--- config
location /e {
    sqldb_escape =$args;
    sqldb_pass database;
    sqldb_output json;
    sqldb_query "select $args as a";
}
--- request
GET /e?q=a'b
--- response_body chomp
[{"a":"q=a'b"}]



=== TEST 17: nor the module's own $sqldb_jwt_claim_NAME
--- config
location /e {
    sqldb_escape =$Sqldb_Jwt_Claim_sub;
    sqldb_pass database;
    sqldb_query "select 1";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_escape" cannot write "\$Sqldb_Jwt_Claim_sub", a variable of the request \("\$sqldb_jwt_claim_"\): use one of your own in \S+nginx\.conf:\d+/



=== TEST 18: two rules for one variable at one level would escape it twice
--- config
location /e {
    set $v $arg_v;
    sqldb_escape $v $arg_x;
    sqldb_escape =$v;
    sqldb_pass database;
    sqldb_query "select $v";
}
--- must_die
--- error_log eval
qr/\[emerg\].*"sqldb_escape" directive is duplicate: "\$v" is escaped above in \S+nginx\.conf:\d+/
