# Configurations written for the C module ngx_http_redis, with redis_pass
# renamed cache_pass (and $redis_key $cache_key, redis_gzip_flag
# cache_gzip_flag, ...), behave as they did there: keys go to Redis escaped
# as nginx's memcached module escapes its keys (cache_escape_key, on by
# default), so that the keys its users' applications wrote are found, on
# every path (shared connections, cache_pipeline off, a Redis Cluster,
# whose slot is that of the escaped key); cache_gzip_flag answers values
# with Content-Encoding: gzip, which nginx's gunzip decodes for clients
# that do not take it.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw($RedisServer $RedisCli conf_line_of nginx_start stop_nginx nginx_error_log http_request start_redis redis_cli free_port
    wait_until key_slot);
use HttpClient qw(unchunk);
use IO::Compress::Gzip qw(gzip $GzipError);
use Test::More;

my $redis = start_redis();

# A Redis Cluster of three masters (no replicas), made by redis-cli.
my @nodes = map {
    start_redis(args => ['--cluster-enabled', 'yes', '--cluster-config-file', '$dir/nodes.conf',
        '--cluster-port', free_port()])
} 1 .. 3;
my $create = `$RedisCli --cluster create @{[ map { "127.0.0.1:$_->{port}" } @nodes ]} --cluster-replicas 0 --cluster-yes 2>&1`;
like($create, qr/All 16384 slots covered/, 'redis-cli made the cluster') or diag($create);
ok(wait_until(sub { !grep { redis_cli($_, 'cluster', 'info') !~ /cluster_state:ok/ } @nodes }, 20),
    'cluster_state:ok on the three nodes');
my $seeds = join ' ', map { "server 127.0.0.1:$_->{port};" } @nodes;

