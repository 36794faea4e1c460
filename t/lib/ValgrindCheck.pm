package ValgrindCheck;

# nginx under valgrind's memcheck for the suites (make test-valgrind).
#
# With TEST_NGINX_USE_VALGRIND=1 the runner (t/lib/harness) and
# GatewayTest's nginx_start put `valgrind` in front of nginx, with a log
# file per process (nginx's master and every worker it forks) in a folder
# of that start. When nginx has exited, check() reads every log of the
# folder and says what it found:
#
#   - memory errors (invalid reads and writes, uses of uninitialised
#     values, bad frees, ...), and a process killed by a signal;
#   - definite leaks (blocks nothing points to any more);
#   - a report cut short: a log without valgrind's final ERROR SUMMARY
#     (the process was killed, or had not ended).
#
# One line per process goes to target/valgrind/summary.tsv (see
# tools/valgrind-summary); the logs of processes with findings are kept in
# target/valgrind/logs/. Suppressions: t/valgrind.supp, and the files named
# by TEST_NGINX_VALGRIND_SUPP (separated by ':'); more valgrind options in
# TEST_NGINX_VALGRIND_OPTS. Waits of the harness are stretched by
# factor() (10, or TEST_NGINX_VALGRIND_FACTOR).

use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname basename);
use File::Copy qw(copy);
use File::Path qw(make_path);
use Fcntl qw(:flock);
use Time::HiRes qw(time);

my $Top = abs_path(dirname(__FILE__) . '/../..');
# Where summary.tsv and the kept logs go.
sub out_dir () { $ENV{TEST_NGINX_VALGRIND_DIR} || "$Top/target/valgrind" }

sub enabled () { $ENV{TEST_NGINX_USE_VALGRIND} ? 1 : 0 }

# How much slower things are under valgrind: deadlines are multiplied by it.
sub factor () { enabled() ? ($ENV{TEST_NGINX_VALGRIND_FACTOR} || 10) : 1 }

# A wait or deadline in seconds, stretched under valgrind.
sub stretch ($) { $_[0] * factor() }

sub suppression_files {
    my @f = ("$Top/t/valgrind.supp");
    push @f, grep { length } split /:/, $ENV{TEST_NGINX_VALGRIND_SUPP} // '';
    for (@f) { die "valgrind suppressions $_ not found\n" unless -f $_ }
    return @f;
}

