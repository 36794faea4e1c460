package SseClient;

# Clients of the gateway's server-sent event streams (sqldb_listen,
# cache_subscribe), for the tests: open a stream, read what arrives on many
# at once, and list the events each one got.
#
#   use SseClient qw(open_sse pump events subscribed subscribers);
#   my @subs = map { open_sse($port, '/events?channel=a') } 1 .. 3;
#   pump(\@subs, 5, subscribed(@subs));         # or sub { ... enough? }
#   my @events = events($subs[0]);              # "NAME=line1|line2", ...
#   subscribers($port, 'cache_subscribe');      # the gauge, from /metrics

use strict;
use warnings;
use Exporter 'import';
use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(time);
use GatewayTest qw(http_request);

our @EXPORT_OK = qw(open_sse pump body events metric subscribers subscribed);

# A subscriber: the socket, with what it has read so far. More header
# lines ("Name: value") may follow the path; they are sent after Host.
sub open_sse {
    my ($port, $path, @headers) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die $!;
    my $more = join '', map { "$_\r\n" } @headers;
    print $s "GET $path HTTP/1.1\r\nHost: localhost\r\n$more\r\n";
    return { s => $s, buf => '' };
}

# Reads what has arrived on each subscriber for $secs (or until $until
# says it has enough). A subscriber whose stream ended gets {eof}.
sub pump {
    my ($subs, $secs, $until) = @_;
    my $sel = IO::Select->new(map { $_->{s} } grep { !$_->{eof} } @$subs);
    my %of = map { (fileno($_->{s}) => $_) } grep { !$_->{eof} } @$subs;
    my $deadline = time + $secs;
    my $next_check = 0;
    while (time < $deadline) {
        # (The check reads whole buffers: at most every 0.1 s.)
        if ($until && time >= $next_check) {
            last if $until->();
            $next_check = time + 0.1;
        }
        for my $fh ($sel->can_read(0.05)) {
            my $n = sysread($fh, my $chunk, 65536);
            if (!$n) { $sel->remove($fh); $of{ fileno($fh) }{eof} = 1; next }
            $of{ fileno($fh) }{buf} .= $chunk;
        }
    }
}

# The body of a subscriber's stream, its chunked encoding undone (as far
# as whole chunks have arrived).
sub body {
    my ($sub) = @_;
    my $buf = $sub->{buf};
    my $at = index($buf, "\r\n\r\n");
    return '' if $at < 0;
    $at += 4;
    my $body = '';
    while (1) {
        my $eol = index($buf, "\r\n", $at);
        last if $eol < 0;
        my $n = hex substr($buf, $at, $eol - $at);
        last if $n == 0 || length($buf) < $eol + 2 + $n + 2;
        $body .= substr($buf, $eol + 2, $n);
        $at = $eol + 2 + $n + 2;
    }
    return $body;
}

# The events of a subscriber's stream, as "NAME=DATA" with the data lines
# joined by "|"; comment lines are left out.
sub events {
    my ($sub) = @_;
    my @ev;
    for my $block (split /\n\n/, body($sub)) {
        next if $block =~ /^:/;
        my ($name) = $block =~ /^event: (.*)$/m;
        my @data = $block =~ /^data: (.*)$/mg;
        push @ev, ($name // '?') . '=' . join('|', @data) if defined $name;
    }
    return @ev;
}

# A series of gateway_status (at /metrics) for one source of events:
# ngx_gateway_NAME{source="SOURCE"}, 0 when it is not there.
sub metric {
    my ($port, $name, $source) = @_;
    my (undef, $m) = http_request($port, 'GET', '/metrics');
    my $n = 0;
    $n += $1 while $m =~ /^ngx_gateway_\Q$name\E\{source="\Q$source\E"\} (-?\d+)$/mg;
    return $n;
}

# The subscribers gauge of a source (sqldb_listen, cache_subscribe).
sub subscribers {
    my ($port, $source) = @_;
    return metric($port, 'subscribers', $source);
}

# A check for pump: every one of the subscribers has its ": subscribed" line.
sub subscribed {
    my @s = @_;
    return sub { !grep { $_->{buf} !~ /: subscribed/ } @s };
}

1;
