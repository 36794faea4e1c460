package Test::Nginx::Socket;

# A small runner for .t files written in the data format of openresty's
# Test::Nginx::Socket, built on Debian's Test::Base. It starts nginx in the
# foreground as its own child for every block (no daemon, no reaping by
# PID 1), sends the request over a plain socket and checks the response and
# the error log. Sections: main_config http_config config request
# request_body raw_request more_headers error_code response_headers
# response_headers_like raw_response_headers_like response_body response_body_like
# response_body_unlike error_log no_error_log timeout abort wait must_die init
# ignore_response
# skip_nginx skip_nginx2 (skip_slave is accepted and never skips),
# skip_valgrind ("N: why", skips N tests under valgrind),
# plus Test::Base's SKIP / ONLY / LAST.
#
# With TEST_NGINX_USE_VALGRIND=1 (t/lib/ValgrindCheck.pm) nginx runs under
# valgrind's memcheck, as a single process unless the file asked for
# master_on or more workers; deadlines (start, stop, requests, waits) are
# stretched, except the timeout of a block that aborts on purpose; a block
# whose nginx shows a memory error, a definite leak or a report cut short
# fails once, with valgrind's records in the output.

use strict;
use warnings;

use Test::Base ();
use Test::More ();
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Time::HiRes qw(sleep time);
use File::Path qw(make_path remove_tree);
use File::Temp qw(tempdir);
use File::Basename qw(dirname);
use lib dirname(__FILE__) . '/../../..';    # t/lib
use HttpClient ();
use NginxProcess ();
use ValgrindCheck ();

# A write to a socket the server has closed fails that request (EPIPE)
# instead of killing the test process with SIGPIPE.
$SIG{PIPE} = 'IGNORE';
my $Valgrind = ValgrindCheck::enabled();

our @EXPORT = qw(
    run_tests run_test repeat_each no_diff workers master_on master_off
    log_level no_long_string no_shuffle no_root_location env_to_nginx
    server_port server_root html_dir add_block_preprocessor worker_connections
);

# `use Test::Nginx::Socket 'no_plan';` exports our functions, then lets
# Test::Base export its own (blocks, plan, is, like ...) to the same caller.
sub import {
    my ($class, @args) = @_;
    my $caller = caller;
    no strict 'refs';
    *{"${caller}::$_"} = \&{"${class}::$_"} for @EXPORT;
    @_ = ('Test::Base', @args);
    goto &Test::Base::import;
}

BEGIN { *pass = \&Test::More::pass; *fail = \&Test::More::fail; *ok = \&Test::More::ok;
        *is = \&Test::More::is; *like = \&Test::More::like; *unlike = \&Test::More::unlike;
        *diag = \&Test::More::diag; }

my $RepeatEach   = 1;
my $Workers      = 1;
my $WorkerConnections = 1024;
my $MasterOn     = 1;
my $MasterAsked  = 0;    # master_on / workers > 1 called by the file
my $LogLevel     = 'debug';
my $NoDiff       = 0;
my $NoRootLoc    = 0;
my @EnvToNginx;
my @Preprocessors;

