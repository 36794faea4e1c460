package GatewayTest;

# Test servers for the suites: a throwaway PostgreSQL (and Redis) on
# loopback ports in a temporary folder. When the suite runner has started
# them already (TEST_NGINX_PG_PORT is set), nothing is started here; a .t
# run on its own starts its own and stops them when it ends.
#
# Environment for the configurations in the .t files:
#   TEST_NGINX_PG_PORT, TEST_NGINX_PG_DB, TEST_NGINX_PG_USER,
#   TEST_NGINX_PG_PASSWORD (has a space and a quote), TEST_NGINX_PG_SOCKET_DIR,
#   TEST_NGINX_PG_SERVER (address + keywords, for sqldb_server lines),
#   TEST_NGINX_CLOSED_PORT (a port where nothing listens).
#
# Which Redis: TEST_REDIS_SERVER and TEST_REDIS_CLI name the server and
# its client (redis-server and redis-cli unless set; valkey-server and
# valkey-cli run the cache suites against Valkey); the .t files start and
# ask them through $RedisServer and $RedisCli.
#
# Under valgrind (TEST_NGINX_USE_VALGRIND=1, see ValgrindCheck.pm),
# nginx_start runs nginx and the workers it forks under memcheck; each start
# is checked when it stops, exits or fails to start, and a start whose
# processes show findings is a failed test named "nginx_start #N at FILE
# line L". stretch() gives the suites' waits the same slack.

use strict;
use warnings;
use Exporter 'import';
use File::Temp qw(tempdir);
use IO::Socket::INET;
use POSIX qw(WNOHANG);
use Fcntl qw(:flock);
use Time::HiRes qw(sleep time);
use FindBin;
use File::Basename qw(dirname);
use lib dirname(__FILE__);
use ValgrindCheck ();
# Ports (free_port, listen_socket: never one given twice) and stopping nginx.
use NginxProcess qw(free_port listen_socket stop_nginx_pid);
# Requests on a connection of their own (exported from here too).
use HttpClient qw(http_send http_send_request http_read http_request http_get);
# Loaded before this file's END block is compiled, so that Test::Builder's
# own END runs after ours and counts what ours reports.
use Test::Builder ();

# A write to a socket the server has closed fails that request (EPIPE)
# instead of killing the test process (and leaving its servers behind).
$SIG{PIPE} = 'IGNORE';

our @EXPORT_OK = qw(http_request wait_until pg_server_line start_servers stop_servers psql rds rds_rows rds_command free_port pg_bin pg_stop pg_start
    pg_restart start_extra_pg start_standby_pg nginx_signal nginx_exited start_redis kill_redis redis_cli garbage_port
    nginx_start stop_nginx nginx_error_log http_send http_send_request http_read http_get stretch under_valgrind listen_socket pg_sessions
    redis_info redis_connections redis_numsub key_slot tls_files nginx_workers proc_status_kb cpu_seconds workers_idle_ok conf_line_of nginx_conf_test
    periodic_bytes hold_port release_port start_sentinel start_sentinel_set stop_sentinel sentinel_master_port sentinels_new_master
    redis_missing timed_request $RedisServer $RedisCli);

our $RedisServer = $ENV{TEST_REDIS_SERVER} || 'redis-server';
our $RedisCli    = $ENV{TEST_REDIS_CLI}    || 'redis-cli';

sub stretch ($) { ValgrindCheck::stretch($_[0]) }
sub under_valgrind () { ValgrindCheck::enabled() }

my $PgBin = $ENV{PG_BIN} || (sort { $b cmp $a } glob '/usr/lib/postgresql/*/bin')[0];
our ($PgDir, $PgData);
our (@Redis, $Garbage);

sub pg_bin { $PgBin }

# Runs a server command as the postgres user when we are root (initdb
# refuses root); its output goes to a log unless it fails.
sub run_as_owner {
    return if try_as_owner(@_);
    system('cat', "$PgDir/cmd.log");
    die "failed: @_\n";
}

# The same, saying whether it succeeded (its output in $PgDir/cmd.log).
sub try_as_owner {
    my @cmd = @_;
    my $line = join ' ', map { my $a = $_; $a =~ s/'/'\\''/g; "'$a'" } @cmd;
    my $log = "$PgDir/cmd.log";
    my $sh = "$line >>'$log' 2>&1";
    my @run = $> == 0 ? ('su', 'postgres', '-s', '/bin/sh', '-c', $sh) : ('/bin/sh', '-c', $sh);
    return system(@run) == 0;
}

sub schema_sql {
    my $f = "$FindBin::Bin/lib/schema.sql";
    $f = 't/lib/schema.sql' unless -f $f;
    open my $fh, '<', $f or die "cannot read $f: $!";
    local $/;
    return <$fh>;
}

my @Instances;

# initdb + start on a free port; the instance has the test role and
# database. Options: ssl => 1 (a self-signed certificate, cert.pem in the
# instance's folder), ipv6 => 1 (listen on ::1 too).
# Returns { dir, data, port, super }.
# A folder for a PostgreSQL instance, owned by the postgres user when root.
sub pg_dir {
    my $dir = tempdir('ngx-gateway-pg-XXXXXX', TMPDIR => 1, CLEANUP => 0);
    if ($> == 0) {
        my (undef, undef, $uid, $gid) = getpwnam('postgres') or die "no postgres user\n";
        chown $uid, $gid, $dir;
    }
    chmod 0755, $dir;
    return $dir;
}

