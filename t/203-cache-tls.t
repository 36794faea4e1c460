# TLS to Redis, the way proxy_ssl_* works: cache_ssl, the server's
# certificate verified against cache_ssl_trusted_certificate for the name
# cache_ssl_name (or the host of cache_pass), a client certificate for
# mutual TLS, and 502 with a log line naming why when verification fails.
# A real redis-server with TLS, certificates made by openssl here.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(conf_line_of http_request nginx_start stop_nginx nginx_error_log http_get start_redis redis_cli stretch redis_connections tls_files);
use File::Temp qw(tempdir);
use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(time);

# Two authorities, ca (which signed the server and client certificates)
# and other; the server's is for localhost.
my $d = tls_files();

my $redis = start_redis(tls => { cert => "$d/server.crt", key => "$d/server.key", ca => "$d/ca.crt" });
my $mutual = start_redis(tls => { cert => "$d/server.crt", key => "$d/server.key", ca => "$d/ca.crt", clients => 'yes' });
redis_cli($_, 'SET', 'greeting', 'hello over tls') for $redis, $mutual;
my ($tls, $mtls) = ($redis->{tls_port}, $mutual->{tls_port});

# nginx keeps connections per upstream block, whatever the TLS settings of
# the location that opened them (as for proxy_pass): each setting here has a
# block of its own.
my $blocks = join '', map { "upstream $_ { server 127.0.0.1:$tls; keepalive 4; }\n" }
    qw(tls_redis other_ca wrong_name unverified plain);
$blocks .= "upstream unkept { server 127.0.0.1:$tls; }\nupstream unkept2 { server 127.0.0.1:$tls; }\n";
my $port = nginx_start(<<"HTTP");
$blocks
upstream mtls_redis { server 127.0.0.1:$mtls; keepalive 4; }
upstream mtls_none { server 127.0.0.1:$mtls; keepalive 4; }
server {
    listen 127.0.0.1:\$PORT;
    set \$cache_key greeting;
    cache_connect_timeout 5s;
    cache_send_timeout 5s;
    cache_read_timeout 3s;
    cache_ssl on;
    cache_ssl_trusted_certificate $d/ca.crt;
    cache_ssl_verify on;
    cache_ssl_name localhost;
    add_header X-Addr \$upstream_addr always;
    location /verified { cache_pass tls_redis; }
    location /other-ca { cache_ssl_trusted_certificate $d/other.crt; cache_pass other_ca; }
    location /wrong-name { cache_ssl_name elsewhere.example; cache_pass wrong_name; }
    location /unverified { cache_ssl_verify off; cache_ssl_trusted_certificate $d/other.crt; cache_pass unverified; }
    location /no-client-cert { cache_pass mtls_none; }
    location /client-cert {
        cache_ssl_certificate $d/client.crt;
        cache_ssl_certificate_key $d/client.key;
        cache_pass mtls_redis;
    }
    location /plain { cache_ssl off; cache_pass plain; }
    location /put { set \$cache_key written; cache_pass tls_redis; }
    location /unkept { error_log $d/debug.log debug; cache_pipeline off; cache_pass unkept; }
    location /no-reuse { error_log $d/debug2.log debug; cache_pipeline off; cache_ssl_session_reuse off; cache_pass unkept2; }
    location /shared { cache_pass unkept; }
}
HTTP

sub request { http_request($port, @_) }

my @got = map { [request('GET', '/verified')] } 1 .. 5;
is_deeply([map { "$_->[0] $_->[1]" } @got], [('200 hello over tls') x 5],
    'GET over TLS, the server verified, five times over kept connections');
like($got[0][2], qr/X-Addr: 127\.0\.0\.1:$tls/, '$upstream_addr names the server');
is(join(' ', (request('PUT', '/put', 'sent over tls'))[0]), '201', 'PUT over TLS');
is(redis_cli($redis, 'GET', 'written'), 'sent over tls', 'the value arrived');

my $before = length nginx_error_log();
my ($st) = request('GET', '/other-ca');
is($st, 502, 'a certificate from another authority: 502');
like(substr(nginx_error_log(), $before), qr/\[error\].*upstream SSL certificate verify error: \(\d+:[^)]+\)/,
    'the log says why (verify error)');

$before = length nginx_error_log();
($st) = request('GET', '/wrong-name');
is($st, 502, 'a certificate for another name: 502');
like(substr(nginx_error_log(), $before), qr/\[error\].*upstream SSL certificate does not match "elsewhere\.example"/,
    'the log names the name');

is(join(' ', (request('GET', '/unverified'))[0, 1]), '200 hello over tls', 'cache_ssl_verify off: not verified');

