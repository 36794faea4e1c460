# The browser example of nginx-conf/ (events.conf included as it is,
# events.html and outbox.sql) in a real browser: Debian's chromium,
# headless, opens the page, whose EventSource subscribes through
# sqldb_listen with sqldb_listen_replay; the test adds events (rows of the
# outbox, with psql and with POST /send through the gateway) and reads what
# the page shows: every event once, in order, with its id, across a
# pg_terminate_backend of the listening connection, an nginx reload and an
# nginx restart while events keep coming, and PostgreSQL stopped and
# started again; then the same page over a Redis stream (cache_stream),
# across a Redis restart and a reload. Through the DevTools protocol on a pipe
# (--remote-debugging-pipe: JSON messages ended by a NUL byte, the browser
# reads fd 3 and writes fd 4). Skipped only when chromium cannot start.
use strict;
use warnings;
# (Interrupted, even while PostgreSQL starts, the END blocks still run:
# chromium, nginx and PostgreSQL go.)
BEGIN { $SIG{INT} = $SIG{TERM} = sub { die "interrupted by SIG$_[0]\n" } }
use lib 't/lib';
use GatewayTest qw(http_request wait_until nginx_start stop_nginx nginx_error_log psql start_redis kill_redis);
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
    # Whatever is left of its process group (the browser, its helpers),
    # and helpers of this profile that left the group (a busy machine may
    # not have let them see the browser go yet).
    kill 'KILL', -$chrome_pid;
    waitpid($chrome_pid, 0);
    kill 'KILL', profile_procs();
    $chrome_pid = undef;
}