# Polls $what every 50 ms until it is true (1) or $seconds pass (0); the
# deadline is stretched under valgrind.
sub wait_until {
    my ($what, $seconds) = @_;
    my $deadline = time + stretch($seconds);
    while (time < $deadline) {
        return 1 if $what->();
        sleep 0.05;
    }
    return 0;
}

# The bytes chr($byte->($i)) for $i from $first (0 unless given) on, $len
# of them, where $byte->($i) repeats every $period values of $i: the same
# string as join('', map { chr $byte->($_) } $first .. $first + $len - 1),
# made from one period (a map over millions of values takes seconds).
sub periodic_bytes {
    my ($len, $period, $byte, $first) = @_;
    $first //= 0;
    my $unit = join '', map { chr $byte->($_) } $first .. $first + $period - 1;
    return substr($unit x (int($len / $period) + 1), 0, $len);
}

# The settings of every test instance (port and folder come after them).
sub pg_settings {
    my ($listen) = @_;
    return "listen_addresses = '$listen'\n"
        . "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n"
        . "log_min_messages = fatal\n";
}

# initdb in $dir/data with a superuser password; returns it. (WAL segments
# of 1 MB, not 16: every file's instance is a copy of the template, which
# is then 16 MB smaller.)
sub pg_initdb {
    my ($dir) = @_;
    local $PgDir = $dir;
    my $super = 'super-' . int(rand(1e9));
    open my $pw, '>', "$dir/pw" or die $!;
    print $pw "$super\n";
    close $pw;
    chmod 0644, "$dir/pw";
    run_as_owner("$PgBin/initdb", '-D', "$dir/data", '-U', 'postgres', '-A', 'scram-sha-256',
        "--pwfile=$dir/pw", '--no-sync', '-E', 'UTF8', '--locale=C', '--wal-segsize=1');
    return $super;
}

# The test role, database and schema in a running instance.
sub pg_populate {
    my ($port, $super) = @_;
    local $ENV{TEST_NGINX_PG_PORT} = $port;
    local $ENV{TEST_NGINX_PG_SUPERPW} = $super;
    psql("create role gateway login password 'it''s a secret'", 'postgres');
    psql("create database gateway_test owner gateway", 'postgres');
    local $ENV{TEST_NGINX_PG_PASSWORD} = "it's a secret";
    psql(schema_sql(), 'gateway_test', 'gateway');
}

# With TEST_NGINX_PG_TEMPLATE (a path; make test sets one per run), the
# first instance of the run is made there once (initdb, role, database,
# schema; under a lock, as files run side by side) and every instance after
# it starts from a copy: a copy takes half the time of initdb. Returns the
# template's folder and superuser password, or nothing without one.
sub pg_template {
    my $t = $ENV{TEST_NGINX_PG_TEMPLATE} or return;
    open my $lock, '>>', "$t.lock" or die "cannot open $t.lock: $!";
    flock($lock, LOCK_EX) or die "cannot lock $t.lock: $!";
    if (!-e "$t/ready") {
        system('rm', '-rf', $t);
        mkdir $t or die "cannot make $t: $!";
        if ($> == 0) {
            my (undef, undef, $uid, $gid) = getpwnam('postgres') or die "no postgres user\n";
            chown $uid, $gid, $t;
        }
        chmod 0755, $t;
        local $PgDir = $t;
        my $super = pg_initdb($t);
        my $port = free_port();
        open my $conf, '>>', "$t/data/postgresql.conf" or die $!;
        print $conf pg_settings('127.0.0.1'), "port = $port\nunix_socket_directories = '$t'\n";
        close $conf;
        run_as_owner("$PgBin/pg_ctl", '-D', "$t/data", '-l', "$t/server.log", '-w', '-s', 'start');
        my $ok = eval { pg_populate($port, $super); 1 };
        my $why = $@;
        run_as_owner("$PgBin/pg_ctl", '-D', "$t/data", '-m', 'fast', '-w', '-s', 'stop');
        die $why unless $ok;
        open my $r, '>', "$t/ready" or die $!;
        close $r;
    }
    close $lock;
    open my $pw, '<', "$t/pw" or die "cannot read $t/pw: $!";
    chomp(my $super = <$pw>);
    return ($t, $super);
}

sub new_pg_instance {
    my %opt = @_;
    die "PostgreSQL server binaries not found (set PG_BIN)\n" unless $PgBin && -x "$PgBin/initdb";
    my $dir = pg_dir();
    local $PgDir = $dir;
    my %pg = (dir => $dir, data => "$dir/data", port => free_port());
    push @Instances, \%pg;
    my ($template, $super) = pg_template();
    if ($template) {
        run_as_owner('cp', '-a', "$template/data", $pg{data});
        $pg{super} = $super;
    } else {
        $pg{super} = pg_initdb($dir);
    }
    open my $conf, '>>', "$pg{data}/postgresql.conf" or die $!;
    my $listen = $opt{ipv6} ? '127.0.0.1,::1' : '127.0.0.1';
    print $conf pg_settings($listen), "port = $pg{port}\nunix_socket_directories = '$dir'\n";
    if ($opt{ssl}) {
        system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost "
            . "-keyout '$pg{data}/server.key' -out '$pg{data}/server.crt' >/dev/null 2>&1") == 0
            or die "openssl failed\n";
        system('cp', "$pg{data}/server.crt", "$dir/cert.pem");
        chmod 0644, "$dir/cert.pem";
        if ($> == 0) {
            my (undef, undef, $uid, $gid) = getpwnam('postgres');
            chown $uid, $gid, "$pg{data}/server.key", "$pg{data}/server.crt";
        }
        chmod 0600, "$pg{data}/server.key";
        print $conf "ssl = on\n";
    }
    close $conf;
    if ($opt{ipv6}) {
        open my $hba, '>>', "$pg{data}/pg_hba.conf" or die $!;
        print $hba "host all all ::1/128 scram-sha-256\n";
        close $hba;
    }
    # The port was free when it was chosen; a file running beside this one
    # may have taken it since (a listener, or a connection's own end): then
    # another port, twice at most. (The last "port =" of the file counts.)
    for my $try (1 .. 3) {
        last if try_as_owner("$PgBin/pg_ctl", '-D', $pg{data}, '-l', "$dir/server.log", '-w', '-s', 'start');
        my $why = '';
        if (open my $fh, '<', "$dir/server.log") { local $/; $why = <$fh> // '' }
        if ($try == 3 || $why !~ /could not bind|Address already in use|could not create any TCP\/IP sockets/) {
            system('cat', "$dir/cmd.log", "$dir/server.log");
            die "failed: $PgBin/pg_ctl start (port $pg{port})\n";
        }
        $pg{port} = free_port();
        open my $more, '>>', "$pg{data}/postgresql.conf" or die $!;
        print $more "port = $pg{port}\n";
        close $more;
    }
    pg_populate($pg{port}, $pg{super}) unless $template;
    return \%pg;
}