# The master that holds a slot (its instance), as the cluster says.
sub master_of {
    my ($slot) = @_;
    for my $n (@nodes) {
        for (split /\n/, redis_cli($n, 'cluster', 'nodes')) {
            my (undef, $addr, $flags, undef, undef, undef, undef, undef, @ranges) = split ' ';
            next unless $flags =~ /master/;
            my ($port) = $addr =~ /:(\d+)@/;
            for (@ranges) {
                my ($lo, $hi) = /^(\d+)(?:-(\d+))?$/ or next;
                return (grep { $_->{port} == $port } @nodes)[0] if $slot >= $lo && $slot <= ($hi // $lo);
            }
        }
        last;
    }
    die "no master for slot $slot";
}

# What cache_escape_key on sends: control bytes, space and % as %XX.
sub escaped {
    my ($k) = @_;
    $k =~ s/([\x00-\x20%])/sprintf('%%%02X', ord $1)/ge;
    return $k;
}

my $port = nginx_start(<<"HTTP");
upstream redis { server 127.0.0.1:$redis->{port}; keepalive 4; }
upstream cluster { cache_cluster on; $seeds keepalive 4; }
server {
    listen 127.0.0.1:\$PORT;
    add_header X-Addr \$upstream_addr always;
    # (\$uri: nginx writes the captures of a regular expression escaped
    # when the URI was.)
    set \$cache_key \$uri;
    location /on/ { cache_pass redis; }
    location /off/ { cache_pipeline off; cache_pass redis; }
    location /cl/ { cache_pass cluster; }
    location /raw-on/ { cache_escape_key off; cache_pass redis; }
    location /raw-off/ { cache_escape_key off; cache_pipeline off; cache_pass redis; }
    location /raw-cl/ { cache_escape_key off; cache_pass cluster; }
    location /empty-on { set \$cache_key \$arg_k; cache_pass redis; }
    location /empty-off { set \$cache_key \$arg_k; cache_pipeline off; cache_pass redis; }
    location /empty-raw { set \$cache_key \$arg_k; cache_escape_key off; cache_pass redis; }
}
HTTP

# A value that another client stored under the escaped key, as
# ngx_http_redis's users' applications store them, is found by the key
# nginx decoded from the URI; without escaping, it is not.
redis_cli($redis, 'SET', "$_/file%20sp", 'SEE-THIS') for '/on', '/off', '/raw-on';
for my $path ('/on', '/off') {
    my ($status, $body) = http_request($port, 'GET', "$path/file%20sp");
    is("$status $body", '200 SEE-THIS', "$path: a key written escaped by another client is found");
}
is((http_request($port, 'GET', '/raw-on/file%20sp'))[0], 404, 'cache_escape_key off: it is not');

# Keys with a space, %, control bytes, bytes past ASCII: stored through the
# gateway and found again on every path, with escaping and without; Redis
# holds the escaped key, or the key as it is.
my @keys = (
    ['a space', '/k/a%20b', "/k/a b"],
    ['a %', '/k/100%25', '/k/100%'],
    ['control bytes', '/k/c%01%09%1Fd', "/k/c\x01\x09\x1fd"],
    ['bytes past ASCII and DEL', '/k/caf%C3%A9%7F', "/k/caf\xc3\xa9\x7f"],
    ['only escapes', '/k/%25%20%25', '/k/% %'],
);
# The cluster is asked once first: the request that learns its map may be
# redirected.
http_request($port, 'GET', '/cl/warm-up');
for my $k (@keys) {
    my ($what, $uri, $raw) = @$k;
    for my $via (qw(on off cl raw-on raw-off raw-cl)) {
        my $esc = $via !~ /^raw/;
        my $value = "value of $what via $via";
        my $sent = $esc ? escaped("/$via$raw") : "/$via$raw";
        my $r = $via =~ /cl$/ ? master_of(key_slot($sent)) : $redis;
        my ($put) = http_request($port, 'PUT', "/$via$uri", $value);
        my ($status, $body, $head) = http_request($port, 'GET', "/$via$uri");
        is("$put $status $body", "201 200 $value", "$what via $via: stored and found again");
        is(redis_cli($r, 'GET', $sent), $value, "$what via $via: Redis holds the " . ($esc ? 'escaped key' : 'key as it is'));
        if ($via =~ /cl$/) {
            my ($addr) = $head =~ /^X-Addr: (.*?)\r?$/mi;
            is($addr, "127.0.0.1:$r->{port}", "$what via $via: straight to the master of the slot of the key sent");
        }
        is((http_request($port, 'DELETE', "/$via$uri"))[0], 204, "$what via $via: deleted");
    }
}

# A key whose escaped and raw forms are in slots of two masters: the
# request goes to the escaped key's master, without a redirection.
my ($split) = grep { master_of(key_slot($_))->{port} != master_of(key_slot(escaped($_)))->{port} } map { "/cl/split $_" } 1 .. 100;
{
    (my $path = $split) =~ s/ /%20/g;
    my ($put, undef, $head) = http_request($port, 'PUT', $path, 'split');
    my ($addr) = $head =~ /^X-Addr: (.*?)\r?$/mi;
    my $owner = master_of(key_slot(escaped($split)));
    is("$put $addr", "201 127.0.0.1:$owner->{port}", 'a key whose raw slot is elsewhere: its escaped slot is used');
    is(redis_cli($owner, 'GET', escaped($split)), 'split', 'and holds the value');
}

# An empty $cache_key is the client's mistake, with escaping or without.
for my $path ('/empty-on', '/empty-off', '/empty-raw') {
    is((http_request($port, 'GET', "$path?k="))[0], 400, "$path: an empty key is 400");
}
like(nginx_error_log(), qr/\[info\].*the "\$cache_key" variable is empty/, 'logged at info');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]/, 'no alert');
stop_nginx();

# cache_gzip_flag: Redis has no flags, so the directive alone says that
# the values are gzipped. A value is answered with Content-Encoding: gzip;
# nginx's gunzip decodes it for a client that does not take gzip.
my $text = join '', map { sprintf "X%03dXXXXXX", $_ } 0 .. 99;
gzip(\$text => \my $gz) or die $GzipError;
open my $cli, '|-', $RedisCli, '-p', $redis->{port}, '-x', 'SET', '/gz/doc' or die "redis-cli: $!";
print $cli $gz;
close $cli;
redis_cli($redis, 'SET', '/gz/plain', 'not gzipped');

