# gateway_status: the metrics of every worker in Prometheus's text format
# 0.0.4 (parsed here by the prometheus_client package's own parser) and as
# JSON; the counters match the requests this test sends, across two
# workers; the gauges show the pools; the counters outlive a reload.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(http_request nginx_start stop_nginx nginx_signal nginx_error_log start_redis redis_cli psql wait_until);
use IO::Socket::INET;
use File::Temp;
use Test::More;
use Time::HiRes qw(sleep time);

my $python = '/usr/bin/python3';
plan skip_all => 'python3-prometheus-client is not installed'
    unless system("$python -c 'import prometheus_client' 2>/dev/null") == 0;

my $redis = start_redis();
my $port = nginx_start(<<"HTTP", workers => 2);
upstream database {
    sqldb_server \$TEST_NGINX_PG_SERVER;
}
upstream redis { server 127.0.0.1:$redis->{port}; keepalive 4; }
upstream redis2 { server 127.0.0.1:$redis->{port}; keepalive 4; }
server {
    listen 127.0.0.1:\$PORT;
    location = /metrics { gateway_status; }
    location = /one { sqldb_pass database; sqldb_output value; sqldb_query GET "select 1"; }
    location = /bad { sqldb_pass database; sqldb_query "select * from no_such_table"; }
    location = /sleep { sqldb_pass database; sqldb_result_timeout 2s; sqldb_query "select pg_sleep(10)"; }
    location /kv/ { set \$cache_key \$uri; cache_pass redis; }
    location /var/ { set \$cache_key \$uri; cache_pass \$arg_b; }
    location /fb/ { set \$cache_key \$uri; cache_pass redis2; error_page 404 = /fallback; }
    location /fboff/ { set \$cache_key \$uri; cache_pipeline off; cache_pass redis2; error_page 404 = /fallback; }
    location = /fallback { return 200 "fallback"; }
}
HTTP

# One request on a connection of its own (so that both workers serve some).
sub request { http_request($port, @_) }

# The metrics, parsed by prometheus_client: { "name{label=value,...}" => value }.
sub metrics {
    my ($status, $text, $head) = request('GET', '/metrics');
    die "GET /metrics: $status" unless $status == 200;
    my $tmp = File::Temp->new;
    print $tmp $text;
    close $tmp;
    my $out = `$python -c '
import sys
from prometheus_client.parser import text_string_to_metric_families
for f in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in f.samples:
        labels = ",".join(k + "=" + v for k, v in sorted(s.labels.items()))
        print(s.name + "{" + labels + "} " + repr(float(s.value)))
' $tmp 2>&1`;
    die "prometheus_client refused the text: $out" if $?;
    my %m;
    for (split /\n/, $out) {
        my ($k, $v) = /^(\S+) (\S+)$/ or next;
        $m{$k} = $v + 0;
    }
    return (\%m, $text, $head);
}

sub sum_of {
    my ($m, $re) = @_;
    my $t = 0;
    $t += $m->{$_} for grep { /$re/ } keys %$m;
    return $t;
}

