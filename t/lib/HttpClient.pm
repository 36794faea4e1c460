package HttpClient;

# HTTP/1.1 framing for the tests: where one response ends in a stream of
# bytes (Content-Length, chunked, or a response without a body), a client
# that sends requests one after the other on one keep-alive connection,
# and requests on a connection of their own (GatewayTest exports these
# too).

use strict;
use warnings;
use Exporter 'import';
use IO::Socket::INET;
use Time::HiRes qw(time);
use File::Basename qw(dirname);
use lib dirname(__FILE__);
use ValgrindCheck ();

# A write to a socket the server has closed fails that request (EPIPE)
# instead of killing the test process with SIGPIPE.
$SIG{PIPE} = 'IGNORE';

our @EXPORT_OK = qw(response_length parse_response unchunk keepalive_requests http_send http_send_request http_read http_request
    http_get);

# The length of the first whole response in $buf, or undef when it is not
# all there (or is framed by the connection closing).
sub response_length {
    my ($buf, $head_only) = @_;
    my $i = index($buf, "\r\n\r\n");
    return undef if $i < 0;
    my $head = substr($buf, 0, $i);
    my $start = $i + 4;
    return $start if $head_only || $head =~ m{^HTTP/\S+ (1\d\d|204|304)\b};
    return $start + $1 <= length $buf ? $start + $1 : undef if $head =~ /^Content-Length:\s*(\d+)/mi;
    if ($head =~ /^Transfer-Encoding:\s*chunked/mi) {
        my $pos = $start;
        while (1) {
            my $eol = index($buf, "\r\n", $pos);
            return undef if $eol < 0;
            my ($n) = substr($buf, $pos, $eol - $pos) =~ /^([0-9a-fA-F]+)/ or return undef;
            $n = hex $n;
            $pos = $eol + 2;
            if ($n == 0) {
                my $end = index($buf, "\r\n", $pos);
                return $end < 0 ? undef : $end + 2;
            }
            $pos += $n + 2;
            return undef if $pos > length $buf;
        }
    }
    return undef;
}

# A chunked body, decoded: the data of its chunks up to the last chunk, or
# up to the first chunk that is cut short or not followed by CRLF.
sub unchunk {
    my ($body) = @_;
    my $out = '';
    while ($body =~ s/^([0-9a-fA-F]+)[^\r\n]*\r\n//) {
        my $n = hex $1;
        last if $n == 0;
        $out .= substr($body, 0, $n, '');
        last unless $body =~ s/^\r\n//;
    }
    return $out;
}

# (status, {lower-case header => value}, body) of one whole response.
sub parse_response {
    my ($buf, $head_only) = @_;
    my $i = index($buf, "\r\n\r\n");
    return (undef, {}, $buf) if $i < 0;
    my ($head, $body) = (substr($buf, 0, $i), substr($buf, $i + 4));
    my @lines = split /\r\n/, $head;
    my ($status) = (shift @lines) =~ m{^HTTP/\d\.\d\s+(\d+)};
    my %h;
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*)$/ or next;
        $h{lc $k} = exists $h{lc $k} ? "$h{lc $k}, $v" : $v;
    }
    $body = unchunk($body) if !$head_only && ($h{'transfer-encoding'} || '') =~ /chunked/i;
    $body = '' if $head_only;
    return ($status, \%h, $body);
}

# Sends [METHOD, PATH, BODY, {header => value}] requests one after the other
# on one connection, each after the previous answer. Returns one hash per
# request: { status, headers, body, error }; the first error ends the list.
# The timeout (seconds per answer) is stretched under valgrind.
sub keepalive_requests {
    my ($port, $timeout, @reqs) = @_;
    $timeout = ValgrindCheck::stretch($timeout);
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port)
        or return ({ error => "connect: $!" });
    binmode $s;
    my @out;
    my $buf = '';
    for my $i (0 .. $#reqs) {
        my ($method, $path, $body, $headers) = @{ $reqs[$i] };
        $body //= '';
        my $raw = "$method $path HTTP/1.1\r\nHost: localhost\r\n";
        $raw .= "Connection: close\r\n" if $i == $#reqs;
        $raw .= "Content-Length: " . length($body) . "\r\n" if length $body || $method =~ /^(POST|PUT)$/;
        $raw .= "$_: $headers->{$_}\r\n" for sort keys %{ $headers || {} };
        if (!print $s "$raw\r\n$body") {
            push @out, { error => "send: $!", partial => $buf };
            return @out;
        }
        my $head_only = $method eq 'HEAD';
        my $deadline = time + $timeout;
        my $len;
        my $closed = 0;
        while (!defined($len = response_length($buf, $head_only))) {
            my $left = $deadline - time;
            if ($left <= 0 || $closed) {
                push @out, { error => $closed ? 'connection closed' : 'timeout', partial => $buf };
                return @out;
            }
            my $rin = '';
            vec($rin, fileno($s), 1) = 1;
            next unless select(my $rout = $rin, undef, undef, $left) > 0;
            my $got = sysread($s, my $chunk, 65536);
            if ($got) { $buf .= $chunk } else { $closed = 1 }
        }
        my ($status, $h, $b) = parse_response(substr($buf, 0, $len, ''), $head_only);
        push @out, { status => $status, headers => $h, body => $b };
    }
    close $s;
    return @out;
}

# --- A request on a connection of its own (Connection: close) ---------------

# Opens a connection and sends a request, with a body (and its
# Content-Length) when one is given; returns the socket (read it with
# http_read).
sub http_send_request {
    my ($port, $method, $path, $body, %headers) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!";
    binmode $s;
    my $extra = join '', map { "$_: $headers{$_}\r\n" } sort keys %headers;
    $extra .= "Connection: close\r\n";
    $extra .= 'Content-Length: ' . length($body) . "\r\n" if defined $body;
    # A refused write (the server closed already) shows as a failed read.
    print $s "$method $path HTTP/1.1\r\nHost: localhost\r\n$extra\r\n" . ($body // '');
    return $s;
}

# Opens a connection and sends a GET; returns the socket (read it with http_read).
sub http_send {
    my ($port, $path, %headers) = @_;
    return http_send_request($port, 'GET', $path, undef, %headers);
}

# Reads a whole response (the server closes); returns (status, body).
sub http_read {
    my ($s, $timeout) = @_;
    $timeout = ValgrindCheck::stretch($timeout || 10);
    my $buf = '';
    my $deadline = time + $timeout;
    my $rin = '';
    vec($rin, fileno($s), 1) = 1;
    while (time < $deadline) {
        my $n = select(my $rout = $rin, undef, undef, $deadline - time);
        next if $n <= 0;
        my $got = sysread($s, my $chunk, 65536);
        last unless $got;
        $buf .= $chunk;
    }
    close $s;
    my ($head, $body) = split /\r\n\r\n/, $buf, 2;
    my ($status) = ($head || '') =~ m{^HTTP/\S+ (\d+)};
    return ($status, $body);
}

# One request on a connection of its own: (status, body, head).
sub http_request {
    my ($port, $method, $path, $body, @headers) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!";
    binmode $s;
    $body //= '';
    my $more = join '', map { "$_\r\n" } @headers;
    print $s "$method $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n${more}Content-Length: "
        . length($body) . "\r\n\r\n$body";
    local $/;
    my $resp = <$s> // '';
    my ($head, $rest) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/\S+ (\d+)};
    return ($status // 0, $rest // '', $head // '');
}

sub http_get {
    my ($port, $path, $timeout) = @_;
    return http_read(http_send($port, $path), $timeout);
}

1;