# The processes that run with this test's browser profile.
sub profile_procs {
    grep { index(`cat /proc/$_/cmdline 2>/dev/null`, "--user-data-dir=$tmp/profile") >= 0 }
        map { m{/(\d+)$} } glob '/proc/[0-9]*';
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
# The page's outbox, as `make run` makes it.
{
    open my $fh, '<', "$conf_dir/outbox.sql" or die $!;
    local $/;
    psql(<$fh>);
    psql('grant select, insert on outbox to gateway; grant usage on sequence outbox_id_seq to gateway');
}
my $server = GatewayTest::pg_server_line('browser');
my $redis = start_redis();
my $rport = $redis->{port};
my $conf = <<"HTTP";
upstream demo_db { sqldb_server $server; }
upstream demo_redis { server 127.0.0.1:$rport; }
server {
    listen 127.0.0.1:\$PORT;
    root $tmp;
    include $conf_dir/events.conf;
}
HTTP
my $port = nginx_start($conf);

my ($st, $body, $head) = http_request($port, 'GET', '/events.html');
is($st, 200, 'the page is served');
like($head, qr{^Content-Type: text/html}mi, 'as text/html');
like($body, qr{new EventSource\(\(redis \? '/stream/' : '/events/'\) \+}, 'with its EventSource');

my $target = cdp('Target.createTarget', { url => "http://127.0.0.1:$port/events.html?room=browser" })->{targetId};
my $session = cdp('Target.attachToTarget', { targetId => $target, flatten => JSON::PP::true })->{sessionId};
my $read_page = q{JSON.stringify({
    state: document.getElementById('state') ? document.getElementById('state').textContent : null,
    room: document.getElementById('room') ? document.getElementById('room').textContent : null,
    last: document.getElementById('last') ? document.getElementById('last').textContent : null,
    items: Array.from(document.querySelectorAll('#log li'), li => [li.className, li.textContent]),
    markup: document.querySelectorAll('#log li :not(.id)').length,
    opens: window.opens
})};
my $page;
sub page {
    my $r = eval { cdp('Runtime.evaluate', { expression => $read_page, returnByValue => JSON::PP::true }, $session) }
        or return $page = { error => $@ };
    return $page = JSON::PP->new->decode($r->{result}{value} // 'null') // {};
}
sub listening {
    psql("select count(*) from pg_stat_activity where application_name = 'browser' and state = 'idle' "
        . "and query = 'LISTEN \"room_browser\"'") > 0;
}

ok(wait_until(sub { (page()->{state} // '') eq 'open' }, 15), 'the page opened its EventSource')
    or diag(explain($page));
is($page->{room}, 'browser', 'on the room of its ?room=');
ok(wait_until(\&listening, 5), 'the gateway listens to the room\'s channel');

# What the page should show: [class, text] of each item.
my @want;
sub insert {
    my ($data) = @_;
    my $id = psql("insert into outbox (channel, data) values ('room_browser', \$q\$$data\$q\$) returning id");
    push @want, ['event', "#$id $data"];
}
sub send_post {
    my ($data) = @_;
    my ($st, $body) = http_request($port, 'POST', '/send/browser', $data);
    is($st, 201, 'POST /send: 201');
    my ($id) = $body =~ /"id":(\d+)/;
    ok($id, "with the new row's id ($body)");
    push @want, ['event', "#$id " . ($data =~ s/\r\n/\n/gr)];
}
# Inserts N rows, one every MS milliseconds, each committed, in a child
# process (events keep coming while the test does something else); the
# rows are pushed to @want once it is done.
sub trickle {
    my ($tag, $n, $ms) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        psql("do \$\$ begin for i in 1..$n loop insert into outbox (channel, data) values ('room_browser', '$tag ' || i); "
            . "commit; perform pg_sleep($ms / 1000.0); end loop; end \$\$");
        POSIX::_exit(0);
    }
    return sub {
        waitpid($pid, 0);
        for (split /\n/, psql("select id || ' ' || data from outbox where data like '$tag %' order by id")) {
            my ($id, $d) = /^(\d+) (.*)$/;
            push @want, ['event', "#$id $d"];
        }
    };
}
# The page shows @want, all of it, in order, once.
sub shows_all {
    my ($name) = @_;
    wait_until(sub { @{ page()->{items} // [] } >= @want }, 15);
    # (A little longer: nothing more may come.)
    sleep 0.3;
    page();
    is_deeply($page->{items}, \@want, $name) or diag(explain([ @{ $page->{items} // [] }[-5 .. -1] ]));
}

insert('first');
send_post('second, through /send');
psql("notify room_other, '1 not for the page'");
insert("line one\nline two\n\nline four");
send_post("also\r\nthrough /send");
send_post('<b>not markup</b> & "quotes"');
insert('café ✓');
utf8::decode($_->[1]) for @want;
shows_all('the page shows every event of its room with its id, in order, multi-line ones whole');
is($page->{markup}, 0, 'payloads are shown as text, never as markup');
is($page->{last}, ($want[-1][1] =~ /^#(\d+)/)[0], 'and the last event id');

# The listening connection is ended while events keep coming: its
# subscribers get what they missed (the outbox replayed), no reconnect note.
my $done = trickle('terminated', 30, 40);
sleep 0.3;
psql("select pg_terminate_backend(pid) from pg_stat_activity where application_name = 'browser' and query like 'LISTEN%'");
$done->();
ok(wait_until(\&listening, 5), 'the gateway listens again');
shows_all('across pg_terminate_backend of the listening connection: every event once, in order');
is($page->{state}, 'open', 'the EventSource stayed open (the stream itself was never cut)');
is($page->{opens}, 1, 'opened once');

# nginx reloads while events keep coming: the old worker ends the stream,
# the page comes back with Last-Event-ID to the new one.
$done = trickle('reloaded', 40, 40);
sleep 0.3;
GatewayTest::nginx_signal('HUP');
$done->();
ok(wait_until(sub { (page()->{opens} // 0) >= 2 && $page->{state} eq 'open' }, 15), 'after a reload the page opened its stream again')
    or diag(explain($page));
shows_all('across nginx -s reload: every event once, in order');

# The gateway stops, events are added meanwhile, and it starts again on the
# same port: the page resumes.
stop_nginx();
ok(wait_until(sub { (page()->{state} // '') eq 'reconnecting' }, 10), 'while nginx is stopped, the page is reconnecting')
    or diag(explain($page));
insert("while nginx was stopped $_") for 1 .. 5;
$port = nginx_start($conf, port => $port);
ok(wait_until(sub { (page()->{opens} // 0) >= 3 && $page->{state} eq 'open' }, 15), 'once it is back, the page opened its stream again')
    or diag(explain($page));
insert('after the restart');
shows_all('across a restart of nginx: every event once, in order');

# PostgreSQL stops: the page hears that the database cannot be reached;
# once it is back, what was added meanwhile (here: nothing) and after.
GatewayTest::pg_stop();
push @want, ['note', '(the database cannot be reached; waiting for it)'];
shows_all('the page says when the database cannot be reached');
GatewayTest::pg_start();
ok(wait_until(\&listening, 10), 'the gateway listens again once PostgreSQL is back');
insert('after PostgreSQL came back');
shows_all('and goes on once it is back, nothing lost, no reconnect note');

($st) = http_request($port, 'GET', '/send/browser');
is($st, 405, 'GET /send: 405');
($st) = http_request($port, 'GET', '/events/not-a-room');
is($st, 404, 'a room that is not a name: 404 (no channel of another application)');
($st) = http_request($port, 'GET', '/events/browser', undef, 'Last-Event-ID: x');
is($st, 400, 'a Last-Event-ID that is not an id: 400');

# The same page over a Redis stream (?source=redis): entries with their
# IDs, every one once, in order, across a Redis restart (entries added
# right after it, before the gateway reads again, too) and an nginx reload
# while entries keep coming.
$target = cdp('Target.createTarget', { url => "http://127.0.0.1:$port/events.html?room=browser&source=redis" })->{targetId};
$session = cdp('Target.attachToTarget', { targetId => $target, flatten => JSON::PP::true })->{sessionId};
@want = ();
ok(wait_until(sub { (page()->{state} // '') eq 'open' && $page->{opens} == 1 }, 15), 'the Redis page opened its EventSource')
    or diag(explain($page));
sleep 0.5;    # (its first read of the stream)
sub add_entry {
    my ($data) = @_;
    my ($st, $body) = http_request($port, 'POST', '/stream-send/browser', $data);
    my ($id) = $body =~ /"id":"(\d+-\d+)"/;
    return 0 unless $st == 201 && $id;
    push @want, ['event', "#$id $data"];
    return 1;
}
is(scalar(grep { add_entry("entry $_") } 1 .. 5), 5, 'POST /stream-send: 201 with the entry\'s ID, five times');
shows_all('the Redis page shows every entry with its ID, in order');
kill_redis($redis);
push @want, ['note', '(Redis cannot be reached; waiting for it)'];
shows_all('while Redis is down, the page says so');
$redis = start_redis(port => $rport);
is(scalar(grep { add_entry("after the restart $_") } 1 .. 5), 5, 'entries are added at once after the restart');
shows_all('across a Redis restart: every entry once, in order');
is($page->{state}, 'open', 'the stream itself was never cut');
# Entries keep coming (a child process, every 40 ms) while nginx reloads.
my $file = "$tmp/added";
my $pid = fork // die "fork: $!";
if (!$pid) {
    open my $out, '>', $file or POSIX::_exit(1);
    for my $i (1 .. 40) {
        my ($st, $body) = eval { http_request($port, 'POST', '/stream-send/browser', "reloaded $i") };
        print $out "$1 reloaded $i\n" if ($st // 0) == 201 && $body =~ /"id":"(\d+-\d+)"/;
        sleep 0.04;
    }
    close $out;
    POSIX::_exit(0);
}
sleep 0.3;
GatewayTest::nginx_signal('HUP');
waitpid($pid, 0);
open my $added, '<', $file or die $!;
my $n = 0;
while (<$added>) {
    chomp;
    my ($id, $d) = /^(\S+) (.*)$/;
    push @want, ['event', "#$id $d"];
    $n++;
}
cmp_ok($n, '>=', 35, "the entries were added across the reload ($n of 40)");
ok(wait_until(sub { (page()->{opens} // 0) >= 2 && $page->{state} eq 'open' }, 15), 'after the reload the Redis page opened its stream again')
    or diag(explain($page));
shows_all('across nginx -s reload: every entry once, in order');

unlike(nginx_error_log(), qr/\[(alert|emerg)\]|exited on signal/, 'no alert, no worker died');

my $group = $chrome_pid;
stop_chromium();
sub chromium_left {
    my %left = map { $_ => 1 } profile_procs();
    for (glob '/proc/[0-9]*') {
        my ($pid) = m{/(\d+)$};
        $left{$pid} = 1 if `cat /proc/$pid/stat 2>/dev/null` =~ /\) \S+ \d+ (\d+) / && $1 == $group;
    }
    return keys %left;
}
ok(wait_until(sub { !chromium_left() }, 5), 'chromium and its helpers are gone')
    or diag(join "\n", map { scalar `ps -o pid,stat,args -p $_` } chromium_left());

done_testing();