my $Binary   = $ENV{TEST_NGINX_BINARY} || 'nginx';
# nginx's prefix: a folder of its own for each .t file (files may run side by
# side), under the system's temporary folder and open to all, so that the
# workers (nobody, when the suite runs as root) reach it wherever the
# checkout is (a clone in /root, mode 0700, included).
my $ServRoot = $ENV{TEST_NGINX_SERVROOT} || do {
    my $d = tempdir('ngx-gateway-servroot-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $d;
    $d;
};
my $Port     = $ENV{TEST_NGINX_SERVER_PORT} || $ENV{TEST_NGINX_PORT} || NginxProcess::free_port();
$ENV{TEST_NGINX_SERVER_PORT} = $Port;
$ENV{TEST_NGINX_HTML_DIR} = "$ServRoot/html";

sub repeat_each (@) { $RepeatEach = shift if @_; $RepeatEach }
sub workers ($) { $Workers = shift; $MasterAsked = 1 if $Workers > 1 }
sub worker_connections (@) { $WorkerConnections = shift if @_; $WorkerConnections }
sub master_on () { $MasterOn = 1; $MasterAsked = 1 }
sub master_off () { $MasterOn = 0; $MasterAsked = 1 }
sub log_level ($) { $LogLevel = shift }
sub no_diff () { $NoDiff = 1 }
sub no_long_string () { }
sub no_shuffle () { }
sub no_root_location () { $NoRootLoc = 1 }
sub env_to_nginx (@) { push @EnvToNginx, @_ }
sub server_port () { $Port }
sub server_root () { $ServRoot }
sub html_dir () { "$ServRoot/html" }
sub add_block_preprocessor (&) { push @Preprocessors, shift }

# $TEST_NGINX_FOO in configuration text becomes the environment's value.
sub expand_env ($) {
    my $s = shift;
    return '' unless defined $s;
    $s =~ s/\$(TEST_NGINX_[_A-Z0-9]+)/defined $ENV{$1} ? $ENV{$1} : die "environment variable $1 is not set\n"/ge;
    return $s;
}

sub section ($$) {
    my ($block, $name) = @_;
    my @v = $block->$name;
    return undef unless @v && defined $v[0];
    return @v > 1 ? [@v] : $v[0];
}

sub write_config ($) {
    my $block = shift;
    remove_tree($ServRoot);
    make_path("$ServRoot/conf", "$ServRoot/logs", "$ServRoot/html", "$ServRoot/tmp");
    chmod 0755, $ServRoot, map { "$ServRoot/$_" } qw(conf logs html tmp);    # whatever the umask
    my $modules = '';
    for my $m (split /[\s:]+/, $ENV{TEST_NGINX_LOAD_MODULES} || '') {
        $modules .= "load_module $m;\n" if length $m;
    }
    my $env = join '', map { "env $_;\n" } @EnvToNginx;
    my $main = expand_env($block->main_config);
    my $http = expand_env($block->http_config);
    my $config = expand_env($block->config);
    my $root_loc = $NoRootLoc ? '' : "location = /index.html { }\n";
    # Under valgrind one process does it all, unless the file wants a master.
    my $master = $MasterOn && (!$Valgrind || $MasterAsked) ? 'on' : 'off';
    my $conf = <<"CONF";
daemon off;
master_process $master;
worker_processes $Workers;
pid $ServRoot/logs/nginx.pid;
error_log $ServRoot/logs/error.log $LogLevel;
$modules$env$main
events {
    accept_mutex off;
    worker_connections $WorkerConnections;
}

http {
    access_log $ServRoot/logs/access.log;
    default_type text/plain;
    keepalive_timeout 68;
    client_body_temp_path $ServRoot/tmp/body;
    proxy_temp_path $ServRoot/tmp/proxy;
    fastcgi_temp_path $ServRoot/tmp/fastcgi;
    uwsgi_temp_path $ServRoot/tmp/uwsgi;
    scgi_temp_path $ServRoot/tmp/scgi;

$http

    server {
        listen 127.0.0.1:$Port;
        server_name localhost;
        client_max_body_size 30M;
        $root_loc
$config
    }
}
CONF
    open my $fh, '>', "$ServRoot/conf/nginx.conf" or die "cannot write nginx.conf: $!";
    print $fh $conf;
    close $fh;
}

my $NginxPid;
my $VgDir;    # the valgrind logs of the nginx last started
my $CurrentBlock = 'END';

# True when something answers on the port (a test server that was given it,
# an nginx of another run): the start check would talk to it, not to ours.
sub port_taken ($) {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => shift, Timeout => 1) or return 0;
    close $s;
    return 1;
}