my ($m0, $text0, $head0) = metrics();
like($head0, qr{Content-Type: text/plain; version=0\.0\.4}i, 'Content-Type of the text format 0.0.4');
like($text0, qr/^# TYPE ngx_gateway_sqldb_requests_total counter$/m, 'families are announced with their type');

is(join(' ', map { (request('GET', '/one'))[0] } 1 .. 10), join(' ', (200) x 10), 'ten queries');
is(join(' ', map { (request('POST', '/one'))[0] } 1 .. 3), '405 405 405', 'three refused methods');
is(join(' ', map { (request('GET', '/bad'))[0] } 1 .. 2), '500 500', 'two failed queries');
is((request('PUT', '/kv/k1', 'value'))[0], 201, 'PUT');
is(join(' ', map { (request('GET', '/kv/k1'))[0] } 1 .. 4), '200 200 200 200', 'four hits');
is(join(' ', map { (request('GET', '/kv/none'))[0] } 1 .. 2), '404 404', 'two misses');
is((request('DELETE', '/kv/k1'))[0], 204, 'DELETE');

# A request is counted when nginx logs it, which may come after its client
# has the whole answer (a lingering close ends first): the counts are read
# once the last of these requests is in.
my $m;
wait_until(sub {
    ($m) = metrics();
    my $n = 0;
    $n += $_ // 0 for @$m{map { "ngx_gateway_cache_requests_total{command=$_,upstream=redis}" }
        ('SET,status=201', 'GET,status=200', 'GET,status=404', 'DEL,status=204')};
    $n >= 8 && ($m->{'ngx_gateway_sqldb_requests_total{status=500,upstream=database}'} // 0) >= 2;
}, 5);
is($m->{'ngx_gateway_sqldb_requests_total{status=200,upstream=database}'}, 10, '200s counted, over both workers');
is($m->{'ngx_gateway_sqldb_requests_total{status=405,upstream=}'}, 3, '405s (no upstream chosen)');
is($m->{'ngx_gateway_sqldb_requests_total{status=500,upstream=database}'}, 2, '500s');
is($m->{'ngx_gateway_sqldb_query_duration_seconds_count{upstream=database}'}, 12, 'a duration for each query');
is($m->{'ngx_gateway_sqldb_query_duration_seconds_bucket{le=+Inf,upstream=database}'}, 12, 'the +Inf bucket holds all');
cmp_ok($m->{'ngx_gateway_sqldb_query_duration_seconds_sum{upstream=database}'}, '<', 10, 'the sum in seconds');
my $up = 'upstream=redis';
is($m->{"ngx_gateway_cache_requests_total{command=SET,status=201,$up}"}, 1, 'cache SET')
    or diag(join "\n", map { "$_ $m->{$_}" } grep { /^ngx_gateway_(cache|metrics)/ } sort keys %$m);
is($m->{"ngx_gateway_cache_requests_total{command=GET,status=200,$up}"}, 4, 'cache GET hits by status');
is($m->{"ngx_gateway_cache_requests_total{command=GET,status=404,$up}"}, 2, 'cache GET misses by status');
is($m->{"ngx_gateway_cache_requests_total{command=DEL,status=204,$up}"}, 1, 'cache DEL');
is($m->{"ngx_gateway_cache_hits_total{$up}"}, 4, 'hits');
is($m->{"ngx_gateway_cache_misses_total{$up}"}, 2, 'misses');
is($m->{"ngx_gateway_cache_request_duration_seconds_count{command=GET,$up}"}, 6, 'cache durations');

# Hits and misses are what Redis answered: a miss that error_page turns
# into a 200 is a miss, and a Range of a value found (206, 416) is a hit;
# on the shared connections and with cache_pipeline off alike.
for my $loc ('/fb', '/fboff') {
    is((request('PUT', "$loc/here", 'a value'))[0], 201, "$loc: PUT of a key");
    my @st = map { (request('GET', "$loc/none$_"))[0] } 1 .. 3;
    is("@st", '200 200 200', "$loc: three misses answered by error_page 404 = /fallback");
    is((request('GET', "$loc/here", undef, 'Range: bytes=0-2'))[0], 206, "$loc: a Range of the value: 206");
    is((request('GET', "$loc/here", undef, 'Range: bytes=50-60'))[0], 416, "$loc: a Range past its end: 416");
    is(join(' ', (request('GET', "$loc/here"))[0, 1]), '200 a value', "$loc: the value whole");
}
($m) = metrics();
my $up2 = 'upstream=redis2';
is($m->{"ngx_gateway_cache_misses_total{$up2}"}, 6, 'the six misses that error_page answered are misses');
is($m->{"ngx_gateway_cache_hits_total{$up2}"}, 6, 'the hits: two Ranges and one whole value in each location');
is($m->{"ngx_gateway_cache_requests_total{command=GET,status=200,$up2}"}, 8,
    'by status, the misses answered by error_page are 200s (the status the clients got)');

# An address from a variable (here from the client) is no label of its own:
# a client cannot make series without end.
is(join(' ', map { (request('GET', "/var/x?b=127.0.0.1:$redis->{port}&n=$_"))[0] } 1 .. 3), '404 404 404',
    'cache_pass $arg_b');
wait_until(sub { ($m) = metrics(); ($m->{'ngx_gateway_cache_requests_total{command=GET,status=404,upstream=}'} // 0) >= 3 }, 5);
is($m->{'ngx_gateway_cache_requests_total{command=GET,status=404,upstream=}'}, 3, 'counted under upstream=""');
is(scalar(grep { /upstream=127\.0\.0\.1/ } keys %$m), 0, 'no series names the address');
cmp_ok(sum_of($m, qr/^ngx_gateway_sqldb_prepared_statements_total\{upstream=database\}/), '>=', 1, 'statements prepared');
cmp_ok(sum_of($m, qr/^ngx_gateway_sqldb_connects_total\{server=\S+,upstream=database\}/), '>=', 1, 'connections opened');

# The gauges, once nothing runs: connections idle (as many as the server
# sees), none busy or connecting, nothing queued.
my $server;
# (Polled here and below: a spare connection may still be opening, and
# a worker sees the sessions the server ended when its event loop next
# runs; gauge and server agree once that has settled.)
sub idle_matches_server {
    ($m) = metrics();
    $server = psql("select count(*) from pg_stat_activity where application_name = 'ngx_gateway'");
    return sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=idle/) == $server
        && sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=connecting/) == 0;
}
wait_until(\&idle_matches_server, 5);
is(sum_of($m, qr/^ngx_gateway_sqldb_connections\{server=\S+,state=idle,upstream=database\}/), $server,
    "idle connections: $server, as pg_stat_activity has them");
is(sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=(busy|connecting)/), 0, 'none busy or connecting');
is(sum_of($m, qr/^ngx_gateway_sqldb_pipeline_depth\{/), 0, 'nothing queued');

# While queries run: busy connections and their queue.
my @slow = map {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
    print $s "GET /sleep HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    $s;
} 1 .. 3;
# (Polled: on a busy machine the connections may still be connecting
# 0.1 s on, and a scrape, parsed by a python3 of its own, takes a while:
# the queries run for 2 s, sqldb_result_timeout, so that the gauges are
# seen while they run.)
wait_until(sub {
    ($m) = metrics();
    sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=busy/) >= 1 && sum_of($m, qr/^ngx_gateway_sqldb_pipeline_depth\{/) >= 1;
}, 5);
cmp_ok(sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=busy/), '>=', 1, 'busy connections while queries run');
cmp_ok(sum_of($m, qr/^ngx_gateway_sqldb_pipeline_depth\{/), '>=', 1, 'their queue');
# sqldb_result_timeout (2s) ends them: 504, and the queries are cancelled.
for my $s (@slow) { local $/; my $r = <$s>; }
my $deadline = time + 5;
while (time < $deadline) {
    ($m) = metrics();
    last if sum_of($m, qr/^ngx_gateway_sqldb_cancels_total\{upstream=database\}/) >= 1
        && sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=busy/) == 0;
    sleep 0.1;
}
is($m->{'ngx_gateway_sqldb_requests_total{status=504,upstream=database}'}, 3, 'three timeouts');
cmp_ok(sum_of($m, qr/^ngx_gateway_sqldb_cancels_total\{upstream=database\}/), '>=', 1, 'their queries cancelled');
is(sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=busy/), 0, 'no connection busy afterwards')
    or diag(join "\n", map { "$_ $m->{$_}" } grep { /sqldb_(connections|pipeline|cancels)/ } sort keys %$m);

