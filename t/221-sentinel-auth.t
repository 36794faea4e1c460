# cache_sentinel_auth and cache_auth with a Sentinel set: three Sentinels
# with a password of their own (requirepass, and sentinel auth-pass for the
# servers), a master and two replicas with another (requirepass), all real
# servers. With both passwords right, keys and cache_pipeline off work and
# SENTINEL FAILOVER is followed. With a wrong cache_sentinel_auth no
# Sentinel names a master: 503 with Retry-After, a notice for each Sentinel
# (AUTH was refused), and no data server gets a connection, an AUTH or a
# ROLE from nginx. With a wrong cache_auth the Sentinels name the master,
# which refuses the check's AUTH: 503 with Retry-After, and the log says
# why the master is not confirmed.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log wait_until redis_cli stretch start_sentinel_set);
use HttpClient qw(http_request);
use Test::More;
use Time::HiRes qw(time);

my ($spw, $dpw) = ('sentinels-only', 'servers-only');
my ($master, $replicas, $set) = eval {
    start_sentinel_set(password => $dpw, sentinel => { password => $spw, auth_pass => $dpw });
} or BAIL_OUT($@);
my @servers = ($master, @$replicas);
my @sentinels = @$set;
my %by_port = map { ($_->{port} => $_) } @servers;

like(redis_cli({ port => $sentinels[0]{port} }, 'SENTINEL', 'get-master-addr-by-name', 'm'), qr/NOAUTH/,
    'a Sentinel answers no question without its password');
like(redis_cli({ port => $master->{port} }, 'GET', 'x'), qr/NOAUTH/, 'the master takes no command without its password');

sub site {
    my ($sentinel_pw, $data_pw) = @_;
    my $upstream = join '', map { "    server 127.0.0.1:$_->{port};\n" } @sentinels;
    return <<"HTTP";
upstream ha {
    cache_sentinel m;
    cache_sentinel_auth $sentinel_pw;
$upstream}
server {
    listen 127.0.0.1:\$PORT;
    cache_connect_timeout 1s;
    cache_read_timeout 2s;
    cache_auth $data_pw;
    location /kv/ { set \$cache_key \$uri; cache_pass ha; }
    location /off/ { set \$cache_key \$uri; cache_pass ha; cache_pipeline off; }
}
HTTP
}

# The connections a data server holds that are nobody else's: not a
# Sentinel's (they name theirs sentinel-...), not a replica's link or its
# own link to its master (flags S, M), not redis-cli's own.
sub foreign_clients {
    my ($r) = @_;
    return scalar grep { !/ name=sentinel-/ && !/ flags=[A-Za-z]*[SM]/ && !/ cmd=client\|list/ }
        split /\n/, redis_cli($r, 'CLIENT', 'LIST');
}

# Calls of a command on a server since its last CONFIG RESETSTAT.
sub calls {
    my ($r, $cmd) = @_;
    my ($n) = redis_cli($r, 'INFO', 'commandstats') =~ /^cmdstat_\Q$cmd\E:calls=(\d+)/m;
    return $n // 0;
}

# 1. A wrong cache_sentinel_auth: the Sentinels refuse it, none names the
# master, and nginx sends nothing to a data server.
redis_cli($_, 'CONFIG', 'RESETSTAT') for @servers;
my $port = nginx_start(site('not-the-password', $dpw), workers => 1);
my $t = time;
my ($st, undef, $head) = http_request($port, 'PUT', '/kv/a', 'one');
my $took = time - $t;
is($st, 503, 'a wrong cache_sentinel_auth: 503');
like($head, qr/\r\nRetry-After: 1\b/i, 'with Retry-After');
cmp_ok($took, '<', stretch(2.5), sprintf('after cache_connect_timeout (1 s), not longer (%.2f s)', $took));
is((http_request($port, 'GET', '/off/a'))[0], 502, 'cache_pipeline off: 502 at once');
for my $s (@sentinels) {
    ok(wait_until(sub {
        nginx_error_log() =~ /\[notice\].*sentinel 127\.0\.0\.1:$s->{port} of upstream "ha" cannot be reached: AUTH was refused: WRONGPASS/
    }, 5), "a notice: Sentinel $s->{port} cannot be reached, AUTH was refused");
}
like(nginx_error_log(), qr/\[error\].*no master of sentinel set "m" of upstream "ha" was confirmed within 1000 ms \(cache_connect_timeout\)/,
    'the request\'s error line says why');