sub start_nginx () {
    return "port $Port already answers (another server has it): refusing to start nginx there"
        if port_taken($Port);
    my @cmd = ($Binary, '-p', "$ServRoot/", '-c', "$ServRoot/conf/nginx.conf");
    if ($Valgrind) {
        $VgDir = "$ServRoot/valgrind";
        @cmd = ValgrindCheck::command($VgDir, @cmd);
    }
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        open STDERR, '>>', "$ServRoot/logs/stderr.log";
        open STDOUT, '>>', "$ServRoot/logs/stderr.log";
        exec @cmd;
        exit 127;
    }
    $NginxPid = $pid;
    my $deadline = time + ValgrindCheck::stretch(10);
    while (time < $deadline) {
        if (waitpid($pid, WNOHANG) == $pid) {
            $NginxPid = undef;
            return "nginx exited with status " . ($? >> 8);
        }
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $Port, Timeout => 1);
        if ($s) { close $s; return undef; }
        sleep 0.01;
    }
    return "nginx did not start listening on port $Port";
}

# QUIT, then KILL when it has not exited within 5 s (NginxProcess).
sub stop_nginx () {
    return unless $NginxPid;
    NginxProcess::stop_nginx_pid($NginxPid, $CurrentBlock, $VgDir);
    $NginxPid = undef;
}

# Under valgrind, after nginx has exited: one failed test, with valgrind's
# records, when any of its processes shows findings; nothing otherwise.
sub valgrind_verdict ($) {
    my $name = shift;
    return unless $Valgrind && $VgDir;
    my $dir = $VgDir;
    $VgDir = undef;
    my ($clean, $report) = ValgrindCheck::check($dir, $name);
    return if $clean;
    fail("$name - valgrind: no memory error, definite leak or cut-short report in nginx");
    diag($report);
}

# (Not in a child the test forked, which exits too.)
my $Owner = $$;
END { if ($$ == $Owner) { stop_nginx(); valgrind_verdict($CurrentBlock) } }

sub slurp ($) {
    my $f = shift;
    open my $fh, '<', $f or return '';
    local $/;
    my $s = <$fh>;
    return defined $s ? $s : '';
}

sub build_request ($$;$) {
    my ($block, $req, $keepalive) = @_;
    my $raw = section($block, 'raw_request');
    return $raw if defined $raw && !ref $raw && !$keepalive;
    $req =~ s/^\s+//;
    my ($line, $body) = split /\n/, $req, 2;
    $body = $block->request_body if defined $block->request_body;
    $body = '' unless defined $body;
    $line =~ s/\s+$//;
    my ($method, $uri, $proto) = split /\s+/, $line;
    $proto ||= 'HTTP/1.1';
    my $headers = '';
    my $more = $block->more_headers;
    my %have;
    if (defined $more) {
        for my $h (split /\n/, expand_env($more)) {
            next unless $h =~ /\S/;
            $headers .= "$h\r\n";
            $have{lc $1} = 1 if $h =~ /^\s*([^:]+):/;
        }
    }
    my $r = "$method $uri $proto\r\n";
    $r .= "Host: localhost\r\n" unless $have{host};
    $r .= $keepalive ? "Connection: keep-alive\r\n" : "Connection: close\r\n" unless $have{connection};
    $r .= "Content-Length: " . length($body) . "\r\n"
        if (length $body || $method =~ /^(POST|PUT|PATCH)$/) && !$have{'content-length'} && !$have{'transfer-encoding'};
    return $r . $headers . "\r\n" . $body;
}

# Sends one raw request; returns (status, headers hashref, body, error).
sub http_exchange ($$$) {
    my ($raw, $timeout, $head) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $Port, Timeout => $timeout)
        or return (undef, {}, '', "cannot connect: $!");
    binmode $s;
    print $s $raw or return (undef, {}, '', "cannot send the request: $!");
    my $buf = '';
    my $deadline = time + $timeout;
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    while (1) {
        my $left = $deadline - time;
        return (undef, {}, $buf, 'timeout') if $left <= 0;
        my $n = select(my $rout = $rin, undef, undef, $left);
        next if $n <= 0;
        my $got = sysread($s, my $chunk, 65536);
        last if !$got;
        $buf .= $chunk;
        last if response_complete($buf, $head);
    }
    close $s;
    return parse_response($buf, $head);
}