sub start_pg {
    my $pg = new_pg_instance();
    ($PgDir, $PgData) = ($pg->{dir}, $pg->{data});
    $ENV{TEST_NGINX_PG_PORT} = $pg->{port};
    $ENV{TEST_NGINX_PG_SOCKET_DIR} = $pg->{dir};
    $ENV{TEST_NGINX_PG_SUPERPW} = $pg->{super};
    $ENV{TEST_NGINX_PG_DATA} = $pg->{data};
    $ENV{TEST_NGINX_PG_DB} = 'gateway_test';
    $ENV{TEST_NGINX_PG_USER} = 'gateway';
    $ENV{TEST_NGINX_PG_PASSWORD} = "it's a secret";
}

# A second server with the same role, password and schema (for failover
# tests); stopped when the test file ends.
sub start_extra_pg { new_pg_instance(@_) }

# A streaming standby of an instance (pg_basebackup -R as the superuser,
# which has REPLICATION; initdb's pg_hba lets it in from 127.0.0.1), on its
# own port and folder; hot standby. Returns { dir, data, port, super }.
sub start_standby_pg {
    my ($primary) = @_;
    my $dir = pg_dir();
    local $PgDir = $dir;
    my %pg = (dir => $dir, data => "$dir/data", port => free_port(), super => $primary->{super});
    push @Instances, \%pg;
    run_as_owner("$PgBin/pg_basebackup", '-d',
        "host=127.0.0.1 port=$primary->{port} user=postgres password=$primary->{super}",
        '-D', $pg{data}, '-R', '-X', 'stream', '-c', 'fast', '--no-sync');
    open my $conf, '>>', "$pg{data}/postgresql.conf" or die $!;
    print $conf "port = $pg{port}\nunix_socket_directories = '$dir'\nhot_standby = on\n";
    close $conf;
    run_as_owner("$PgBin/pg_ctl", '-D', $pg{data}, '-l', "$dir/server.log", '-w', '-s', 'start');
    return \%pg;
}

# A sqldb_server line's arguments for the test server, with an
# application_name by which pg_stat_activity tells the gateway's connections.
sub pg_server_line {
    my ($app) = @_;
    return "127.0.0.1:$ENV{TEST_NGINX_PG_PORT} dbname=$ENV{TEST_NGINX_PG_DB} user=$ENV{TEST_NGINX_PG_USER} "
        . "\"password=$ENV{TEST_NGINX_PG_PASSWORD}\" application_name=$app";
}

sub set_derived_env {
    $ENV{TEST_NGINX_PG_SERVER} = "127.0.0.1:$ENV{TEST_NGINX_PG_PORT} dbname=$ENV{TEST_NGINX_PG_DB} "
        . "user=$ENV{TEST_NGINX_PG_USER} \"password=$ENV{TEST_NGINX_PG_PASSWORD}\"";
    $ENV{TEST_NGINX_CLOSED_PORT} ||= free_port();
    $ENV{TEST_NGINX_SILENT_PORT} = silent_port();
}

# Runs SQL through psql as the superuser (or USER); returns its output.
sub psql {
    my ($sql, $db, $user) = @_;
    $db ||= $ENV{TEST_NGINX_PG_DB};
    my $pw = $user ? $ENV{TEST_NGINX_PG_PASSWORD} : $ENV{TEST_NGINX_PG_SUPERPW};
    local $ENV{PGPASSWORD} = $pw;
    open my $fh, '-|', 'psql', '-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-h', '127.0.0.1',
        '-p', $ENV{TEST_NGINX_PG_PORT}, '-U', $user || 'postgres', '-d', $db, '-c', $sql
        or die "psql: $!";
    local $/;
    my $out = <$fh>;
    close $fh or die "psql failed for: $sql\n";
    $out = '' unless defined $out;
    $out =~ s/\n+\z//;
    return $out;
}

# The sessions of an application_name (a sqldb_server's application_name=,
# or ngx_gateway's own) in pg_stat_activity, a number.
sub pg_sessions {
    my ($app) = @_;
    return psql("select count(*) from pg_stat_activity where application_name = '$app'") + 0;
}

