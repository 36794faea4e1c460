# cache_stream_add: a POST or PUT appends its body to a Redis stream as
# the field data (and event, from the query argument event), trimmed with
# MAXLEN ~ N; the answer is 201 and {"id":"<entry id>"}; other methods
# 405; an empty key 400; nginx -t names the line of a bad maxlen= (one
# past Redis's signed 64-bit range included). A cache_stream client whose
# last id Redis would refuse (the highest id: nothing can follow it) gets
# 400 at info, as for any bad id.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(conf_line_of http_request http_send http_read nginx_start stop_nginx nginx_error_log start_redis redis_cli);
use Test::More;

my $redis = start_redis();
my $rport = $redis->{port};

my $port = nginx_start(<<"HTTP");
upstream red { server 127.0.0.1:$rport; }
server {
    listen 127.0.0.1:\$PORT;
    location /add { cache_pass red; cache_stream_add \$arg_key; }
    location /short { cache_pass red; cache_stream_add short maxlen=5; }
    location /shared { cache_pass red; cache_pipeline on; cache_stream_add \$arg_key; }
    location /read { cache_pass red; cache_stream \$arg_key; }
}
HTTP

# 1. 201 with the ID, which the stream then carries with the body as its
# field data; event from the query argument; an empty body; PUT too; and
# over the pipelined connections alike.
my ($st, $body, $head) = http_request($port, 'POST', '/add?key=s1', "line one\nline two");
is($st, 201, 'POST: 201');
like($head, qr{Content-Type: application/json}i, 'as JSON');
my ($id) = $body =~ /^\{"id":"(\d+-\d+)"\}$/;
ok($id, "the body is the entry's id ($body)");
my $range = redis_cli($redis, 'xrange', 's1', '-', '+');
like($range, qr/\Q$id\E\s+data\s+line one\nline two\s*$/s, 'the stream carries the id and the body as data');
($st, $body) = http_request($port, 'PUT', '/add?key=s1&event=up%20date', '');
is($st, 201, 'PUT with an empty body: 201');
my ($id2) = $body =~ /"id":"(\d+-\d+)"/;
ok($id2, 'a second id');
$range = redis_cli($redis, 'xrange', 's1', $id2, $id2);
like($range, qr/\Q$id2\E\s+data\s+event\s+up date\s*$/s, 'an empty data field and the event');
($st, $body) = http_request($port, 'POST', '/shared?key=s2', 'x');
is($st, 201, 'pipelined: 201');
my ($id3) = $body =~ /"id":"(\d+-\d+)"/;
like(redis_cli($redis, 'xrange', 's2', '-', '+'), qr/\Q$id3\E\s+data\s+x/, 'pipelined: the stream carries it');

# 2. Other methods are 405; an empty key is 400, logged at info.
is((http_request($port, 'GET', '/add?key=s1'))[0], 405, 'GET: 405');
is((http_request($port, 'DELETE', '/add?key=s1'))[0], 405, 'DELETE: 405');
is((http_request($port, 'POST', '/add', 'x'))[0], 400, 'an empty key: 400');
like(nginx_error_log(), qr/\[info\].*the stream's key is empty/, 'the empty key is logged at info');

# 3. maxlen=5 trims (MAXLEN ~ trims whole macro nodes: the stream stays
# far below the 300 added, at most a node's entries above 5).
http_request($port, 'POST', '/short', "e$_") for 1 .. 300;
my $len = redis_cli($redis, 'xlen', 'short');
chomp $len;
cmp_ok($len, '<', 300, "maxlen=5 trimmed the stream ($len entries left of 300)");
cmp_ok($len, '>=', 5, 'and keeps at least 5');

# 3b. The highest id is one Redis refuses to read after (XRANGE's
# exclusive start past it is out of its range): the client's mistake, 400
# logged at info as other bad ids are, not 502 with an error line.
my $max = '18446744073709551615-18446744073709551615';
my ($mst) = http_read(http_send($port, '/read?key=s1', 'Last-Event-ID' => $max), 10);
is($mst, 400, 'Last-Event-ID of the highest id: 400');
($mst) = http_read(http_send($port, "/read?key=s1&last_event_id=$max"), 10);
is($mst, 400, 'last_event_id= of the highest id: 400');
like(nginx_error_log(), qr/\[info\].*the last event id "\Q$max\E"/, 'logged at info');
unlike(nginx_error_log(), qr/\[error\]/, 'no error line');
my ($below) = http_read(http_send($port, '/read?key=s1', 'Last-Event-ID' => '18446744073709551615-18446744073709551614'), 2);
is($below, 200, 'the id below it is taken: the stream starts');
stop_nginx();

# 4. nginx -t
for my $case (
    ['location /a { cache_pass red; cache_stream_add k maxlen=0; }', qr/invalid parameter "maxlen=0" in "cache_stream_add" directive .* in \S+nginx\.conf:\d+/, qr/cache_stream_add k maxlen=0;/],
    ['location /a { cache_pass red; cache_stream_add k max=5; }', qr/invalid parameter "max=5" in "cache_stream_add" directive/, qr/cache_stream_add k max=5;/],
    ['location /a { cache_pass red; cache_stream_add k maxlen=9223372036854775808; }', qr/invalid parameter "maxlen=9223372036854775808" in "cache_stream_add" directive .* in \S+nginx\.conf:\d+/, qr/cache_stream_add k maxlen=9223372036854775808;/],
    ['location /a { cache_pass red; cache_stream_add k maxlen=18446744073709551615; }', qr/invalid parameter "maxlen=18446744073709551615"/, qr/cache_stream_add k maxlen=18446744073709551615;/],
    ['location /a { cache_pass red; cache_stream_add k maxlen=9223372036854775807; }', qr/^started$/],
    ['location /a { cache_stream_add k; }', qr/"cache_stream_add" needs "cache_pass" in the same location in \S+nginx\.conf:\d+/, qr/cache_stream_add k;/],
    ['location /a { cache_pass red; cache_stream_add k maxlen=3; }', qr/^started$/],
  )
{
    my ($loc, $want, $line) = @$case;
    my $err = eval {
        my $p = nginx_start("upstream red { server 127.0.0.1:$rport; }\nserver { listen 127.0.0.1:\$PORT;\n$loc\n}");
        http_request($p, 'GET', '/');
        stop_nginx();
        'started';
    } // $@;
    like($err, $want, "nginx -t: $loc");
    like(conf_line_of($err), $line, "and names the directive's line") if $line;
}

done_testing();