# Pipelined requests: all written at once on one keep-alive connection,
# then the responses read one after the other (each must end by its own
# length or chunked framing, not by the connection closing).
sub http_pipelined ($$$) {
    my ($raws, $timeout, $heads) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $Port, Timeout => $timeout)
        or return ([undef, {}, '', "cannot connect: $!"]);
    binmode $s;
    print $s join('', @$raws) or return ([undef, {}, '', "cannot send the requests: $!"]);
    my $buf = '';
    my @out;
    my $deadline = time + $timeout;
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    my $closed = 0;
    for my $i (0 .. $#$raws) {
        my $len;
        while (!defined($len = HttpClient::response_length($buf, $heads->[$i]))) {
            my $left = $deadline - time;
            if ($left <= 0 || $closed) {
                push @out, [undef, {}, $buf, $closed ? 'connection closed' : 'timeout'];
                close $s;
                return @out;
            }
            my $n = select(my $rout = $rin, undef, undef, $left);
            next if $n <= 0;
            my $got = sysread($s, my $chunk, 65536);
            if (!$got) { $closed = 1; next }
            $buf .= $chunk;
        }
        push @out, [parse_response(substr($buf, 0, $len, ''), $heads->[$i])];
    }
    close $s;
    return @out;
}

sub response_complete ($$) {
    my ($buf, $head_only) = @_;
    return defined HttpClient::response_length($buf, $head_only);
}

# (status, headers, body, error, raw header text).
sub parse_response ($$) {
    my ($buf, $head_only) = @_;
    my $end = index($buf, "\r\n\r\n");
    return (undef, {}, $buf, 'incomplete response header') if $end < 0;
    my ($status, $h, $body) = HttpClient::parse_response($buf, $head_only);
    return (undef, {}, $buf, 'bad status line') unless defined $status;
    return ($status, $h, $body, undef, substr($buf, 0, $end + 2));
}

my $NginxVersion;

sub nginx_version () {
    return $NginxVersion if defined $NginxVersion;
    my $v = `$Binary -v 2>&1`;
    $NginxVersion = $v =~ m{nginx/(\d+(?:\.\d+)*)} ? $1 : '0';
    return $NginxVersion;
}