unlike(nginx_error_log(), qr/master of sentinel set "m" of upstream "ha" is/, 'no master is confirmed');
my $notices = () = nginx_error_log() =~ /cannot be reached/g;
is($notices, 3, 'one notice per Sentinel, not repeated while it refuses');
is(join(' ', map { foreign_clients($_) } @servers), '0 0 0', 'no data server has a connection from nginx');
is(join(' ', map { calls($_, 'role') } @servers), '0 0 0', 'none was asked ROLE');
stop_nginx();

# 2. Both passwords right.
redis_cli($_, 'CONFIG', 'RESETSTAT') for @servers;
my $mark = 0;
$port = nginx_start(site($spw, $dpw), workers => 1);
($st) = http_request($port, 'PUT', '/kv/a', 'one');
is($st, 201, 'both passwords right: a PUT');
is(redis_cli($master, 'GET', '/kv/a'), 'one', 'on the master');
my $body;
($st, $body) = http_request($port, 'GET', '/kv/a');
is("$st $body", '200 one', 'a GET');
($st) = http_request($port, 'PUT', '/off/b', 'two');
is($st, 201, 'cache_pipeline off: a PUT (AUTH on its own connection)');
($st, $body) = http_request($port, 'GET', '/off/b');
is("$st $body", '200 two', 'and a GET');
like(nginx_error_log(), qr/\[notice\].*master of sentinel set "m" of upstream "ha" is 127\.0\.0\.1:$master->{port}/,
    'the master the Sentinels name is confirmed');
cmp_ok(calls($master, 'role'), '>=', 1, 'the master was asked ROLE');
is(calls($replicas->[0], 'role') + calls($replicas->[1], 'role'), 0, 'no replica was (none was named master)');
cmp_ok(foreign_clients($master), '>=', 1, 'the master has nginx\'s connection');
unlike(nginx_error_log(), qr/cannot be reached|NOAUTH|WRONGPASS/, 'no refusal on either side');

# SENTINEL FAILOVER: the watches (SUBSCRIBE after AUTH on each Sentinel)
# hear it, and the promoted replica is checked with the data password.
$mark = length nginx_error_log();
is(redis_cli($sentinels[0], 'SENTINEL', 'FAILOVER', 'm'), 'OK', 'SENTINEL FAILOVER');
my $new;
ok(wait_until(sub {
    ($new) = substr(nginx_error_log(), $mark) =~ /switched from 127\.0\.0\.1:$master->{port} to 127\.0\.0\.1:(\d+)/;
    defined $new;
}, 20), 'the switch is followed');
ok($new && $new != $master->{port} && $by_port{$new}, 'to a replica of the set');
($st) = http_request($port, 'PUT', '/kv/c', 'three');
is($st, 201, 'a PUT after the switch');
is($new && redis_cli($by_port{$new}, 'GET', '/kv/c'), 'three', 'on the new master');
is($new && redis_cli($by_port{$new}, 'GET', '/kv/a'), 'one', 'which has the write from before');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]|NOAUTH|WRONGPASS/, 'no alert, no refusal');
stop_nginx();

# 3. A wrong cache_auth: the Sentinels answer, the master they name
# refuses the check's AUTH, so no master is confirmed.
$port = nginx_start(site($spw, 'not-the-password'), workers => 1);
$t = time;
($st, undef, $head) = http_request($port, 'PUT', '/kv/d', 'four');
$took = time - $t;
is($st, 503, 'a wrong cache_auth: 503');
like($head, qr/\r\nRetry-After: 1\b/i, 'with Retry-After');
cmp_ok($took, '<', stretch(2.5), sprintf('after cache_connect_timeout (1 s), not longer (%.2f s)', $took));
like(nginx_error_log(), qr/\[info\].*127\.0\.0\.1:$new, named master of sentinel set "m" of upstream "ha", is not confirmed: AUTH was refused: WRONGPASS/,
    'the log says the master named refused AUTH');
unlike(nginx_error_log(), qr/cannot be reached/, 'the Sentinels were reached');
is($new && redis_cli($by_port{$new}, 'EXISTS', '/kv/d'), '0', 'nothing was written');
unlike(nginx_error_log(), qr/\[(alert|emerg|crit)\]|exited on signal/, 'no alert, no crash');
stop_nginx();

done_testing();
