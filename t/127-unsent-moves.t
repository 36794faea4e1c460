# Requests that waited on a connection which the request before them left
# inside a transaction (a bare `begin`, a template whose insert failed
# between its begin and commit) were never sent: they move to another
# connection of the same server, from the pool. That is no failure of the
# server: no 502, no "no live upstreams", max_fails untouched (no 10 s
# outage), with or without sqldb_next_upstream, with overflow=reject; and
# the request that failed gets its own 500. (Found by outside testing.)
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read http_get psql stretch);
use Test::More;
use Time::HiRes qw(sleep time);

my $server = GatewayTest::pg_server_line('unsent');
# The same server under another name: 127.1 is 127.0.0.1 (inet_aton's short
# form, resolved when nginx reads it), whatever /etc/hosts says of localhost.
(my $other = $server) =~ s/^127\.0\.0\.1:/127.1:/;
psql('drop table if exists unsent_log');
psql('create table unsent_log (id serial, v text unique)');
psql('grant select, insert on unsent_log to gateway; grant usage on sequence unsent_log_id_seq to gateway');
psql("insert into unsent_log (v) values ('taken')");

# The defaults (10 s to connect, queue included; 30 s for a result), as
# long again as everything else under valgrind: 120 requests wait for two
# connections.
my ($connect_s, $result_s) = (stretch(10), stretch(30));
my $port = nginx_start(<<"HTTP");
upstream two {
    sqldb_server $server;
    sqldb_server $other;
    sqldb_keepalive max=2;
}
upstream reject {
    sqldb_server $server;
    sqldb_server $other;
    sqldb_keepalive max=2 overflow=reject;
}
upstream one {
    sqldb_server $server;
    sqldb_keepalive max=2;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_connect_timeout ${connect_s}s;
    sqldb_result_timeout ${result_s}s;
    location ~ ^/(\\w+)/ins\$ { sqldb_pass \$1; sqldb_output value; sqldb_query "insert into unsent_log (v) values (\$arg_v::text) returning v"; }
    location ~ ^/(\\w+)/insnn\$ { sqldb_pass \$1; sqldb_next_upstream off; sqldb_output value; sqldb_query "insert into unsent_log (v) values (\$arg_v::text) returning v"; }
    location ~ ^/(\\w+)/begin\$ { sqldb_pass \$1; sqldb_output none; sqldb_query "begin"; }
    location ~ ^/(\\w+)/txfail\$ { sqldb_pass \$1; sqldb_output none; sqldb_query "begin; insert into unsent_log (v) values ('taken'); commit"; }
    location = /metrics { gateway_status; }
    location ~ ^/(\\w+)/pid\$ { sqldb_pass \$1; sqldb_output value; sqldb_query "select pg_backend_pid()::text"; }
}
HTTP

# Many requests at once: inserts of unique values among begins and failing
# transactions; each insert must answer 200 and leave exactly its row.
my $round = 0;
sub mix {
    my ($up, $ins, $n) = @_;
    $round++;
    my (@s, @kind);
    for my $i (1 .. $n) {
        my $kind = $i % 5 == 0 ? 'begin' : $i % 7 == 0 ? 'txfail' : $ins;
        my $path = $kind eq $ins ? "/$up/$ins?v=r$round-$i" : "/$up/$kind";
        push @s, http_send($port, $path);
        push @kind, $kind;
    }
    my %codes;
    my @got = map { [http_read($_, 20)] } @s;
    for my $i (0 .. $#got) {
        $codes{"$kind[$i] $got[$i][0]"}++;
    }
    return \%codes;
}

for my $case (['two', 'ins'], ['one', 'insnn'], ['reject', 'ins']) {
    my ($up, $ins) = @$case;
    my $before = length nginx_error_log();
    my $codes = mix($up, $ins, 120);
    my $txfails = grep { $_ % 7 == 0 && $_ % 5 != 0 } 1 .. 120;
    if ($up eq 'reject') {
        # overflow=reject: what the pool cannot take now is 503, never 502.
        is_deeply([grep { !/ (200|500|503)$/ } keys %$codes], [], "$up: only 200, 500 and 503")
            or diag(explain($codes));
        is(($codes->{'txfail 500'} // 0) + ($codes->{'txfail 503'} // 0), $txfails,
            "$up: each failed transaction gets its own 500 (or 503 when no connection was free)");
    } else {
        my @ins_codes = grep { /^$ins / } keys %$codes;
        is_deeply([sort @ins_codes], ["$ins 200"], "$up/$ins: every insert among begins and failed transactions answers 200")
            or diag(explain($codes));
        is($codes->{'txfail 500'} // 0, $txfails, "$up: each failed transaction gets its own 500") or diag(explain($codes));
    }
    my $rows = psql("select count(*) from unsent_log where v like 'r$round-%'");
    is($rows, $codes->{"$ins 200"} // 0, "$up: one row per insert answered 200");
    my $log = substr(nginx_error_log(), $before);
    unlike($log, qr/no live upstreams|temporarily disabled/, "$up: no \"no live upstreams\", no server disabled");
    # The servers were not marked failed: the upstream serves again at
    # once, not after fail_timeout (10 s). (With overflow=reject a request
    # in the instant the burst's connections still settle may get 503, the
    # documented answer of a full pool: it is asked again.)
    my $t0 = time;
    my $st;
    for (1 .. 40) {
        ($st) = http_get($port, "/$up/pid");
        last if $st == 200 || $up ne 'reject' || $st != 503;
        sleep 0.05;
    }
    is($st, 200, "$up: the next request is served");
    cmp_ok(time - $t0, '<', stretch(5), "$up: at once (no server taken out for fail_timeout, 10 s)");
}

like(nginx_error_log(), qr/\[info\].*sqldb: connection to \S+ closes: the connection was left inside a transaction block; \d+ request\(s\) that waited on it move to another connection/,
    'the connection says once why its waiting requests moved');
# Connections the gateway closed itself (left inside a transaction) are no
# lost connections: no reconnect is counted.
my (undef, $metrics) = http_get($port, '/metrics');
unlike($metrics, qr/^ngx_gateway_sqldb_reconnects_total\{.*\} [1-9]/m, 'no reconnects counted');
like($metrics, qr/^ngx_gateway_sqldb_connects_total\{.*\} [1-9]/m, 'while connections were opened');
unlike(nginx_error_log(), qr/\[(alert|emerg)\]/, 'no alert');
stop_nginx();

done_testing();
