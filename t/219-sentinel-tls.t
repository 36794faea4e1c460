# cache_sentinel with cache_ssl: the Sentinel, the master and its replica
# take TLS on their TLS ports (the Sentinel monitors the master's TLS port,
# and replication is over TLS, so every address the Sentinel names is a
# TLS port: a plain connection there would fail). Keys, a subscriber and
# SENTINEL FAILOVER work through them with the certificate verified; a
# Sentinel whose certificate is not trusted is not reached (503, a notice);
# nginx -t refuses cache_ssl_name with variables for such an upstream.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log nginx_conf_test conf_line_of wait_until start_redis redis_cli
    stretch start_sentinel tls_files);
use HttpClient qw(http_request);
use SseClient qw(open_sse pump events subscribed);
use Test::More;

my $d = tls_files();
my $tls = { cert => "$d/server.crt", key => "$d/server.key", ca => "$d/ca.crt" };
my @fast = ('--repl-diskless-sync-delay', '0', '--tls-replication', 'yes');
my $master = start_redis(tls => $tls, args => [@fast]);
my $replica = start_redis(tls => $tls, args => [@fast, '--replicaof', '127.0.0.1', $master->{tls_port}]);
my %by_tls = map { ($_->{tls_port} => $_) } $master, $replica;
wait_until(sub { redis_cli($replica, 'INFO', 'replication') =~ /master_link_status:up/ }, 20)
    or BAIL_OUT('the replica did not sync over TLS');
my $sentinel = start_sentinel($master->{tls_port}, quorum => 1, tls => $d);
ok(wait_until(sub { redis_cli($sentinel, 'SENTINEL', 'replicas', 'm') =~ /\b$replica->{tls_port}\b/ }, 20),
    'the Sentinel found the replica by its TLS port');

sub site {
    my ($trusted, $name) = @_;
    return <<"HTTP";
upstream ha {
    cache_sentinel m;
    server 127.0.0.1:$sentinel->{tls_port};
}
server {
    listen 127.0.0.1:\$PORT;
    cache_ssl on;
    cache_ssl_trusted_certificate $d/$trusted;
    cache_ssl_verify on;
    cache_ssl_name $name;
    cache_connect_timeout 2s;
    cache_subscribe_heartbeat 1s;
    location /kv/ { set \$cache_key \$uri; cache_pass ha; }
    location /off/ { set \$cache_key \$uri; cache_pass ha; cache_pipeline off; }
    location /sub { cache_pass ha; cache_subscribe news; }
    location /pub { cache_pass ha; cache_publish news; }
}
HTTP
}

my $port = nginx_start(site('ca.crt', 'localhost'), workers => 1);
my ($st) = http_request($port, 'PUT', '/kv/a', 'one');
is($st, 201, 'a PUT through TLS Sentinel and TLS master');
is(redis_cli($master, 'GET', '/kv/a'), 'one', 'it is on the master');
my $body;
($st, $body) = http_request($port, 'GET', '/kv/a');
is("$st $body", '200 one', 'a GET');
($st) = http_request($port, 'PUT', '/off/b', 'two');
is($st, 201, 'cache_pipeline off: nginx\'s upstream over TLS');
like(nginx_error_log(), qr/\[notice\].*master of sentinel set "m" of upstream "ha" is 127\.0\.0\.1:$master->{tls_port}/,
    'the master is its TLS port');

my @subs = map { open_sse($port, '/sub') } 1 .. 2;
pump(\@subs, stretch(10), subscribed(@subs));
is(scalar(grep { $_->{buf} =~ /: subscribed/ } @subs), 2, 'subscribers over TLS');

# SENTINEL FAILOVER: the replica is promoted; writes, reads and the
# subscription follow it.
redis_cli($sentinel, 'SENTINEL', 'FAILOVER', 'm');
ok(wait_until(sub { nginx_error_log() =~ /switched from 127\.0\.0\.1:$master->{tls_port} to 127\.0\.0\.1:$replica->{tls_port}/ }, 20),
    'the switch to the replica\'s TLS port is followed');
($st) = http_request($port, 'PUT', '/kv/c', 'three');
is($st, 201, 'a PUT after the switch');
is(redis_cli($replica, 'GET', '/kv/c'), 'three', 'on the new master');
pump(\@subs, stretch(10), sub { !grep { !grep { $_ eq 'reconnect=' } events($_) } @subs });
my $got = 0;
for (1 .. 20) {
    http_request($port, 'POST', '/pub', 'after');
    pump(\@subs, 0.3);
    $got = grep { grep { $_ eq 'news=after' } events($_) } @subs;
    last if $got == 2;
}
is($got, 2, 'the subscribers hear the new master over TLS');
unlike(nginx_error_log(), qr/\[(alert|crit)\]|SSL_do_handshake\(\) failed/, 'no alert, no failed handshake');
close $_->{s} for @subs;
stop_nginx();

# A Sentinel whose certificate is not trusted: not asked, so no master.
$port = nginx_start(site('other.crt', 'localhost'), workers => 1);
my $head;
($st, undef, $head) = http_request($port, 'GET', '/kv/a');
is($st, 503, 'an untrusted Sentinel names no master: 503');
like($head, qr/\r\nRetry-After: 1\b/i, 'with Retry-After');
like(nginx_error_log(), qr/\[notice\].*sentinel 127\.0\.0\.1:$sentinel->{tls_port} of upstream "ha" cannot be reached/,
    'a notice says the Sentinel cannot be reached');
stop_nginx();

# nginx -t: cache_ssl_name with variables.
eval { nginx_start(site('ca.crt', '$host')) };
my $out = nginx_conf_test();
like($out, qr/"cache_ssl_name" with variables and "cache_pass" to "ha", an upstream of "cache_sentinel" .*in \S+nginx\.conf:\d+/,
    'nginx -t: cache_ssl_name with variables');
like(conf_line_of($out), qr/cache_pass ha;/, '... naming a location that passes to it');
stop_nginx();

done_testing();