# (Debian's nginx has ngx_http_gunzip_module; an nginx built without it
# skips those checks.)
my $gunzip = `@{[ $ENV{TEST_NGINX_BINARY} || 'nginx' ]} -V 2>&1` =~ /--with-http_gunzip_module/;
my $gunzip_locations = $gunzip ? <<'CONF' : '';
    location /gunzip-on { gunzip on; cache_pass redis; }
    location /gunzip-off { gunzip on; cache_pipeline off; cache_pass redis; }
CONF
$port = nginx_start(<<"HTTP");
upstream redis { server 127.0.0.1:$redis->{port}; keepalive 4; }
server {
    listen 127.0.0.1:\$PORT;
    cache_gzip_flag 2;
    set \$cache_key \$arg_key;
    location /on { cache_pass redis; }
    location /off { cache_pipeline off; cache_pass redis; }
    location /unflagged { cache_gzip_flag 0; cache_pass redis; }
$gunzip_locations}
HTTP

my $encoding = sub { ($_[0] =~ /^Content-Encoding: (.*?)\r?$/mi)[0] // 'none' };
for my $via (qw(on off)) {
    my ($status, $body, $head) = http_request($port, 'GET', "/$via?key=/gz/doc", undef, 'Accept-Encoding: gzip');
    is("$status " . $encoding->($head), '200 gzip', "$via: a value is answered with Content-Encoding: gzip");
    ok($body eq $gz, "$via: the value as Redis holds it");
    ($status, $body, $head) = http_request($port, 'HEAD', "/$via?key=/gz/doc");
    is("$status " . $encoding->($head), '200 gzip', "$via: HEAD too");
    ($status, $body, $head) = http_request($port, 'GET', "/$via?key=/gz/missing");
    is("$status " . $encoding->($head), '404 none', "$via: a miss is not gzipped");
    ($status, $body, $head) = http_request($port, 'PUT', "/$via?key=/gz/new", 'x');
    is("$status " . $encoding->($head), '201 none', "$via: nor is a store");
    SKIP: {
        skip 'nginx is built without ngx_http_gunzip_module', 5 unless $gunzip;
        ($status, $body, $head) = http_request($port, 'GET', "/gunzip-$via?key=/gz/doc");
        is("$status " . $encoding->($head), '200 none', "gunzip, $via: a client that does not take gzip gets it decoded");
        # (Decoded, the length is not known before: chunked.)
        like($head, qr/^Transfer-Encoding: chunked\r?$/mi, "gunzip, $via: chunked");
        is(unchunk($body), $text, "gunzip, $via: the text");
        ($status, $body, $head) = http_request($port, 'GET', "/gunzip-$via?key=/gz/doc", undef, 'Accept-Encoding: gzip');
        is("$status " . $encoding->($head), '200 gzip', "gunzip, $via: a client that takes gzip gets it as it is");
        ok($body eq $gz, "gunzip, $via: gzipped");
    }
}
my ($status, $body, $head) = http_request($port, 'GET', '/unflagged?key=/gz/plain');
is("$status " . $encoding->($head) . " $body", '200 none not gzipped', 'cache_gzip_flag 0 in a location turns it off');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]/, 'no alert');
stop_nginx();

# nginx -t names the directive and its line.
for my $case (
    ['cache_gzip_flag yes;', qr/"cache_gzip_flag" directive invalid number in \S+nginx\.conf:\d+/],
    ['cache_escape_key maybe;', qr/invalid value "maybe" in "cache_escape_key" directive, it must be "on" or "off" in \S+nginx\.conf:\d+/],
  )
{
    my ($line, $want) = @$case;
    my $err = eval { nginx_start(<<"HTTP"); stop_nginx(); 'started' } // $@;
upstream redis { server 127.0.0.1:$redis->{port}; }
server { listen 127.0.0.1:\$PORT; location / { set \$cache_key \$uri;
    $line
    cache_pass redis; } }
HTTP
    like($err, $want, "nginx refuses: $line");
    like(conf_line_of($err), qr/^\s*\Q$line\E/, "and names its line");
}

done_testing();
