package NginxProcess;

# Loopback ports and the nginx a test starts as its child, shared by
# GatewayTest.pm and the runner (t/lib/harness/Test/Nginx/Socket.pm, which
# cannot load GatewayTest: loading it starts PostgreSQL).
#
# free_port and listen_socket never hand out a port twice within a run (one
# test process), nor one of the ports the environment names for the test
# servers and the runner's nginx (TEST_NGINX_SERVER_PORT, released until a
# block starts nginx on it; TEST_NGINX_PG_PORT, which the suite runner may
# have set; TEST_NGINX_CLOSED_PORT, TEST_NGINX_SILENT_PORT).

use strict;
use warnings;
use Exporter 'import';
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Time::HiRes qw(sleep time);
use File::Basename qw(dirname);
use lib dirname(__FILE__);
use Test::Builder ();
use ValgrindCheck ();

our @EXPORT_OK = qw(free_port listen_socket stop_nginx_pid);

my %Given;

sub port_ok {
    my ($p) = @_;
    return 0 if $Given{$p};
    for my $name (qw(TEST_NGINX_SERVER_PORT TEST_NGINX_PG_PORT TEST_NGINX_CLOSED_PORT TEST_NGINX_SILENT_PORT)) {
        return 0 if ($ENV{$name} // 0) == $p;
    }
    return 1;
}

# A listening loopback socket on a port nobody else was given.
sub listen_socket {
    my ($backlog) = @_;
    for (1 .. 100) {
        my $l = IO::Socket::INET->new(Listen => $backlog, LocalAddr => '127.0.0.1', LocalPort => 0, ReuseAddr => 1)
            or die "cannot listen: $!";
        next unless port_ok($l->sockport);
        $Given{ $l->sockport } = 1;
        return $l;
    }
    die "no free port\n";
}

# A free loopback port nobody else was given.
sub free_port {
    for (1 .. 100) {
        my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0, ReuseAddr => 1)
            or die "no free port: $!";
        my $p = $s->sockport;
        close $s;
        next unless port_ok($p);
        $Given{$p} = 1;
        return $p;
    }
    die "no free port\n";
}

# Stops an nginx master that is this process's child: QUIT, then waits
# (reaping it) up to 5 s, stretched under valgrind; KILL when it has not
# exited by then. $label names the nginx in the diagnostics. (Under
# valgrind, QUIT again after 10 s and every 5 s, to the master and to the
# processes of $vg_dir, valgrind's logs, that have not ended: a signal that
# arrives just as a process's event loop goes to sleep in epoll_wait can be
# taken without waking it, and it would sleep on until its next timer.)
sub stop_nginx_pid {
    my ($pid, $label, $vg_dir) = @_;
    my $tb = Test::Builder->new;
    kill 'QUIT', $pid;
    my $deadline = time + ValgrindCheck::stretch(5);
    my ($again, $sent) = (time + 10, 1);
    while (time < $deadline) {
        if (waitpid($pid, WNOHANG) == $pid) {
            $tb->diag("$label: nginx exited only after QUIT was sent $sent times") if $sent > 1;
            return;
        }
        if (ValgrindCheck::enabled() && time > $again) {
            kill 'QUIT', $pid, ($vg_dir ? ValgrindCheck::running_pids($vg_dir) : ());
            ($again, $sent) = (time + 5, $sent + 1);
        }
        sleep 0.01;
    }
    $tb->diag("$label: nginx did not exit within " . ValgrindCheck::stretch(5) . " s of QUIT (sent $sent times): killed");
    kill 'KILL', $pid;
    waitpid($pid, 0);
}

1;