# Stops and starts a test server (for tests of a server that goes away):
# the main one, or an instance from start_extra_pg.
# While it is stopped its port is held (hold_port): a start lets it go.
sub pg_ctl {
    my ($pg, @args) = @_;
    my $dir = $pg ? $pg->{dir} : $ENV{TEST_NGINX_PG_SOCKET_DIR};
    my $port = $pg ? $pg->{port} : $ENV{TEST_NGINX_PG_PORT};
    local $PgDir = $dir;
    die "pg_ctl restart: stop, then start (the port is held between)\n" if $args[-1] eq 'restart';
    release_port($port) if $args[-1] eq 'start';
    run_as_owner("$PgBin/pg_ctl", '-D', "$dir/data", '-w', '-s', @args);
    hold_port($port) if $args[-1] eq 'stop';
}
sub pg_stop { pg_ctl($_[0], '-m', 'fast', 'stop') }
sub pg_start { my $pg = $_[0]; pg_ctl($pg, '-l', ($pg ? $pg->{dir} : $ENV{TEST_NGINX_PG_SOCKET_DIR}) . '/server.log', 'start') }
sub pg_restart { pg_stop($_[0]); pg_start($_[0]) }

# A port whose server a test stopped or killed, and will start again there
# (or wants connections to it refused): while the server is down the port
# stays bound by this process, not listening, so that connecting is
# refused and no file running beside this one is given the port for a
# server of its own (the kernel hands out no port that a socket holds).
# release_port lets it go, just before a server starts on it again.
my %Held;
sub hold_port {
    my ($port) = @_;
    return if $Held{$port};
    $Held{$port} = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port, ReuseAddr => 1, Proto => 'tcp')
        or die "holding port $port: $!";
}
sub release_port {
    my ($port) = @_;
    close(delete $Held{$port}) if $Held{$port};
}

# A port that accepts TCP connections (the kernel completes the handshake)
# but never answers: for connect timeouts.
my $Silent;
sub silent_port {
    $Silent ||= listen_socket(64);
    return $Silent->sockport;
}

my $Started = 0;

sub start_servers {
    if (!$ENV{TEST_NGINX_PG_PORT}) {
        start_pg();
        $Started = 1;
    }
    set_derived_env();
}

sub stop_servers {
    for my $pg (@Instances) {
        next unless -d $pg->{data};
        local $PgDir = $pg->{dir};
        # (One a test stopped already has no pid file: nothing to stop.)
        eval { run_as_owner("$PgBin/pg_ctl", '-D', $pg->{data}, '-m', 'immediate', '-s', 'stop') }
            if -e "$pg->{data}/postmaster.pid";
        system('rm', '-rf', $pg->{dir});
    }
    @Instances = ();
}

# The process that started the servers (a child the test forked, whose exec
# failed and which exits, runs END blocks too: it must not stop them).
my $Owner = $$;

END {
    return unless $$ == $Owner;
    my $rc = $?;
    stop_nginx();
    stop_servers();
    stop_redis();
    stop_sentinels();
    if ($Garbage) { kill 'KILL', $Garbage->{pid}; waitpid($Garbage->{pid}, 0) }
    $? = $rc;
}

# --- RDS builders for expected bodies -------------------------------------

# rds_rows([[name, oid], ...], [[v, undef, ...], ...]): a result set stream.
sub rds_rows {
    my ($cols, $rows, %h) = @_;
    my $s = rds_header(2, $h{affected} || 0, scalar @$cols);
    for my $c (@$cols) {
        my ($name, $oid) = @$c;
        $s .= pack('vvv', std_type($oid), $oid & 0xffff, length $name) . $name;
    }
    for my $r (@$rows) {
        $s .= "\x01";
        for my $v (@$r) {
            $s .= defined $v ? pack('V', length $v) . $v : pack('V', 0xffffffff);
        }
    }
    # Without columns there is no row list at all.
    return @$cols ? $s . "\x00" : $s;
}

# rds_command(affected): a statement without rows.
sub rds_command {
    my ($affected) = @_;
    return rds_header(1, $affected, 0);
}

sub rds_header {
    my ($status, $affected, $ncols) = @_;
    return pack('CVCvvv', 0, 3, 0, 0, $status, 0) . pack('Q<Q<', $affected, 0) . pack('v', $ncols);
}

my %Std = (20 => 0x0001, 1560 => 0x8002, 1562 => 0x8003, 16 => 0xC004, 18 => 0x8005,
    19 => 0x8006, 25 => 0x8006, 1043 => 0x8006, 1082 => 0x8007, 701 => 0x4008, 23 => 0x0009,
    1186 => 0x400A, 1700 => 0x400B, 700 => 0x400C, 21 => 0x000D, 1266 => 0x800E, 1083 => 0x800F,
    1184 => 0x8010, 1114 => 0x8011, 142 => 0x8012, 17 => 0x8013);

sub std_type { my $oid = shift; exists $Std{$oid} ? $Std{$oid} : 0x8000 }

# For data-driven suites: a block without its own http_config gets an
# upstream "database" with the test server (and the block's `--- keepalive`
# line, if any, inside it).
sub default_upstream {
    Test::Nginx::Socket::add_block_preprocessor(sub {
        my $block = shift;
        return if defined $block->http_config;
        my $extra = $block->keepalive // '';
        $block->set_value(http_config => "upstream database { sqldb_server $ENV{TEST_NGINX_PG_SERVER}; $extra }");
    });
}

# A single text value in one column: the stream SPEC.md shows.
sub rds { my ($name, $value) = @_; rds_rows([[$name, 25]], [[$value]]) }