$before = length nginx_error_log();
($st) = request('GET', '/no-client-cert');
is($st, 502, 'a server that wants a client certificate, none given: 502');
like(substr(nginx_error_log(), $before), qr{\[(error|crit|info)\].*(SSL|upstream: "rediss://127\.0\.0\.1:$mtls")}, "the log names the TLS upstream");
like(substr(nginx_error_log(), $before), qr{\[(error|crit)\].*SSL_\w+\(\) failed .* while (SSL handshaking to|reading|sending request to) upstream, upstream: 127\.0\.0\.1:$mtls},
    "nginx's own line says what the shared connection was doing, and to which server");
unlike(substr(nginx_error_log(), $before), qr/while \S+ while/, 'one "while" a line');
is(join(' ', (request('GET', '/client-cert'))[0, 1]), '200 hello over tls', 'mutual TLS with cache_ssl_certificate');

# Redis does not take plain RESP on its TLS port: it resets the connection.
$before = length nginx_error_log();
my $t0 = time;
($st) = request("GET", "/plain");
is($st, 502, 'plain RESP to a TLS port: 502');
cmp_ok(time - $t0, '<', stretch(2.9), 'at once, not after cache_read_timeout (3 s)');
like(substr(nginx_error_log(), $before), qr{\[error\].*upstream: "redis://127\.0\.0\.1:$tls"}, 'one error line naming the server');

# Shared, pipelined TLS connections (the default): three requests, one
# connection (one handshake, however many requests).
is(join(' ', map { (request('GET', '/shared'))[0, 1] } 1 .. 3), '200 hello over tls 200 hello over tls 200 hello over tls',
    'shared TLS connections: three answers');
my $before_conns = redis_connections($redis);
request('GET', '/shared') for 1 .. 5;
my $after_conns = redis_connections($redis);
is($after_conns - $before_conns - 1, 0, 'five more on the connection already open (no new handshake)');

# With cache_pipeline off and without keepalive every request opens a
# connection; the TLS session of the first is resumed by the next ones
# (cache_ssl_session_reuse, on by default).
is(join(' ', map { (request('GET', '/unkept'))[0] } 1 .. 3), '200 200 200', 'three requests, three connections');
SKIP: {
    skip 'nginx is not built --with-debug', 2 if `$ENV{TEST_NGINX_BINARY} -V 2>&1` !~ /--with-debug/;
    open my $dl, '<', "$d/debug.log" or die $!;
    my $log = do { local $/; <$dl> };
    my $reused = () = $log =~ /SSL reused session/g;
    cmp_ok($reused, '>=', 2, 'the TLS session is resumed on new connections');
    request('GET', '/no-reuse') for 1 .. 3;
    open $dl, '<', "$d/debug2.log" or die $!;
    $log = do { local $/; <$dl> };
    my $handshakes = () = $log =~ /SSL_do_handshake: 1/g;
    is($handshakes . ' ' . ($log =~ /SSL reused session/ ? 'reused' : 'new'), '3 new',
        'cache_ssl_session_reuse off: three full handshakes');
}
unlike(nginx_error_log(), qr/\[(alert|emerg)\]/, 'no alert');
stop_nginx();

# nginx -t refuses what cannot work.
for my $case (
    ['cache_ssl_verify on;', qr/no "cache_ssl_trusted_certificate" for "cache_ssl_verify" in \S+nginx\.conf:\d+/,
        qr/cache_ssl_verify on;/],
    ["cache_ssl_certificate $d/client.crt;",
        qr/no "cache_ssl_certificate_key" for "cache_ssl_certificate" in \S+nginx\.conf:\d+/, qr/cache_ssl_certificate \S+client\.crt;/],
    ["cache_ssl_certificate_key $d/client.key;",
        qr/no "cache_ssl_certificate" for "cache_ssl_certificate_key" in \S+nginx\.conf:\d+/, qr/cache_ssl_certificate_key \S+client\.key;/],
    ["cache_ssl_trusted_certificate $d/missing.crt;", qr/missing\.crt/],
    ["cache_ssl_certificate $d/client.crt; cache_ssl_certificate_key $d/ca.key;", qr/SSL_CTX_check_private_key|key values mismatch|failed/],
    ['cache_ssl_verify_depth deep;', qr/"cache_ssl_verify_depth" directive invalid number in .*nginx\.conf:\d+/],
    ["cache_ssl_verify on;\n    cache_ssl_trusted_certificate \"\";",
        qr/empty file name in "cache_ssl_trusted_certificate" in \S+nginx\.conf:\d+/, qr/cache_ssl_trusted_certificate "";/],
    ["cache_ssl_certificate \"\";\n    cache_ssl_certificate_key $d/client.key;",
        qr/empty file name in "cache_ssl_certificate" in \S+nginx\.conf:\d+/, qr/cache_ssl_certificate "";/],
  )
{
    my ($lines, $want, $line) = @$case;
    my $err = eval {
        nginx_start(<<"HTTP");
upstream r { server 127.0.0.1:$tls; }
server { listen 127.0.0.1:\$PORT; location / { set \$cache_key k; cache_ssl on;
    $lines
    cache_pass r; } }
HTTP
        stop_nginx();
        'started';
    } // $@;
    like($err, $want, "nginx refuses: $lines");
    like(conf_line_of($err), $line, "and names the directive's line") if $line;
}

