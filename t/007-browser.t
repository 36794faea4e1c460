# The browser example of nginx-conf/ (events.conf included as it is, and
# events.html) in a real browser: Debian's chromium, headless, opens the
# page, whose EventSource subscribes through sqldb_listen; the test sends
# notifications (psql, and POST /notify through the gateway) and reads what
# the page shows, through the DevTools protocol on a pipe
# (--remote-debugging-pipe: JSON messages ended by a NUL byte, the browser
# reads fd 3 and writes fd 4). Skipped only when chromium cannot start.
use strict;
use warnings;
# (Interrupted, even while PostgreSQL starts, the END blocks still run:
# chromium, nginx and PostgreSQL go.)
BEGIN { $SIG{INT} = $SIG{TERM} = sub { die "interrupted by SIG$_[0]\n" } }
use lib 't/lib';
use GatewayTest qw(http_request wait_until nginx_start stop_nginx nginx_error_log psql);
use Cwd qw(getcwd);
use File::Copy qw(copy);
use File::Temp qw(tempdir);
use IO::Select;
use JSON::PP ();
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

my $json = JSON::PP->new->utf8->canonical;
my $conf_dir = getcwd() . '/nginx-conf';
my $tmp = tempdir('ngx-gateway-browser-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $tmp;    # nginx's workers (nobody) read the page in it

# --- chromium, and the DevTools protocol on its pipe ---

my ($chrome_pid, $to_chrome, $from_chrome, $inbox) = (undef, undef, undef, '');
my (%answers, $last_id);

sub start_chromium {
    my $bin = (grep { -x } map { "$_/chromium" } split /:/, $ENV{PATH})[0] or return 'no chromium in PATH';
    pipe(my $cmd_r, my $cmd_w) or die $!;
    pipe(my $out_r, my $out_w) or die $!;
    $chrome_pid = fork // die "fork: $!";
    if (!$chrome_pid) {
        # A process group of its own, so that its helper processes go with it.
        POSIX::setpgid(0, 0);
        # (dup first: a pipe's end may already be fd 3 or 4; dup2 onto
        # another number leaves the copy open across exec.)
        my ($r, $w) = (POSIX::dup(fileno $cmd_r), POSIX::dup(fileno $out_w));
        POSIX::dup2($r, 3) // POSIX::_exit(126);
        POSIX::dup2($w, 4) // POSIX::_exit(126);
        open STDIN, '<', '/dev/null';
        open STDOUT, '>>', "$tmp/chromium.log";
        open STDERR, '>>', "$tmp/chromium.log";
        no warnings 'exec';
        exec $bin, '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
            '--disable-dev-shm-usage', '--no-first-run', '--no-default-browser-check', '--disable-extensions',
            "--user-data-dir=$tmp/profile", '--remote-debugging-pipe', 'about:blank';
        POSIX::_exit(127);
    }
    close $cmd_r;
    close $out_w;
    ($to_chrome, $from_chrome) = ($cmd_w, $out_r);
    my $v = eval { cdp('Browser.getVersion', {}, undef, 20) } or return "it did not answer: " . ($@ =~ s/\s+\z//r);
    note("browser: $v->{product}");
    return undef;
}

# Sends one command and waits for its answer; dies on an error or a timeout.
sub cdp {
    my ($method, $params, $session, $timeout) = @_;
    my $id = ++$last_id;
    my %msg = (id => $id, method => $method, params => $params // {});
    $msg{sessionId} = $session if $session;
    my $line = $json->encode(\%msg) . "\0";
    while (length $line) {
        my $n = syswrite($to_chrome, $line) // die "write to chromium: $!\n";
        substr($line, 0, $n) = '';
    }
    my $deadline = time + ($timeout // 10);
    my $sel = IO::Select->new($from_chrome);
    until (exists $answers{$id}) {
        die "no answer to $method\n" if time > $deadline;
        next unless $sel->can_read(0.1);
        my $n = sysread($from_chrome, my $chunk, 65536);
        die "chromium closed its pipe\n" unless $n;
        $inbox .= $chunk;
        while ($inbox =~ s/^([^\0]*)\0//) {
            my $m = $json->decode($1);
            $answers{ $m->{id} } = $m if defined $m->{id};    # (events are not needed)
        }
    }
    my $a = delete $answers{$id};
    die "$method: $a->{error}{message}\n" if $a->{error};
    return $a->{result};
}

sub stop_chromium {
    return unless $chrome_pid;
    eval { cdp('Browser.close', {}, undef, 3) };
    my $deadline = time + 5;
    while (time < $deadline) {
        last if waitpid($chrome_pid, POSIX::WNOHANG()) == $chrome_pid;
        sleep 0.05;
    }
    # Whatever is left of its process group (the browser, its helpers).
    kill 'KILL', -$chrome_pid;
    waitpid($chrome_pid, 0);
    $chrome_pid = undef;
}

END { my $rc = $?; stop_chromium(); $? = $rc }

if (my $why = start_chromium()) {
    my $log = -r "$tmp/chromium.log" ? join(' | ', split /\n/, `tail -3 '$tmp/chromium.log'`) : '';
    stop_chromium();
    plan skip_all => "chromium cannot start: $why" . ($log ? "; its output: $log" : '');
}

# --- nginx with the example ---

copy("$conf_dir/events.html", "$tmp/events.html") or die "copy: $!";
chmod 0644, "$tmp/events.html";
my $server = GatewayTest::pg_server_line('browser');
my $port = nginx_start(<<"HTTP");
upstream demo_db { sqldb_server $server; }
server {
    listen 127.0.0.1:\$PORT;
    root $tmp;
    include $conf_dir/events.conf;
}
HTTP

my ($st, $body, $head) = http_request($port, 'GET', '/events.html');
is($st, 200, 'the page is served');
like($head, qr{^Content-Type: text/html}mi, 'as text/html');
like($body, qr{new EventSource\('/listen\?channel='}, 'with its EventSource');

# The page's tab, and what it shows: the connection's state and the list.
my $target = cdp('Target.createTarget', { url => "http://127.0.0.1:$port/events.html?channel=browser" })->{targetId};
my $session = cdp('Target.attachToTarget', { targetId => $target, flatten => JSON::PP::true })->{sessionId};
my $read_page = q{JSON.stringify({
    state: document.getElementById('state') ? document.getElementById('state').textContent : null,
    channel: document.getElementById('channel') ? document.getElementById('channel').textContent : null,
    items: Array.from(document.querySelectorAll('#log li'), li => [li.className, li.textContent]),
    markup: document.querySelectorAll('#log li *').length
})};
my $page;
sub page {
    # (While the page is still loading there may be no document to ask
    # yet: that reads as an empty page, and the callers ask again.)
    my $r = eval { cdp('Runtime.evaluate', { expression => $read_page, returnByValue => JSON::PP::true }, $session) }
        or return $page = { error => $@ };
    # (A string of characters already: decoded without utf8.)
    return $page = JSON::PP->new->decode($r->{result}{value} // 'null') // {};
}
sub listening {
    psql("select count(*) from pg_stat_activity where application_name = 'browser' and state = 'idle' "
        . "and query = 'LISTEN \"browser\"'") > 0;
}

ok(wait_until(sub { (page()->{state} // '') eq 'open' }, 15), 'the page opened its EventSource')
    or diag(explain($page));
is($page->{channel}, 'browser', 'on the channel of its ?channel=');
ok(wait_until(\&listening, 5), 'the gateway listens to the channel');

# Notifications: psql, and POST /notify (pg_notify through the gateway).
# One of another channel must not show; markup is shown as text.
sub notify_post {
    my ($payload) = @_;
    my ($st) = http_request($port, 'POST', '/notify?channel=browser', $payload);
    is($st, 200, 'POST /notify: 200');
}
psql("notify browser, 'first'");
notify_post('second, through /notify');
psql("notify other, 'not for the page'");
psql(q{select pg_notify('browser', E'line one\nline two\n\nline four')});
notify_post("also\r\nthrough /notify");
notify_post('<b>not markup</b> & "quotes"');
psql(q{select pg_notify('browser', 'café ✓')});

my @want = (
    ['event', 'first'],
    ['event', 'second, through /notify'],
    ['event', "line one\nline two\n\nline four"],
    ['event', "also\nthrough /notify"],
    ['event', '<b>not markup</b> & "quotes"'],
    ['event', "caf\x{e9} \x{2713}"],
);
wait_until(sub { @{ page()->{items} // [] } >= @want }, 10);
is_deeply($page->{items}, \@want, 'the page shows every event of its channel, in order, multi-line ones whole');
is($page->{markup}, 0, 'payloads are shown as text, never as markup');

# The gateway's connection to PostgreSQL is lost and made again: the page
# hears "reconnect", and the events after it.
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'browser'");
push @want, ['reconnect', '(reconnected: events may have been missed)'];
ok(wait_until(sub { @{ page()->{items} // [] } >= @want }, 10), 'the page shows the reconnect')
    or diag(explain($page));
ok(wait_until(\&listening, 5), 'the gateway listens again');
psql("notify browser, 'after the reconnect'");
push @want, ['event', 'after the reconnect'];
wait_until(sub { @{ page()->{items} // [] } >= @want }, 10);
is_deeply($page->{items}, \@want, 'and the events after it');
is($page->{state}, 'open', 'the EventSource is open (the stream itself was never cut)');

# The example's mistakes answer as they should.
($st) = http_request($port, 'GET', '/notify?channel=browser');
is($st, 405, 'GET /notify: 405');
($st) = http_request($port, 'POST', '/notify', 'no channel');
is($st, 500, 'POST /notify without a channel: 500 (pg_notify refuses it)');
($st) = http_request($port, 'GET', '/listen?channel=not-an-identifier');
is($st, 400, '/listen with a channel that is not an identifier: 400');

unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');

# Nothing of chromium is left: no process of its process group, nor one
# with its profile folder (killed ones may take a moment to go).
my $group = $chrome_pid;
stop_chromium();
sub chromium_left {
    grep {
        my $stat = `cat /proc/$_/stat 2>/dev/null`;
        my $cmd = `cat /proc/$_/cmdline 2>/dev/null`;
        ($stat =~ /\) \S+ \d+ (\d+) / && $1 == $group) || index($cmd, "--user-data-dir=$tmp/profile") >= 0;
    } map { m{/(\d+)$} } glob '/proc/[0-9]*';
}
ok(wait_until(sub { !chromium_left() }, 5), 'chromium and its helpers are gone')
    or diag(join "\n", map { scalar `ps -o pid,stat,args -p $_` } chromium_left());

done_testing();
