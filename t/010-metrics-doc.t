# docs/status.md against what gateway_status says: after traffic through
# every kind of location (queries, a JWT, cache commands, the three sources
# of server-sent events), every family, label name and label value that a
# scrape shows is in the page's tables, and every family and enumerated
# value that the page lists shows up.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(http_request nginx_start start_redis redis_cli psql wait_until start_sentinel stretch);
use SseClient qw(open_sse pump subscribed);
use SessionJwt qw(write_secret hs256_token);
use File::Temp qw(tempdir);
use Socket ();
use Test::More;

# The page's tables: the metrics (name, type, labels) and the values of the
# labels that have a fixed set of them.
my (%doc_type, %doc_labels, %doc_values);
{
    open my $fh, '<', 'docs/status.md' or die "docs/status.md: $!";
    my $section = '';
    while (my $l = <$fh>) {
        $section = $1 if $l =~ /^#+\s+(.*?)\s*$/;
        next unless $l =~ /^\|/ && $l !~ /^\|\s*-/;
        my @cells = map { s/^\s+|\s+$//gr } split /\|/, $l;
        shift @cells;
        if ($section eq 'Metrics' && $cells[0] =~ /^`ngx_gateway_/) {
            my @names = $cells[0] =~ /`(ngx_gateway_\w+)`/g;
            my @labels = $cells[2] eq '—' ? () : map { s/^\s+|\s+$//gr } split /,/, $cells[2];
            for my $n (@names) {
                $doc_type{$n} = $cells[1];
                $doc_labels{$n} = join ',', sort @labels;
            }
        } elsif ($section eq 'Label values' && $cells[0] =~ /^`(\w+)`$/) {
            my $label = $1;
            # label | values (listed one by one, or none for a label whose
            # values the last column describes) | what
            my @values = $cells[1] =~ /`([^`]*)`/g;
            $doc_values{$label} = { map { ($_ => 1) } @values } if @values;
        }
    }
}
cmp_ok(scalar(keys %doc_type), '>=', 10, 'docs/status.md lists the metrics');
ok($doc_values{$_}, "docs/status.md lists the values of \"$_\"") for qw(command source state reason);

my $redis = start_redis();
# A Sentinel set: a master and its replica, one Sentinel (a failover below).
my @fast = ('--repl-diskless-sync-delay', '0');
my $ha_master = start_redis(args => [@fast]);
my $ha_replica = start_redis(args => [@fast, '--replicaof', '127.0.0.1', $ha_master->{port}]);
wait_until(sub { redis_cli($ha_replica, 'INFO', 'replication') =~ /master_link_status:up/ }, 20)
    or BAIL_OUT('the replica did not sync');
my $sentinel = start_sentinel($ha_master->{port}, quorum => 1);
my $dir = tempdir('ngx-gateway-metrics-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $dir;
my $secret = 'a secret of more than thirty-two bytes, for the metrics page';
write_secret($dir, $secret);
psql(<<'SQL');
do $$ begin
  if not exists (select from pg_roles where rolname = 'metrics_user') then create role metrics_user nologin; end if;
end $$;
grant metrics_user to gateway;
SQL
my $port = nginx_start(<<"HTTP");
upstream database { sqldb_server \$TEST_NGINX_PG_SERVER; }
upstream redis { server 127.0.0.1:$redis->{port}; keepalive 4; }
upstream ha { cache_sentinel m; server 127.0.0.1:$sentinel->{port}; }
server {
    listen 127.0.0.1:\$PORT;
    location = /metrics { gateway_status; }
    location = /one { sqldb_pass database; sqldb_output value; sqldb_query GET "select 1"; }
    location = /bad { sqldb_pass database; sqldb_query "select * from no_such_table"; }
    location = /sleep { sqldb_pass database; sqldb_result_timeout 200ms; sqldb_query "select pg_sleep(5)"; }
    location = /me {
        sqldb_pass database; sqldb_jwt_key $dir/secret alg=HS256; sqldb_output value;
        sqldb_query GET "select current_user";
    }
    location = /listen { sqldb_pass database; sqldb_listen metrics_doc; }
    location /kv/ { set \$cache_key \$uri; cache_pass redis; }
    location = /pub { cache_pass redis; cache_publish news; }
    location = /sub { cache_pass redis; cache_subscribe news; }
    location = /add { cache_pass redis; cache_stream_add orders; }
    location = /orders { cache_pass redis; cache_stream orders; }
    location /ha/ { set \$cache_key \$uri; cache_pass ha; }
}
HTTP

sub request { http_request($port, @_) }

# Queries: 200, 405 (no upstream chosen), 500, 504 with a cancel, a token.
is((request('GET', '/one'))[0], 200, 'a query');
is((request('POST', '/one'))[0], 405, 'a method no query has');
is((request('GET', '/bad'))[0], 500, 'a failing query');
is((request('GET', '/sleep'))[0], 504, 'a query past its timeout');
is(join(' ', (request('GET', '/me', undef, 'Authorization: Bearer ' . hs256_token($secret, 'ann', 'metrics_user')))[0, 1]),
    '200 metrics_user', 'a request with a token');
# A session the server ends: the next query reconnects.
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'ngx_gateway'");
ok(wait_until(sub { (request('GET', '/one'))[0] == 200 && scrape() =~ /^ngx_gateway_sqldb_reconnects_total\{/m }, 5),
    'a reconnect after pg_terminate_backend');

# Cache commands: SET, GET (hit, miss), DEL, a method no command has.
is((request('PUT', '/kv/a', 'value'))[0], 201, 'PUT');
is((request('GET', '/kv/a'))[0], 200, 'GET of a key');
is((request('GET', '/kv/none'))[0], 404, 'GET of no key');
is((request('DELETE', '/kv/a'))[0], 204, 'DELETE');
is((request('OPTIONS', '/kv/a'))[0], 405, 'OPTIONS');

# A Sentinel set's master, and a switch to its replica.
is((request('PUT', '/ha/a', 'value'))[0], 201, 'PUT to the master a Sentinel names');
ok(wait_until(sub { redis_cli($sentinel, 'SENTINEL', 'replicas', 'm') =~ /$ha_replica->{port}/ }, 20),
    'the Sentinel knows the replica');
redis_cli($sentinel, 'SENTINEL', 'FAILOVER', 'm');
ok(wait_until(sub {
    request('GET', '/ha/a');
    scrape() =~ /^ngx_gateway_cache_sentinel_switches_total\{upstream="ha",set="m"\} 1$/m;
}, 30), 'a switch of master');

# The three sources of events, each with a subscriber that gets an event
# and one that leaves.
my @subs = (open_sse($port, '/listen'), open_sse($port, '/sub'), open_sse($port, '/orders'));
pump(\@subs, 5, subscribed(@subs));
is(scalar(grep { $_->{buf} =~ /: subscribed/ } @subs), 3, 'a subscriber of each source');
psql("notify metrics_doc, 'x'");
is((request('POST', '/pub', 'x'))[0], 200, 'PUBLISH');
is((request('POST', '/add?event=created', 'x'))[0], 201, 'XADD');
pump(\@subs, 5, sub { !grep { $_->{buf} !~ /\ndata: x\n/ } @subs });
is(scalar(grep { $_->{buf} =~ /\ndata: x\n/ } @subs), 3, 'each gets its event');
close $_->{s} for @subs;

# A subscriber that never reads (a small receive window), more than a
# megabyte behind for a second: dropped at the next event.
socket(my $slow, Socket::PF_INET(), Socket::SOCK_STREAM(), 0) or die $!;
setsockopt($slow, Socket::SOL_SOCKET(), Socket::SO_RCVBUF(), 4096) or die $!;
connect($slow, Socket::pack_sockaddr_in($port, Socket::inet_aton('127.0.0.1'))) or die $!;
syswrite($slow, "GET /listen HTTP/1.1\r\nHost: x\r\n\r\n");
# It reads until the channel is listened to (": subscribed"; notifications
# before that are not its), then no more.
my $slow_sub = { s => $slow, buf => '' };
pump([$slow_sub], stretch(5), subscribed($slow_sub));
like($slow_sub->{buf}, qr/: subscribed/, 'a subscriber that does not read');
psql("select pg_notify('metrics_doc', g || repeat('y', 7900)) from generate_series(1, 1000) g");
ok(wait_until(sub {
    psql("notify metrics_doc, 'more " . time . "'");
    scrape() =~ /^ngx_gateway_subscribers_dropped_total\{source="sqldb_listen",reason="behind"\} 1$/m;
}, 10), 'is dropped') or diag(join "\n", grep { /subscri|events/ } split /\n/, scrape());
close $slow;

# Every series that shows up, parsed; after the streams that ended are in.
my %seen;    # family => { labels => "a,b", type => ..., values => { label => { value => 1 } } }
sub scrape { (request('GET', '/metrics'))[1] }
my $text;
ok(wait_until(sub {
    $text = scrape();
    $text =~ /^ngx_gateway_subscribers\{source="cache_stream"\} 0$/m
        && $text =~ /^ngx_gateway_subscribers\{source="sqldb_listen"\} 0$/m
        && $text =~ /^ngx_gateway_subscribers\{source="cache_subscribe"\} 0$/m
        && $text =~ /command="XREAD"/ && $text =~ /command="SUBSCRIBE"/;
}, 10), 'the streams have ended and are counted') or diag($text);

my %type;
for my $l (split /\n/, $text) {
    if ($l =~ /^# TYPE (\S+) (\S+)$/) { $type{$1} = $2; next }
    next if $l =~ /^#/ || $l !~ /\S/;
    my ($name, $labels) = $l =~ /^(\w+)(?:\{(.*)\})? \S+$/ or do { fail("a line of the scrape: $l"); next };
    my $family = $name;
    $family =~ s/_(bucket|sum|count)$// if !exists $type{$name};
    my %l;
    while (($labels // '') =~ /(\w+)="((?:[^"\\]|\\.)*)"/g) { $l{$1} = $2 }
    delete $l{le} if $name =~ /_bucket$/;
    $seen{$family}{labels}{ join ',', sort keys %l } = 1;
    $seen{$family}{values}{$_}{ $l{$_} } = 1 for keys %l;
}

for my $f (sort keys %seen) {
    ok(exists $doc_type{$f}, "$f is in docs/status.md") or next;
    is($type{$f}, $doc_type{$f}, "$f: the type the page gives");
    is(join(' | ', sort keys %{ $seen{$f}{labels} }), $doc_labels{$f}, "$f: the labels the page gives");
    for my $label (sort keys %{ $seen{$f}{values} }) {
        next unless $doc_values{$label};
        my @undocumented = grep { !$doc_values{$label}{$_} } sort keys %{ $seen{$f}{values}{$label} };
        is("@undocumented", '', "$f: each value of \"$label\" is on the page");
    }
}
ok($seen{$_}, "$_, on the page, shows up") for sort keys %doc_type;

# Each listed value shows up (a subscriber dropped past the worker's bound
# is t/006-sse-bounds.t's to make; one whose connection failed, no test's).
my %elsewhere = (reason => { buffers_max => 1, error => 1 });
for my $label (sort keys %doc_values) {
    my %any = map { %{ $seen{$_}{values}{$label} // {} } } keys %seen;
    my @missing = grep { !$any{$_} && !$elsewhere{$label}{$_} } sort keys %{ $doc_values{$label} };
    is("@missing", '', "each value of \"$label\" that the page lists shows up");
}

# A stream's lifetime is not a request duration.
unlike($text, qr/^ngx_gateway_cache_request_duration_seconds_\w+\{[^}]*command="(?:XREAD|SUBSCRIBE)"/m,
    'no cache request duration of a stream');

# The content type the page gives.
my (undef, undef, $head) = request('GET', '/metrics');
my ($ctype) = $head =~ /^Content-Type: (.*?)\r?$/mi;
open my $fh, '<', 'docs/status.md' or die $!;
my $page = do { local $/; <$fh> };
like($page, qr/\Q(`Content-Type: $ctype`)\E/, "the page gives the content type ($ctype)");

# docs/monitoring.md's panels and alert rules name documented series and
# labels only (and promtool, where it is installed, takes them).
open my $mon, '<', 'docs/monitoring.md' or die $!;
my $monitoring = do { local $/; <$mon> };
my @panels = map { $_->[0] } map { [/^\|[^|]+\| `(.+)` \|$/] } grep { /^\| .* \| `.*ngx_gateway_.*` \|$/ } split /\n/, $monitoring;
my ($rules) = $monitoring =~ /## Alert rules\n\n```yaml\n(.*?)```/s;
cmp_ok(scalar(@panels), '>=', 5, 'docs/monitoring.md has panels');
ok($rules, 'docs/monitoring.md has alert rules');
my @exprs = (@panels, $rules =~ /expr: (?:\|\n)?((?:(?!\n\s+\w+:).)+)/sg);
my %allowed_extra = map { ($_ => 1) } qw(le instance job);
for my $e (@exprs) {
    for my $name ($e =~ /\b(ngx_gateway_\w+)/g) {
        my $family = $doc_type{$name} ? $name : $name =~ s/_(bucket|sum|count)$//r;
        ok($doc_type{$family}, "a query names $name, a documented series") or next;
    }
    my @names = map { $doc_type{$_} ? $_ : s/_(bucket|sum|count)$//r } $e =~ /\b(ngx_gateway_\w+)/g;
    my %labels = map { ($_ => 1) } map { split /,/, $doc_labels{$_} // '' } @names;
    my @used = ($e =~ /\bby \(([^)]*)\)/g, $e =~ /[{,]\s*(\w+)\s*(?:=~|!~|!=|=)"/g);
    my @unknown = grep { !$labels{$_} && !$allowed_extra{$_} } map { split /\s*,\s*/ } @used;
    is("@unknown", '', "the labels of a query are those of its series: " . substr($e, 0, 60));
}
SKIP: {
    my $promtool = `command -v promtool 2>/dev/null`;
    chomp $promtool;
    skip 'promtool is not installed', 2 unless $promtool;
    my $tmp = tempdir('ngx-gateway-promtool-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    open my $fh, '>', "$tmp/alerts.yml" or die $!;
    print $fh $rules;
    close $fh;
    my $out = `$promtool check rules $tmp/alerts.yml 2>&1`;
    is($?, 0, 'promtool takes the alert rules') or diag($out);
    open $fh, '>', "$tmp/panels.yml" or die $!;
    print $fh "groups:\n  - name: panels\n    rules:\n";
    my $i = 0;
    for my $q (@panels) { $i++; print $fh "      - record: panel_$i\n        expr: '" . ($q =~ s/'/''/gr) . "'\n" }
    close $fh;
    $out = `$promtool check rules $tmp/panels.yml 2>&1`;
    is($?, 0, 'promtool takes the panels\' queries') or diag($out);
}

done_testing();