# --- Redis -----------------------------------------------------------------


# Starts a redis-server on a free loopback port (options: password => ...).
# Returns { port, pid, dir }; stopped when the test file ends.
sub start_redis {
    my %opt = @_;
    my $bin = $RedisServer;
    my $dir = tempdir('ngx-gateway-redis-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $dir;    # nginx workers reach the socket in it
    # (port => N: on that port, e.g. the one of an instance killed before.)
    my $port = $opt{port} // free_port();
    release_port($port);
    my @args = ('--port', $port, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
        '--dir', $dir, '--logfile', "$dir/redis.log", '--daemonize', 'no');
    push @args, '--requirepass', $opt{password} if defined $opt{password};
    push @args, '--unixsocket', "$dir/redis.sock", '--unixsocketperm', '777' if $opt{unix};
    # More options (args => [...]; "$dir" in one is the instance's folder).
    push @args, map { (my $a = $_) =~ s/\$dir\b/$dir/g; $a } @{ $opt{args} || [] };
    # TLS (options: tls => { cert, key, ca, clients => 'no' | 'yes' }): on a
    # second port, beside the plain one (which redis_cli uses).
    my $tls_port;
    if (my $t = $opt{tls}) {
        $tls_port = free_port();
        push @args, '--tls-port', $tls_port, '--tls-cert-file', $t->{cert}, '--tls-key-file', $t->{key},
            '--tls-ca-cert-file', $t->{ca}, '--tls-auth-clients', $t->{clients} // 'no';
    }
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if (!$pid) {
        open STDOUT, '>', '/dev/null';
        exec $bin, @args;
        exit 127;
    }
    my %r = (port => $port, pid => $pid, dir => $dir, password => $opt{password}, socket => "$dir/redis.sock",
        tls_port => $tls_port);
    push @Redis, \%r;
    for (1 .. 500) {
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port);
        if ($s) { close $s; return \%r }
        sleep 0.01;
    }
    die "$bin did not start on port $port\n";
}

# Runs a command through redis-cli against an instance; returns its output.
sub redis_cli {
    my ($r, @cmd) = @_;
    my @auth = defined $r->{password} ? ('--no-auth-warning', '-a', $r->{password}) : ();
    # (Bounded: a stopped server would hold the suite.)
    open my $fh, '-|', 'timeout', '-s', 'KILL', '30', $RedisCli, '-p', $r->{port}, @auth, @cmd or die "$RedisCli: $!";
    local $/;
    my $out = <$fh> // '';
    close $fh;
    $out =~ s/\n+\z//;
    return $out;
}

# One field of an instance's INFO section (undef when it is not there).
sub redis_info {
    my ($r, $section, $name) = @_;
    my ($v) = redis_cli($r, 'INFO', $section) =~ /^\Q$name\E:(\d+)/m;
    return $v;
}

# The connections instances accepted (total_connections_received, summed),
# as Redis counts them: redis-cli's own included, one a redis_cli call
# (this one's too).
sub redis_connections {
    my $n = 0;
    $n += redis_info($_, 'stats', 'total_connections_received') // 0 for @_;
    return $n;
}

# The subscribers of a channel on an instance (PUBSUB NUMSUB), -1 when it
# does not answer.
sub redis_numsub {
    my ($r, $channel) = @_;
    my (undef, $n) = split /\n/, redis_cli($r, 'pubsub', 'numsub', $channel);
    return $n // -1;
}

# The slot of a key, as Redis Cluster computes it: CRC16/XMODEM of the key
# (of its hash tag, the part between the first { and the next }, when that
# is not empty), modulo 16384.
sub crc16 {
    my $crc = 0;
    for my $c (unpack 'C*', shift) {
        $crc ^= $c << 8;
        for (1 .. 8) { $crc = $crc & 0x8000 ? (($crc << 1) ^ 0x1021) & 0xffff : ($crc << 1) & 0xffff }
    }
    return $crc;
}

sub key_slot {
    my $k = shift;
    $k = $1 if $k =~ /^[^{]*\{([^}]+)\}/;
    return crc16($k) & 16383;
}

