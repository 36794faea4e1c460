# Streaming keeps the worker's memory flat: 1,000,000 rows to a fast
# client and to a slow one (reading pauses while the client catches up).
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx nginx_error_log http_send http_read nginx_workers proc_status_kb under_valgrind);
use Test::More;
use Time::HiRes qw(sleep time);

my $port = nginx_start(<<'HTTP', workers => 1);
upstream database { sqldb_server $TEST_NGINX_PG_SERVER; }
server {
    listen 127.0.0.1:$PORT;
    location /rows {
        sqldb_pass database;
        sqldb_stream on;
        sqldb_result_timeout 60s;
        sqldb_query "select g as id, 'item ' || g as label from generate_series(1, $arg_n::int) g";
    }
}
HTTP

my ($worker) = nginx_workers();
# Under valgrind: 100,000 rows (a million would take most of an hour), the
# same paths through the stream, and no memory bounds (the worker's RSS is
# valgrind's: shadow memory, its own heap).
my $rows = under_valgrind() ? 100_000 : 1_000_000;
my $vg = 'under valgrind: the worker\'s RSS is valgrind\'s';

# RDS size of n rows of (int, 'item N').
sub rds_size {
    my $n = shift;
    my $size = 28 + 2 + (6 + 2) + (6 + 5) + 1;
    $size += 1 + 4 + length($_) + 4 + length("item $_") for 1 .. $n;
    return $size;
}

my $before = proc_status_kb($worker, 'VmHWM');
my $t0 = time;
my ($st, $body) = http_read(http_send($port, "/rows?n=$rows"), 120);
is($st, 200, "$rows rows streamed");
# The chunked framing is still in the body (the helper does not decode it).
cmp_ok(length($body), '>', rds_size($rows), 'all of them arrived');
my $grew = proc_status_kb($worker, 'VmHWM') - $before;
SKIP: {
    skip $vg, 1 if under_valgrind();
    cmp_ok($grew, '<', 12_000, "worker peak memory grew by $grew kB (the whole result is 25 MB)");
}
diag(sprintf('%d rows in %.2f s, peak RSS %d kB', $rows, time - $t0, proc_status_kb($worker, 'VmHWM')));

# A slow client: reads a little, now and then, for two seconds.
my $s = http_send($port, "/rows?n=$rows");
my $got = 0;
for (1 .. 20) {
    sysread($s, my $buf, 32 * 1024) or last;
    $got += length $buf;
    sleep 0.1;
}
my $mid = proc_status_kb($worker, 'VmRSS');
my $deadline = time + 120;
while (time < $deadline) {
    my $n = sysread($s, my $buf, 1024 * 1024);
    last unless $n;
    $got += $n;
}
close $s;
cmp_ok($got, '>', rds_size($rows), 'the slow client got all of it too');
SKIP: {
    skip $vg, 1 if under_valgrind();
    cmp_ok(proc_status_kb($worker, 'VmHWM') - $before, '<', 12_000, "memory stayed flat while the client lagged (RSS $mid kB)");
}
unlike(nginx_error_log(), qr/\[alert\]|\[crit\]|\[error\]|exited on signal/, 'no error, no crash');
stop_nginx();
done_testing();