# A file inherited from the server level is named at the line it was
# written on.
{
    my $err = eval { nginx_start(<<"HTTP"); stop_nginx(); 'started' } // $@;
upstream r { server 127.0.0.1:$tls; }
server { listen 127.0.0.1:\$PORT;
    cache_ssl_certificate_key $d/client.key;
    location / { set \$cache_key k; cache_ssl on; cache_pass r; } }
HTTP
    like($err, qr/no "cache_ssl_certificate" for "cache_ssl_certificate_key"/, 'nginx refuses an inherited key without a certificate');
    like(conf_line_of($err), qr/^\s*cache_ssl_certificate_key \S+client\.key;/, 'and names the server-level line');
}

# A TLS handshake that never ends (a server that accepts and says nothing)
# is a timeout under cache_connect_timeout: 504, with either connection
# path, and a line that says so (found by outside testing: 502 with the
# shared connections).
{
    my $silent = $ENV{TEST_NGINX_SILENT_PORT};
    my $port = nginx_start(<<"HTTP");
upstream silent_on { server 127.0.0.1:$silent; }
upstream silent_off { server 127.0.0.1:$silent; }
server {
    listen 127.0.0.1:\$PORT;
    set \$cache_key greeting;
    cache_connect_timeout 1s;
    cache_ssl on;
    cache_ssl_verify off;
    location /on { cache_pass silent_on; }
    location /off { cache_pipeline off; cache_pass silent_off; }
}
HTTP
    for my $path ('/on', '/off') {
        my $t0 = time;
        my ($status) = http_request($port, 'GET', $path);
        my $took = time - $t0;
        is($status, 504, "$path: a TLS handshake that never ends answers 504");
        cmp_ok($took, '<', stretch(4), "$path: within cache_connect_timeout (${\ sprintf '%.1f', $took} s)");
    }
    my $log = nginx_error_log();
    like($log, qr/cache: upstream timed out \(110: Connection timed out\) in the TLS handshake while connecting to redis 127\.0\.0\.1:$silent/,
        'the shared connection says it timed out in the handshake');
    like($log, qr/upstream timed out \(110: Connection timed out\) while SSL handshaking to upstream/, 'nginx says so for its own');
    unlike($log, qr/\[(alert|crit|emerg)\]/, 'no alert');
    stop_nginx();
}

# Locations that reach one upstream (a literal host:port written twice is
# one) share its kept connections and TLS sessions: their cache_ssl
# settings must agree, or a session one location verified would serve
# another location unchecked (found by outside testing).
for my $case (
    ["location /a { cache_ssl_verify off; cache_pass 127.0.0.1:$tls; } location /b { cache_pass 127.0.0.1:$tls; }",
        qr/"cache_pass" to "127\.0\.0\.1" in \S+nginx\.conf:\d+ and in \S+nginx\.conf:\d+ with different "cache_ssl\*" settings/],
    ["location /a { cache_pass r; } location /b { cache_ssl_name other.example; cache_pass r; }",
        qr/"cache_pass" to "r" in .* with different "cache_ssl\*" settings/],
    ["location /a { cache_pass r; } location /b { cache_ssl off; cache_pass r; }",
        qr/with different "cache_ssl\*" settings/],
  )
{
    my ($locs, $want) = @$case;
    my $err = eval {
        nginx_start(<<"HTTP");
upstream r { server 127.0.0.1:$tls; }
server { listen 127.0.0.1:\$PORT; set \$cache_key k; cache_ssl on; cache_ssl_verify on;
    cache_ssl_trusted_certificate $d/ca.crt; cache_ssl_name localhost; $locs }
HTTP
        stop_nginx();
        'started';
    } // $@;
    like($err, $want, "nginx refuses: $locs");
}
my $ok = eval {
    nginx_start(<<"HTTP");
upstream r { server 127.0.0.1:$tls; }
server { listen 127.0.0.1:\$PORT; set \$cache_key k; cache_ssl on; cache_ssl_verify on;
    cache_ssl_trusted_certificate $d/ca.crt; cache_ssl_name localhost;
    location /a { cache_pass r; } location /b { cache_pass r; } location /c { cache_pass 127.0.0.1:$tls; } }
HTTP
    stop_nginx();
    'started';
} // $@;
is($ok, 'started', 'locations with the same settings share an upstream');

done_testing();
