package FakeRedis;

# A scripted stand-in for Redis, for what a real server will not do: replies
# that are malformed, overflowing, dripped byte by byte, cut short, sent
# late or sent unasked. It reads RESP commands and, for each, runs the
# test's script, which returns the steps of the answer:
#
#   my $fake = FakeRedis->start(sub {
#       my ($conn, $n, @cmd) = @_;       # connection number, command number on it, the command
#       return (['send', "\$2\r\nok\r\n"]);
#   });
#
# Steps: ['send', BYTES], ['drip', BYTES, SECONDS_PER_BYTE], ['sleep', SECONDS],
# ['close'], ['later', SECONDS, BYTES] (sent after the delay while the
# connection waits for its next command), ['stale', SECONDS, BYTES] (held
# until the next commands arrive on the connection, then sent after the
# delay in front of their replies: bytes left on a pooled connection that
# the next request finds before its own replies). Every connection and
# command is written to a log (`$fake->log`) as "conn N" and "N: CMD ARG ...".

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use File::Temp qw(tempdir);
use POSIX qw(WNOHANG _exit);
use Time::HiRes qw(sleep time);

my @Fakes;

sub start {
    my ($class, $script) = @_;
    my $dir = tempdir('ngx-gateway-fake-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    # Not on the port the suite runner picked for its nginx.
    my $l;
    for (1 .. 100) {
        $l = IO::Socket::INET->new(Listen => 64, LocalAddr => '127.0.0.1', LocalPort => 0, ReuseAddr => 1)
            or die "listen: $!";
        last if $l->sockport != ($ENV{TEST_NGINX_SERVER_PORT} // 0);
    }
    my $self = bless { port => $l->sockport, log => "$dir/log" }, $class;
    open my $fh, '>', $self->{log} or die $!;
    close $fh;
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if (!$pid) {
        setpgrp(0, 0);
        $SIG{CHLD} = 'IGNORE';
        my $conns = 0;
        while (my $c = $l->accept) {
            $conns++;
            my $child = fork;
            if (defined $child && !$child) {
                close $l;
                serve($c, $conns, $script, $self->{log});
                _exit(0);
            }
            close $c;
        }
        _exit(0);
    }
    close $l;
    $self->{pid} = $pid;
    push @Fakes, $self;
    return $self;
}

sub port { $_[0]{port} }

sub log_lines {
    my $self = shift;
    open my $fh, '<', $self->{log} or return ();
    chomp(my @lines = <$fh>);
    return @lines;
}

# How many connections the fake has accepted.
sub connections { scalar grep { /^conn / } $_[0]->log_lines }

sub note {
    my ($log, $line) = @_;
    open my $fh, '>>', $log or return;
    print $fh "$line\n";
    close $fh;
}

# One whole RESP command (an array of bulk strings) at the start of $$buf.
sub take_command {
    my ($buf) = @_;
    return unless $$buf =~ /^\*(\d+)\r\n/;
    my $n = $1;
    my $pos = length "*$n\r\n";
    my @args;
    for (1 .. $n) {
        return unless substr($$buf, $pos) =~ /^\$(\d+)\r\n/;
        my $len = $1;
        my $start = $pos + length("\$$len\r\n");
        return if length($$buf) < $start + $len + 2;
        push @args, substr($$buf, $start, $len);
        $pos = $start + $len + 2;
    }
    substr($$buf, 0, $pos, '');
    return \@args;
}

sub serve {
    my ($c, $conn, $script, $log) = @_;
    binmode $c;
    note($log, "conn $conn");
    my $buf = '';
    my $n = 0;
    my (@later, @stale);
    my $sel = IO::Select->new($c);
    while (1) {
        my $wait = @later ? $later[0][0] - time : undef;
        $wait = 0 if defined $wait && $wait < 0;
        if (!$sel->can_read($wait)) {
            my $l = shift @later;
            syswrite($c, $l->[1]) if $l;
            next;
        }
        my $got = sysread($c, my $chunk, 65536);
        unless ($got) {
            # The peer closed the connection (or reset it).
            note($log, "gone $conn");
            return;
        }
        $buf .= $chunk;
        # The commands are logged before anything is sent back (stale bytes
        # included): once the peer has seen an answer to them, the log
        # shows them.
        my @cmds;
        while (my $cmd = take_command(\$buf)) {
            $n++;
            note($log, "$conn: " . join ' ', @$cmd);
            push @cmds, [$n, $cmd];
        }
        for my $st (splice @stale) {
            sleep $st->[0];
            syswrite($c, $st->[1]);
        }
        for my $nc (@cmds) {
            my ($i, $cmd) = @$nc;
            for my $step ($script->($conn, $i, @$cmd)) {
                my ($what, @a) = @$step;
                if ($what eq 'send') { syswrite($c, $a[0]) }
                elsif ($what eq 'drip') {
                    for my $byte (split //, $a[0]) { syswrite($c, $byte); sleep $a[1] }
                }
                elsif ($what eq 'sleep') { sleep $a[0] }
                elsif ($what eq 'close') { close $c; return }
                elsif ($what eq 'later') { push @later, [time + $a[0], $a[1]] }
                elsif ($what eq 'stale') { push @stale, [@a] }
            }
        }
    }
}

sub stop {
    my $self = shift;
    return unless $self->{pid};
    kill 'TERM', -$self->{pid};
    waitpid($self->{pid}, 0);
    $self->{pid} = undef;
}

# (Only in the process that started them: not in a fake's own child.)
my $Owner = $$;
END { local $?; if ($$ == $Owner) { $_->stop for @Fakes } }

1;