# Reconnects: the server ends the pooled sessions; new ones open.
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'ngx_gateway'");
sleep 0.3;
# (Each request goes to whichever worker accepts it: a few, until one
# reaches a worker whose connections were ended.)
for (1 .. 20) {
    request('GET', '/one');
    ($m) = metrics();
    last if sum_of($m, qr/^ngx_gateway_sqldb_reconnects_total\{/) >= 1;
}
cmp_ok(sum_of($m, qr/^ngx_gateway_sqldb_reconnects_total\{/), '>=', 1, 'reconnects after pg_terminate_backend');
wait_until(\&idle_matches_server, 5);
is(sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=idle/), $server,
    'the idle gauge follows the connections closed by the server');

# JSON: the same series.
my ($js, $json, $jhead) = request('GET', '/metrics?format=json');
is($js, 200, 'format=json');
like($jhead, qr{Content-Type: application/json}i, 'as application/json');
my $decoded = eval { require JSON::PP; JSON::PP::decode_json($json) };
ok($decoded, 'it parses as JSON') or diag($@);
my ($j200) = grep { $_->{labels}{status} eq '200' && $_->{labels}{upstream} eq 'database' }
    @{ $decoded->{ngx_gateway_sqldb_requests_total}{series} || [] };
is($j200 && $j200->{value}, $m->{'ngx_gateway_sqldb_requests_total{status=200,upstream=database}'},
    'the same value as the text');

is((request('POST', '/metrics'))[0], 405, 'POST to gateway_status: 405');

# A reload keeps the counters (the zone outlives it).
my $before = $m->{'ngx_gateway_sqldb_requests_total{status=200,upstream=database}'};
nginx_signal('HUP');
sleep 1;
request('GET', '/one');
($m) = metrics();
is($m->{'ngx_gateway_sqldb_requests_total{status=200,upstream=database}'}, $before + 1, 'counters outlive a reload');
wait_until(\&idle_matches_server, 5);
is(sum_of($m, qr/^ngx_gateway_sqldb_connections\{.*state=idle/), $server,
    "the old workers' connections left the gauges with them ($server idle, as the server has them)");
unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');
stop_nginx();

# nginx -t
my $err = eval {
    nginx_start("server { listen 127.0.0.1:\$PORT; location / { gateway_status; gateway_status; } }");
    stop_nginx();
    'started';
} // $@;
like($err, qr/"gateway_status" directive is duplicate in .*nginx\.conf:\d+/, 'nginx -t refuses a duplicate');
$err = eval {
    nginx_start("server { listen 127.0.0.1:\$PORT; location / { gateway_status on; } }");
    stop_nginx();
    'started';
} // $@;
like($err, qr/invalid number of arguments in "gateway_status" directive/, 'nginx -t refuses an argument');

done_testing();