sub version_cmp ($$) {
    my @a = split /\./, shift;
    my @b = split /\./, shift;
    while (@a || @b) {
        my $c = (shift(@a) // 0) <=> (shift(@b) // 0);
        return $c if $c;
    }
    return 0;
}

# `--- skip_nginx: N: < 1.2.3` (and skip_nginx2 with two conditions joined
# by "and" / "or"): how many tests to skip for this nginx, with why.
sub nginx_skip ($) {
    my $block = shift;
    for my $sec (qw(skip_nginx skip_nginx2)) {
        my $spec = $block->$sec;
        next unless defined $spec;
        my ($n, $cond) = $spec =~ /^\s*(\d+)\s*:\s*(.*?)\s*$/s or next;
        my @parts = split /\s+(and|or)\s+/, $cond;
        my $test = sub {
            my ($op, $ver) = $_[0] =~ /^\s*([<>=!]=?)\s*(\S+)/ or return 0;
            my $c = version_cmp(nginx_version(), $ver);
            return { '<' => $c < 0, '<=' => $c <= 0, '>' => $c > 0, '>=' => $c >= 0,
                     '=' => $c == 0, '==' => $c == 0, '!=' => $c != 0 }->{$op};
        };
        my $result = $test->(shift @parts);
        while (@parts) {
            my ($join, $next) = splice @parts, 0, 2;
            $result = $join eq 'and' ? ($result && $test->($next)) : ($result || $test->($next));
        }
        return ($n, "nginx " . nginx_version() . " $cond") if $result;
    }
    return;
}

sub hex_context ($$) {
    my ($got, $want) = @_;
    my $i = 0;
    $i++ while $i < length($got) && $i < length($want) && substr($got, $i, 1) eq substr($want, $i, 1);
    my $from = $i > 16 ? $i - 16 : 0;
    my $fmt = sub { join ' ', map { sprintf '%02x', ord } split //, substr($_[0], $from, 48) };
    return sprintf("first difference at byte %d (lengths: got %d, expected %d)\n  got:      %s\n  expected: %s",
        $i, length $got, length $want, $fmt->($got), $fmt->($want));
}

sub check_body ($$$) {
    my ($name, $got, $want) = @_;
    if ($got eq $want) { pass("$name - response_body - response is expected"); return }
    my $text = ($got . $want) !~ /[^\t\n\r\x20-\x7e]/;
    if ($text && !$NoDiff && length($got) < 4000 && length($want) < 4000) {
        is($got, $want, "$name - response_body - response is expected");
    } else {
        fail("$name - response_body - response is expected");
        diag(hex_context($got, $want));
    }
}

sub as_list ($) {
    my $v = shift;
    return () unless defined $v;
    return @$v if ref $v eq "ARRAY";
    return ($v) if ref $v;
    return map { /\S/ ? $_ : () } split /\n/, $v;
}

sub check_log ($$$$) {
    my ($name, $log, $patterns, $want) = @_;
    for my $p (as_list($patterns)) {
        my $found = ref $p eq 'Regexp' ? $log =~ $p : index($log, $p) >= 0;
        my $what = ref $p eq 'Regexp' ? "$p" : "\"$p\"";
        if ($want) {
            ok($found, "$name - pattern $what should match a line in error.log");
        } else {
            ok(!$found, "$name - pattern $what should not match any line in error.log");
        }
    }
}

sub check_headers ($$$) {
    my ($name, $h, $spec) = @_;
    for my $line (as_list($spec)) {
        if ($line =~ /^\s*!\s*([^:\s]+)\s*$/) {
            ok(!exists $h->{lc $1}, "$name - header $1 not present");
        } elsif ($line =~ /^\s*([^:]+?)\s*:\s*(.*?)\s*$/) {
            is($h->{lc $1}, $2, "$name - header $1 ok");
        }
    }
}

# `--- skip_valgrind: N: why`: N tests skipped under valgrind.
sub valgrind_skip ($) {
    my $block = shift;
    return unless $Valgrind;
    my $spec = $block->skip_valgrind;
    return unless defined $spec;
    my ($n, $why) = $spec =~ /^\s*(\d+)\s*:\s*(.*?)\s*$/s or die "skip_valgrind needs \"N: why\"\n";
    return ($n, "under valgrind: $why");
}

sub run_test ($) {
    my $block = shift;
    my $name = $block->name;
    $_->($block) for @Preprocessors;
    if (my ($n, $why) = nginx_skip($block)) {
        SKIP: { Test::More::skip("$name - $why", $n) }
        return;
    }
    if (my ($n, $why) = valgrind_skip($block)) {
        SKIP: { Test::More::skip("$name - $why", $n) }
        return;
    }
    $CurrentBlock = $name;
    if (defined(my $init = $block->init)) {
        eval $init;
        die "init section of $name failed: $@" if $@;
    }

    write_config($block);
    my $err = start_nginx();
    if (defined $block->must_die) {
        ok(defined $err, "$name - nginx must not start");
        check_log($name, slurp("$ServRoot/logs/stderr.log") . slurp("$ServRoot/logs/error.log"), $block->error_log, 1);
        stop_nginx();
        valgrind_verdict($name);
        return;
    }
    if ($err) {
        fail("$name - nginx started: $err");
        diag(slurp("$ServRoot/logs/stderr.log"));
        stop_nginx();
        valgrind_verdict($name);
        return;
    }

    my $requests = section($block, 'request');
    my $pipelined = section($block, 'pipelined_requests');
    $requests = $pipelined if defined $pipelined;
    my @reqs = ref $requests eq 'ARRAY' ? @$requests : (defined $requests ? $requests : ());
    @reqs = ('') if !@reqs && defined $block->raw_request;
    my @codes  = ref $block->error_code eq 'ARRAY' ? @{ $block->error_code } : (section($block, 'error_code')) x @reqs;
    my $bodies = section($block, 'response_body');
    my @bodies = ref $bodies eq 'ARRAY' ? @$bodies : ($bodies) x @reqs;
    my $timeout = $block->timeout || 10;
    $timeout =~ s/s$//;
    # The client's deadline grows under valgrind, but not when the block's
    # point is a client that gives up (it must give up at the same moment).
    $timeout = ValgrindCheck::stretch($timeout) unless defined $block->abort;

    my @pipelined;
    if (defined $pipelined) {
        my @raws = map { build_request($block, $reqs[$_], $_ < $#reqs) } 0 .. $#reqs;
        @pipelined = http_pipelined(\@raws, $timeout, [map { /^\s*HEAD\s/ ? 1 : 0 } @reqs]);
    }
    for my $i (0 .. $#reqs) {
        my $req = $reqs[$i];
        my $head_only = $req =~ /^\s*HEAD\s/;
        my ($status, $h, $body, $e, $raw_head);
        if (defined $pipelined) {
            last if $i > $#pipelined;
            ($status, $h, $body, $e, $raw_head) = @{ $pipelined[$i] };
        } else {
            ($status, $h, $body, $e, $raw_head) = http_exchange(build_request($block, $req), $timeout, $head_only);
        }
        my $n = @reqs > 1 ? "$name (req $i)" : $name;
        next if defined $block->ignore_response;
        if ($e) {
            if ($e eq "timeout" && defined $block->abort) {
                pass("$n - client aborted after ${timeout}s as asked");
                next;
            }
            fail("$n - request failed: $e");
            next;
        }
        my $want_code = defined $codes[$i] ? $codes[$i] : 200;
        $want_code =~ s/\s+//g;
        is($status, $want_code, "$n - status code ok");
        check_headers($n, $h, $block->response_headers) if defined $block->response_headers;
        if (defined $block->response_headers_like) {
            for my $line (as_list(section($block, 'response_headers_like'))) {
                my ($k, $re) = $line =~ /^\s*([^:]+?)\s*:\s*(.*?)\s*$/ or next;
                like($h->{lc $k} // '', qr/$re/, "$n - header $k like /$re/");
            }
        }
        if (defined $block->raw_response_headers_like) {
            my $re = section($block, 'raw_response_headers_like');
            $re = $re->[$i] if ref $re eq 'ARRAY';
            like($raw_head // '', ref $re ? $re : qr/$re/s, "$n - raw_response_headers_like - headers are expected");
        }
        check_body($n, $body, $bodies[$i]) if defined $bodies[$i];
        if (defined $block->response_body_like) {
            my $re = section($block, 'response_body_like');
            $re = $re->[$i] if ref $re eq 'ARRAY';
            like($body, ref $re ? $re : qr/$re/s, "$n - response_body_like - response is expected");
        }
        if (defined $block->response_body_unlike) {
            my $re = $block->response_body_unlike;
            unlike($body, ref $re ? $re : qr/$re/s, "$n - response_body_unlike - response is expected");
        }
    }

    if (my $w = $block->wait) { $w =~ s/s$//; sleep ValgrindCheck::stretch($w) }
    my $log = slurp("$ServRoot/logs/error.log");
    check_log($name, $log, section($block, 'error_log'), 1) if defined $block->error_log;
    check_log($name, $log, section($block, 'no_error_log'), 0) if defined $block->no_error_log;
    stop_nginx();
    valgrind_verdict($name);
    # Whatever the block did, the workers must not have crashed (a failed
    # test when they did; none otherwise, so that plans keep their counts).
    # (TEST_NGINX_ALLOW_PANICS: a suite that makes panics on purpose checks
    # them itself; a worker that died is still a failure.)
    my $after = slurp("$ServRoot/logs/error.log");
    my $crash = $ENV{TEST_NGINX_ALLOW_PANICS}
        ? qr/(.*(?:exited on signal|\[alert\].*worker process \d+ exited).*)/
        : qr/(.*(?:exited on signal|\[alert\].*(?:panic|worker process \d+ exited)).*)/;
    if ($after =~ $crash) {
        fail("$name - no worker crashed");
        diag($1);
    }
}

sub run_tests () {
    for my $block (Test::Base::blocks()) {
        for my $r (1 .. $RepeatEach) {
            run_test($block);
        }
    }
}

1;