# Certificates for TLS tests, in a temporary folder open to nginx's workers
# (returned): two authorities, ca.crt and other.crt (with their .key); and
# signed by ca, server.crt (CN and subjectAltName localhost) and client.crt
# (CN gateway-client), with their .key. openssl's output goes to
# openssl.log there. (P-256 keys: an RSA key takes openssl a third of a
# second of CPU to make, an EC key a millisecond.)
sub tls_files {
    my $d = tempdir('ngx-gateway-tls-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $d;
    my $openssl = sub { system("openssl @_ >>$d/openssl.log 2>&1") == 0 or die "openssl @_ failed\n" };
    for my $ca (qw(ca other)) {
        $openssl->("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=test-$ca -keyout $d/$ca.key -out $d/$ca.crt");
    }
    open my $ext, '>', "$d/server.ext" or die $!;
    print $ext "subjectAltName = DNS:localhost\n";
    close $ext;
    for my $who (qw(server client)) {
        $openssl->("req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" . ($who eq 'server' ? 'localhost' : 'gateway-client')
            . " -keyout $d/$who.key -out $d/$who.csr");
        $openssl->("x509 -req -in $d/$who.csr -CA $d/ca.crt -CAkey $d/ca.key -CAcreateserial -days 2 -out $d/$who.crt"
            . ($who eq 'server' ? " -extfile $d/server.ext" : ''));
    }
    chmod 0644, glob("$d/*");
    return $d;
}

# Kills an instance at once (SIGKILL: no goodbye to its clients or peers).
# Its ports stay held (hold_port) until start_redis(port => ...) or
# release_port.
sub kill_redis {
    my ($r) = @_;
    kill 'KILL', $r->{pid};
    waitpid($r->{pid}, 0);
    @Redis = grep { $_ != $r } @Redis;
    hold_port($_) for grep { defined } $r->{port}, $r->{tls_port};
}

sub stop_redis {
    for my $r (@Redis) {
        kill 'TERM', $r->{pid};
        waitpid($r->{pid}, 0);
    }
    @Redis = ();
}

# The port of the master Sentinel $s names for the set m (0: none).
sub sentinel_master_port {
    my ($s) = @_;
    my @a = split /\n/, redis_cli($s, 'SENTINEL', 'get-master-addr-by-name', 'm');
    return $a[1] // 0;
}

# The port of the master every Sentinel of @sentinels names once they agree
# on one other than $old (the others learn of a failover from its leader
# within a second or so), waiting up to 15 s; the last one named otherwise.
sub sentinels_new_master {
    my ($old, @sentinels) = @_;
    my $new;
    wait_until(sub {
        my %named = map { (sentinel_master_port($_) => 1) } @sentinels;
        ($new) = keys %named;
        keys %named == 1 && $new ne $old;
    }, 15);
    return $new;
}

# The keys of @keys ("/kv/" and each) that $on does not hold (MGET, 500 at a
# time: a value stored by the suites is never empty, so an empty line, or
# none, is a key missing).
sub redis_missing {
    my ($on, @keys) = @_;
    my @gone;
    while (my @chunk = splice(@keys, 0, 500)) {
        my @v = split /\n/, redis_cli($on, 'MGET', map { "/kv/$_" } @chunk), -1;
        push @gone, map { $chunk[$_] } grep { !defined $v[$_] || $v[$_] eq '' } 0 .. $#chunk;
    }
    return @gone;
}

# One request to nginx on $port, timed: (status, head, seconds); status 0
# when it has no answer within 20 s (given up, and counted as such).
sub timed_request {
    my ($port, $method, $path, $body) = @_;
    my $t = time;
    my ($st, $head) = (0, '');
    eval {
        local $SIG{ALRM} = sub { die "no answer\n" };
        alarm(int(stretch(20)));
        my @r = http_request($port, $method, $path, $body);
        ($st, $head) = @r[0, 2];
        alarm(0);
    };
    alarm(0);
    return ($st, $head, time - $t);
}

# A Sentinel ($RedisServer --sentinel, so that TEST_REDIS_SERVER=valkey-server
# runs one of Valkey's) watching the master set "m" on 127.0.0.1:$master_port
# with `quorum` (2 unless told), a master down after 700 ms. Killed at the
# end, or by stop_sentinel (its port then held). With tls => the folder of
# tls_files: TLS on a second port (tls_port; the plain one stays, for
# redis_cli), and TLS to the servers (tls-replication: $master_port is then
# the master's TLS port). With password => the Sentinel's own requirepass
# (its clients send AUTH; so does redis_cli, and so do the other Sentinels
# of a set, which must have the same one); with auth_pass => (and
# auth_user =>) the password (and ACL user) the Sentinel sends to the
# servers of the set (sentinel auth-pass, sentinel auth-user).
my @Sentinels;
sub start_sentinel {
    my ($master_port, %opt) = @_;
    my $dir = tempdir('ngx-gateway-sentinel-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    my $port = free_port();
    release_port($port);
    my ($tls, $tls_port) = ('');
    if (my $d = $opt{tls}) {
        $tls_port = free_port();
        release_port($tls_port);
        $tls = "tls-port $tls_port\ntls-cert-file $d/server.crt\ntls-key-file $d/server.key\n"
            . "tls-ca-cert-file $d/ca.crt\ntls-auth-clients no\ntls-replication yes\n";
    }
    my $auth = '';
    $auth .= "requirepass $opt{password}\n" if defined $opt{password};
    $auth .= "sentinel auth-user m $opt{auth_user}\n" if defined $opt{auth_user};
    $auth .= "sentinel auth-pass m $opt{auth_pass}\n" if defined $opt{auth_pass};
    open my $fh, '>', "$dir/sentinel.conf" or die $!;
    print $fh "port $port\nbind 127.0.0.1\ndir $dir\nlogfile $dir/sentinel.log\n$tls",
        "sentinel monitor m 127.0.0.1 $master_port ", $opt{quorum} // 2, "\n",
        "sentinel down-after-milliseconds m 700\n",
        "sentinel failover-timeout m 4000\n",
        "sentinel parallel-syncs m 2\n", $auth;
    close $fh;
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if (!$pid) {
        open STDOUT, '>', '/dev/null';
        exec $RedisServer, "$dir/sentinel.conf", '--sentinel';
        exit 127;
    }
    my %s = (port => $port, pid => $pid, dir => $dir, tls_port => $tls_port, password => $opt{password});
    push @Sentinels, \%s;
    wait_until(sub { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) }, 10)
        or die "sentinel did not start on port $port\n";
    # After a switch a Sentinel connects to the new master on the link it
    # had to the old one, not sooner than its ping period (1 s) after its
    # last attempt there, so a switch soon after a retry leaves the new
    # master unanswered for longer than down-after-milliseconds (700 ms):
    # it is found down too, and the Sentinels fail over again, on their
    # own (seen in t/223 one run in ten, and in t/217 and t/218 beside
    # busy builds). A ping period of 300 ms keeps each wait under 700 ms.
    # (SENTINEL DEBUG: Redis 7 and Valkey.)
    redis_cli(\%s, 'SENTINEL', 'DEBUG', 'ping-period', 300) eq 'OK'
        or die "sentinel on port $port did not take SENTINEL DEBUG ping-period\n";
    return \%s;
}
# A master set "m" for the Sentinel suites: a master, two replicas in sync
# with it, and three Sentinels that know it, the replicas and each other.
# (No delay before a full sync: a replica that has not synced would be
# promoted empty.) Returns the master, the replicas and the Sentinels.
# Options: password => the servers' requirepass (the default user's; each
# server's masterauth too, so that any of them can be a replica); acl =>
# [rules], ACL SETUSER on every server before any replica or Sentinel
# comes ("name on >pw ~* &* +@all", split on spaces); args => [more server
# options] ('--masteruser', NAME: replication as an ACL user of the
# rules); sentinel => {options of start_sentinel} for each Sentinel.
sub start_sentinel_set {
    my %opt = @_;
    my @fast = ('--repl-diskless-sync-delay', '0', @{ $opt{args} || [] });
    push @fast, '--masterauth', $opt{password} if defined $opt{password} && !grep { $_ eq '--masterauth' } @fast;
    my $server = sub {
        my $r = start_redis(password => $opt{password}, args => [@fast, @_]);
        for my $rule (@{ $opt{acl} || [] }) {
            redis_cli($r, 'ACL', 'SETUSER', split / /, $rule) eq 'OK' or die "ACL SETUSER $rule: refused\n";
        }
        return $r;
    };
    my $master = $server->();
    my @replicas = map { $server->('--replicaof', '127.0.0.1', $master->{port}) } 1 .. 2;
    wait_until(sub { !grep { redis_cli($_, 'INFO', 'replication') !~ /master_link_status:up/ } @replicas }, 20)
        or die "the replicas did not sync\n";
    my @sentinels = map { start_sentinel($master->{port}, %{ $opt{sentinel} || {} }) } 1 .. 3;
    wait_until(sub {
        !grep {
            my $m = redis_cli($_, 'SENTINEL', 'master', 'm');
            $m !~ /num-other-sentinels\n2\n/ || $m !~ /num-slaves\n2\n/
        } @sentinels
    }, 20) or die "the Sentinels did not find each other and the replicas\n";
    return ($master, \@replicas, \@sentinels);
}

sub stop_sentinel {
    my ($s) = @_;
    kill 'KILL', $s->{pid};
    waitpid($s->{pid}, 0);
    @Sentinels = grep { $_ != $s } @Sentinels;
    hold_port($s->{port});
}
sub stop_sentinels {
    kill 'KILL', $_->{pid} for @Sentinels;
    waitpid($_->{pid}, 0) for @Sentinels;
    @Sentinels = ();
}

# A server that answers anything with bytes that are not RESP.
sub garbage_port {
    return $Garbage->{port} if $Garbage;
    my $l = listen_socket(16);
    my $pid = fork;
    if (!$pid) {
        while (my $c = $l->accept) {
            sysread($c, my $buf, 65536);
            syswrite($c, "hello there\r\n");
            close $c;
        }
        exit 0;
    }
    $Garbage = { port => $l->sockport, pid => $pid };
    close $l;
    return $Garbage->{port};
}

# --- nginx for the tests that need several clients at once -----------------
# (the data-driven format sends one request at a time)

our ($NginxPid, $NginxRoot);
my ($Starts, $StartLabel, $VgDir) = (0);

# Under valgrind, once the nginx of a start has exited: a failed test with
# valgrind's records when one of its processes shows findings.
sub valgrind_verdict {
    return unless $VgDir;
    my ($dir, $label) = ($VgDir, $StartLabel);
    $VgDir = undef;
    my ($clean, $report) = ValgrindCheck::check($dir, $label);
    return if $clean;
    my $tb = Test::Builder->new;
    $tb->ok(0, "$label - valgrind: no memory error, definite leak or cut-short report in nginx");
    $tb->diag($report);
}

# Starts nginx (foreground, our child) with an http{} body; returns its port.
sub nginx_start {
    my ($http, %opt) = @_;
    stop_nginx();
    my (undef, $file, $line) = caller;
    $StartLabel = sprintf('nginx_start #%d at %s line %d', ++$Starts, $file, $line);
    $NginxRoot = tempdir('ngx-gateway-nginx-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $NginxRoot;    # workers (nobody) use the temp folders in it
    mkdir "$NginxRoot/logs";
    # (port => N: on that port again, e.g. nginx started anew for its clients.)
    my $port = $opt{port} // free_port();
    my $modules = join '', map { "load_module $_;\n" } grep { length } split /[\s:]+/, $ENV{TEST_NGINX_LOAD_MODULES} || '';
    $modules = ($opt{main} // '') . $modules;
    my $workers = $opt{workers} || 1;
    (my $body = $http) =~ s/\$(TEST_NGINX_[_A-Z0-9]+)/$ENV{$1}/g;
    $body =~ s/\$PORT\b/$port/g;
    open my $fh, '>', "$NginxRoot/nginx.conf" or die $!;
    print $fh "daemon off;\nmaster_process on;\nworker_processes $workers;\npid $NginxRoot/logs/nginx.pid;\n",
        "error_log $NginxRoot/logs/error.log " . ($ENV{TEST_NGINX_LOG_LEVEL} || 'info') . ";\n$modules",
        "events { worker_connections 1024; }\n",
        "http {\n access_log $NginxRoot/logs/access.log;\n client_body_temp_path $NginxRoot/body;\n",
        " proxy_temp_path $NginxRoot/proxy;\n fastcgi_temp_path $NginxRoot/fcgi;\n uwsgi_temp_path $NginxRoot/uwsgi;\n",
        " scgi_temp_path $NginxRoot/scgi;\n$body\n}\n";
    close $fh;
    my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
    # (Option prefix: nginx's prefix, for configurations that name files
    # relative to it, such as Debian's module load files.)
    my @cmd = ($bin, '-p', $opt{prefix} // "$NginxRoot/", '-c', "$NginxRoot/nginx.conf");
    if (ValgrindCheck::enabled()) {
        # Master and workers (valgrind follows the forks), a log each.
        $VgDir = "$NginxRoot/valgrind";
        @cmd = ValgrindCheck::command($VgDir, @cmd);
    }
    $NginxPid = fork;
    if (!$NginxPid) {
        open STDERR, '>>', "$NginxRoot/logs/stderr.log";
        exec @cmd;
        exit 127;
    }
    my $deadline = time + stretch(10);
    while (time < $deadline) {
        if (waitpid($NginxPid, WNOHANG) == $NginxPid) {
            $NginxPid = undef;
            my $why = `cat $NginxRoot/logs/stderr.log`;
            valgrind_verdict();
            die "nginx exited: $why";
        }
        # The listening socket takes connections before the master has its
        # signal handlers (nginx writes its pid file after them): a QUIT in
        # between would kill it (a slow start under valgrind shows it).
        if (-s "$NginxRoot/logs/nginx.pid") {
            my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port);
            if ($s) { close $s; return $port }
        }
        sleep 0.01;
    }
    stop_nginx();
    die "nginx did not start\n";
}

# The text of the configuration line that an `nginx -t` message names (its
# last "in FILE:LINE"), to check that it is the directive at fault.
sub conf_line_of {
    my ($msg) = @_;
    my @at = ($msg // '') =~ /\bin (\S+):(\d+)/g;
    return '' unless @at;
    my ($file, $n) = @at[-2, -1];
    open my $fh, '<', $file or return '';
    my @lines = <$fh>;
    return $lines[$n - 1] // '';
}

# `nginx -t` of the configuration nginx_start wrote last: its output.
sub nginx_conf_test {
    my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
    return scalar `$bin -t -p $NginxRoot/ -c $NginxRoot/nginx.conf 2>&1`;
}

sub nginx_signal {
    my ($sig) = @_;
    kill $sig, $NginxPid if $NginxPid;
}

# True when the nginx master started by nginx_start has exited (reaped here).
sub nginx_exited {
    return 1 unless $NginxPid;
    if (waitpid($NginxPid, WNOHANG) == $NginxPid) { $NginxPid = undef; valgrind_verdict(); return 1 }
    return 0;
}

# The workers of the nginx that nginx_start started (the master's children
# that have not exited), lowest pid first.
sub nginx_workers {
    my $master = $NginxPid or return ();
    my @w;
    for my $stat (glob '/proc/[0-9]*/stat') {
        open my $fh, '<', $stat or next;
        my $line = <$fh> // next;
        my ($pid, $state, $ppid) = $line =~ /^(\d+) \(.*\) (\S) (\d+)/ or next;
        push @w, $pid if $ppid == $master && $state ne 'Z';
    }
    return sort { $a <=> $b } @w;
}

# A process's CPU time so far (user + system), in seconds; 0 when it
# has gone.
sub cpu_seconds {
    my ($pid) = @_;
    open my $f, '<', "/proc/$pid/stat" or return 0;
    my $stat = <$f> // '';
    my @f = split / /, substr($stat, rindex($stat, ')') + 2);
    return ($f[11] + $f[12]) / POSIX::sysconf(POSIX::_SC_CLK_TCK());
}

# A test that nginx's workers, left idle, spend under 0.2 s of CPU (user
# and system) while $wait->(2), a sub that waits or reads for 2 s, runs: a
# watch left on a connection's writability would wake them at every turn
# of the event loop. $what names the workers. (Skipped under valgrind,
# whose time it would be.)
sub workers_idle_ok {
    my ($what, $wait) = @_;
    my $tb = Test::Builder->new;
    return $tb->skip('under valgrind') if under_valgrind();
    my @w = nginx_workers();
    my $spent = 0;
    $spent -= cpu_seconds($_) for @w;
    $wait->(2);
    $spent += cpu_seconds($_) for @w;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    return $tb->cmp_ok($spent, '<', 0.2, sprintf('%s spend %.2f s of CPU in 2 s', $what, $spent));
}

# A field of /proc/PID/status in kB (VmRSS, VmHWM ...), 0 when there is
# none (the process has gone).
sub proc_status_kb {
    my ($pid, $field) = @_;
    open my $f, '<', "/proc/$pid/status" or return 0;
    local $/;
    my ($v) = (<$f> // '') =~ /^\Q$field\E:\s+(\d+)/m;
    return $v // 0;
}

sub nginx_error_log {
    open my $fh, '<', "$NginxRoot/logs/error.log" or return '';
    local $/;
    return <$fh>;
}

# QUIT, then KILL when it has not exited within 5 s (NginxProcess).
sub stop_nginx {
    if ($NginxPid) {
        stop_nginx_pid($NginxPid, $StartLabel, $VgDir);
        $NginxPid = undef;
    }
    return valgrind_verdict();
}

start_servers();

1;