# The command line that runs a program under memcheck, logging to $logdir.
sub command ($@) {
    my ($logdir, @program) = @_;
    make_path($logdir);
    chmod 0777, $logdir;
    my @opts = (
        '--tool=memcheck',
        '--leak-check=full',
        '--show-leak-kinds=definite',
        '--errors-for-leak-kinds=definite',
        # (Uninitialised values are found either way; =yes, through
        # TEST_NGINX_VALGRIND_OPTS, also says where one came from, for a
        # third more time.)
        '--track-origins=no',
        '--trace-children=yes',
        '--child-silent-after-fork=no',
        '--keep-debuginfo=yes',
        '--vgdb=no',
        '--num-callers=40',
        (map { "--suppressions=$_" } suppression_files()),
        "--log-file=$logdir/valgrind.%p.log",
        split(' ', $ENV{TEST_NGINX_VALGRIND_OPTS} // ''),
    );
    return ($ENV{VALGRIND} || 'valgrind', @opts, @program);
}

sub number { my $n = shift; $n =~ s/,//g; $n }

# Reads one process's log. Returns a hash: pid, parent, command, complete
# (the final ERROR SUMMARY is there), errors (occurrences of memory errors,
# a fatal signal counted as one), leaks (definite-leak records), leaked
# (bytes), suppressed (suppressed errors and leak records), and records
# (the text of every error and leak record, stacks included).
sub parse_log ($) {
    my $file = shift;
    my %p = (file => $file, complete => 0, errors => 0, leaks => 0, leaked => 0, suppressed => 0,
        records => [], signal => undef);
    ($p{pid}) = basename($file) =~ /(\d+)/;
    open my $fh, '<', $file or return \%p;
    my @paragraphs;
    my $cur = [];
    while (my $line = <$fh>) {
        chomp $line;
        $line =~ s/^==\d+==\s?// or $line =~ s/^--\d+--\s?// or next;
        if ($line =~ /^\s*$/) {
            push @paragraphs, $cur if @$cur;
            $cur = [];
            next;
        }
        push @$cur, $line;
    }
    push @paragraphs, $cur if @$cur;
    close $fh;

    my ($summary_errors, $error_paragraphs) = (0, 0);
    for my $para (@paragraphs) {
        my $first = $para->[0];
        for (@$para) {
            $p{command} = $1 if /^Command: (.*)/;
            $p{parent} = $1 if /^Parent PID: (\d+)/;
            if (/^ERROR SUMMARY: ([\d,]+) errors? from [\d,]+ contexts? \(suppressed: ([\d,]+) from/) {
                $p{complete} = 1;
                $summary_errors = number($1);
                $p{suppressed} += number($2);
            }
        }
        if ($first =~ /^([\d,]+)(?: \([\d,]+ direct, [\d,]+ indirect\))? bytes in [\d,]+ blocks are definitely lost/) {
            $p{leaks}++;
            $p{leaked} += number($1);
            push @{ $p{records} }, join "\n", @$para;
        } elsif ($first =~ /^Process terminating with default action of signal (\d+)/) {
            $p{signal} = $1;
            push @{ $p{records} }, join "\n", @$para;
        } elsif ($first =~ /^(?:Memcheck, |Copyright |Using Valgrind|Command: |Parent PID|HEAP SUMMARY|LEAK SUMMARY|ERROR SUMMARY|For lists of|For counts of|Reachable blocks|All heap blocks|To see them|Use --track|Warning:|WARNING|Downloading|Searching for|Memcheck:|The main thread stack|Thread \d+: status|If you believe)/i) {
            next;
        } elsif (grep { /^\s+(?:at|by) 0x/ } @$para) {
            $error_paragraphs++;
            push @{ $p{records} }, join "\n", @$para;
        }
    }
    # ERROR SUMMARY counts each occurrence, leak records included; without
    # it (a report cut short), the records seen so far.
    my $errors = $p{complete} ? $summary_errors - $p{leaks} : $error_paragraphs;
    $errors = $error_paragraphs if $errors < $error_paragraphs;
    $errors++ if defined $p{signal};
    $p{errors} = $errors;
    return \%p;
}

# Whether a process is alive and is one of ours under valgrind.
sub still_running ($) {
    my $pid = shift;
    return 0 unless kill 0, $pid;
    open my $fh, '<', "/proc/$pid/cmdline" or return 0;
    local $/;
    my $cmd = <$fh> // '';
    return $cmd =~ /valgrind|memcheck|nginx/;
}

# The processes of a run (pids from their logs' names) that have not
# finished their report and are still running: for a signal sent again.
sub running_pids ($) {
    my $logdir = shift;
    my @pids;
    for my $log (glob "$logdir/valgrind.*.log") {
        my ($pid) = basename($log) =~ /(\d+)/ or next;
        open my $fh, '<', $log or next;
        my $done = grep { /ERROR SUMMARY:/ } <$fh>;
        push @pids, $pid if !$done && still_running($pid);
    }
    return @pids;
}

sub sanitize ($) {
    my $s = shift;
    $s =~ s/[^A-Za-z0-9._#-]+/-/g;
    $s =~ s/^-+|-+$//g;
    return substr($s, 0, 80);
}

sub suite_name () {
    my $s = basename($0);
    $s =~ s/\.t$//;
    return $s;
}

# Reads the logs of one nginx run (the folder given to command()) once
# every process has exited (waiting up to `wait` seconds for stragglers),
# records them, and returns (clean, report): clean is false when a process
# shows an error, a definite leak or a cut-short report; report says which
# and holds valgrind's records (stacks) for the test output.
sub check ($$;%) {
    my ($logdir, $label, %opt) = @_;
    my @logs = sort glob "$logdir/valgrind.*.log";
    return (0, "valgrind wrote no log in $logdir") unless @logs;
    my $deadline = time + ($opt{wait} // stretch(3));
    my @procs;
    for my $log (@logs) {
        my $p = parse_log($log);
        while (!$p->{complete} && still_running($p->{pid}) && time < $deadline) {
            select(undef, undef, undef, 0.1);
            $p = parse_log($log);
        }
        # A worker left behind (its master was killed) is ended, by its pid;
        # its report stays cut short.
        if (!$p->{complete} && still_running($p->{pid})) {
            kill 'KILL', $p->{pid};
            $p->{straggler} = 1;
        }
        push @procs, $p;
    }
    my %in_run = map { $_->{pid} => 1 } @procs;
    my ($report, $clean) = ('', 1);
    my @lines;
    for my $p (@procs) {
        my $role = defined $p->{parent} && $in_run{ $p->{parent} } ? "child of $p->{parent}" : 'nginx';
        my $bad = $p->{errors} || $p->{leaks} || !$p->{complete};
        my $kept = '-';
        if ($bad) {
            $clean = 0;
            make_path(out_dir() . '/logs');
            $kept = out_dir() . '/logs/' . sanitize(suite_name() . "-$label") . "-$p->{pid}.log";
            copy($p->{file}, $kept);
            $report .= sprintf("valgrind: %s, pid %s (%s): %d error(s), %d definite leak(s) (%d bytes)%s; log %s\n",
                $label, $p->{pid}, $role, $p->{errors}, $p->{leaks}, $p->{leaked},
                $p->{complete} ? ''
                    : $p->{straggler} ? ', REPORT CUT SHORT (still running after nginx stopped: killed)'
                    : ', REPORT CUT SHORT (no ERROR SUMMARY: killed or not ended)', $kept);
            my @recs = @{ $p->{records} };
            my $shown = 0;
            for my $r (@recs) {
                last if ++$shown > 12;
                $report .= "$r\n\n";
            }
            $report .= "... " . (@recs - 12) . " more in the log\n" if @recs > 12;
        }
        push @lines, join("\t", suite_name(), $label, $p->{pid}, $role,
            !$p->{complete} ? 'incomplete' : $bad ? 'findings' : 'clean',
            $p->{errors}, $p->{leaks}, $p->{leaked}, $p->{suppressed}, $kept) . "\n";
    }
    record(@lines);
    return ($clean, $report);
}

# Appends lines to summary.tsv (with a header when it is new).
sub record (@) {
    make_path(out_dir());
    my $file = out_dir() . '/summary.tsv';
    open my $fh, '>>', $file or die "cannot write $file: $!";
    flock($fh, LOCK_EX);
    seek($fh, 0, 2);
    print $fh join("\t", qw(suite run pid role status errors leaks leaked_bytes suppressed log)) . "\n"
        if tell($fh) == 0;
    print $fh @_;
    close $fh;
}

1;
