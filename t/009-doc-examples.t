# The examples of README.md and docs/*.md, as the pages show them.
#
# Every ```nginx block starts with a line saying where it goes (the
# convention is in docs/development.md):
#   # context: full       a whole nginx.conf
#   # context: http       the inside of http {}
#   # context: server     the inside of a server {}
#   # context: location   the inside of a location {}
#   # context: upstream   the inside of an upstream {}
# and runs through `nginx -t` with the module loaded, wrapped so. The
# upstreams a fragment passes to without defining them are added (of
# sqldb_server or server lines, as its sqldb_pass / cache_pass says); the
# files it names (keys, certificates) are made here; a load_module line of
# the gateway loads the build under test.
#
# Blocks after an HTML comment `<!-- run: NAME -->` run, per NAME, in page
# order: ```sql blocks through psql as the superuser of the suite's
# PostgreSQL, then nginx with the ```nginx block(s) against it and the
# suite's Redis, then the ```console blocks: each `$ command` line runs (in
# one shell per NAME, so that variables carry over) and what it prints
# must be the lines below it (a `...` stands for any text). Addresses
# 127.0.0.1:5432, :6379 and :8080 become the suite's.
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(nginx_start stop_nginx start_redis redis_cli tls_files free_port stretch);
use Test::More;
use File::Temp qw(tempdir);

my $root = '.';
my $bin = $ENV{TEST_NGINX_BINARY} || 'nginx';
my $module = (grep { length } split /[\s:]+/, $ENV{TEST_NGINX_LOAD_MODULES} || '')[0]
    or plan skip_all => 'TEST_NGINX_LOAD_MODULES names no module';
my $debian_modules = '/usr/lib/nginx/modules';
my $debian_nginx = $bin eq '/usr/sbin/nginx';

# Third-party modules some examples use (Debian's packages: they load into
# Debian's nginx only).
my %third_party = (
    srcache => { re => qr/\bsrcache_/, so => ['ndk_http_module.so', 'ngx_http_srcache_filter_module.so'] },
    set_misc => { re => qr/\bset_(?:unescape_uri|escape_uri|quote_sql_str|if_empty)\b/,
        so => ['ndk_http_module.so', 'ngx_http_set_misc_module.so'] },
);

my @pages = ('README.md', map { s{^\./}{}r } sort glob("$root/docs/*.md"));
my (@nginx, %run, @run_order);
for my $page (@pages) {
    open my $fh, '<', $page or die "$page: $!";
    my @lines = <$fh>;
    my ($in, $lang, $start, $body, $mark, $pending) = (0);
    for my $i (0 .. $#lines) {
        my $l = $lines[$i];
        if (!$in && $l =~ /^<!-- run: ([\w-]+) -->\s*$/) { $pending = $1; next }
        if (!$in && $l =~ /^```(\w*)/) {
            ($in, $lang, $start, $body, $mark) = (1, $1, $i + 1, '', $pending);
            $pending = undef;
            next;
        }
        if ($in && $l =~ /^```\s*$/) {
            $in = 0;
            my $b = { page => $page, line => $start, text => $body, lang => $lang, run => $mark };
            push @nginx, $b if $lang eq 'nginx';
            push @run_order, $mark if $mark && !$run{$mark};
            push @{ $run{$mark}{$lang} }, $b if $mark;
            next;
        }
        $body .= $l if $in;
        if (!$in && defined $pending && $l =~ /\S/) {
            fail("$page:" . ($i + 1) . ": a \"run: $pending\" mark not followed by a code block");
            $pending = undef;
        }
    }
}
cmp_ok(scalar(@nginx), ">=", 10, 'the pages have nginx examples');

# Files the examples name, made once.
my $files = tempdir('ngx-gateway-docs-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $files;
my $tls = tls_files();
{
    open my $k, '>', "$files/jwt.secret" or die $!;
    print $k "a secret of at least thirty-two bytes, for HS256 tokens\n";
    close $k;
}
my $redis = start_redis();
my $pg_port = $ENV{TEST_NGINX_PG_PORT};

# The suite's addresses for the pages' own.
sub addresses {
    my ($text, $port) = @_;
    $text =~ s/\b(127\.0\.0\.1|localhost):5432\b/127.0.0.1:$pg_port/g;
    $text =~ s/\b(127\.0\.0\.1|localhost):6379\b/127.0.0.1:$redis->{port}/g;
    $text =~ s/\b(127\.0\.0\.1|localhost):8080\b/127.0.0.1:$port/g if defined $port;
    return $text;
}

# The files an example names, as made above (and the same names in the
# commands of its console blocks: %file_of).
my %file_of;
sub example_files {
    my ($text) = @_;
    my %made = (sqldb_jwt_key => "$files/jwt.secret", cache_ssl_trusted_certificate => "$tls/ca.crt",
        cache_ssl_certificate => "$tls/client.crt", cache_ssl_certificate_key => "$tls/client.key");
    for my $d (keys %made) {
        while ($text =~ /^\s*$d\s+([^;\s]+)/mg) { $file_of{$1} = $made{$d} }
        $text =~ s/^(\s*$d\s+)[^;\s]+/$1$made{$d}/mg;
    }
    return $text;
}

# Upstreams a fragment passes to without defining them.
sub missing_upstreams {
    my ($text) = @_;
    my $add = '';
    my %seen;
    while ($text =~ /\b(sqldb_pass|cache_pass)\s+([A-Za-z_][\w-]*)\s*;/g) {
        my ($kind, $name) = ($1, $2);
        next if $seen{$name}++ || $text =~ /\bupstream\s+\Q$name\E\s*\{/;
        $add .= $kind eq 'sqldb_pass'
            ? "upstream $name { sqldb_server 127.0.0.1:$pg_port dbname=app user=web \"password=s3cret pass\"; }\n"
            : "upstream $name { server 127.0.0.1:$redis->{port}; }\n";
    }
    return $add;
}

# The whole nginx.conf of a block, for a prefix folder; undef and a reason
# when it cannot run with this nginx.
sub configuration {
    my ($b, $dir, $port) = @_;
    my ($context) = $b->{text} =~ /\A\s*# context: (full|http|server|location|upstream)\s*\n/;
    return (undef, 'no "# context:" first line') unless $context;
    my $text = example_files(addresses($b->{text}, $port));
    my $main = '';
    for my $m (sort keys %third_party) {
        next unless $text =~ $third_party{$m}{re};
        return (undef, "needs Debian's $m module, built for Debian's nginx") unless $debian_nginx;
        $main .= "load_module $debian_modules/$_;\n" for @{ $third_party{$m}{so} };
    }
    # Modules of nginx's own that a build may leave out.
    my $built = `$bin -V 2>&1`;
    for my $m (['http_auth_request_module', qr/^\s*auth_request\b/m], ['http_gunzip_module', qr/^\s*gunzip\b/m]) {
        next unless $text =~ $m->[1];
        return (undef, "needs an nginx built with $m->[0]") unless $built =~ /\Q$m->[0]\E/;
    }
    my %seen;
    $main = join '', grep { !$seen{$_}++ } split /^/, $main;
    my $head = "error_log $dir/error.log info;\npid $dir/nginx.pid;\n";
    my $http_head = "access_log $dir/access.log;\nclient_body_temp_path $dir/body;\nproxy_temp_path $dir/proxy;\n"
        . "fastcgi_temp_path $dir/fcgi;\nuwsgi_temp_path $dir/uwsgi;\nscgi_temp_path $dir/scgi;\n";
    if ($context eq 'full') {
        my $loads = 0;
        $loads++ while $text =~ s/^\s*load_module\s+\S*ngx_http_gateway_module\.so\s*;/load_module $module;/m;
        $text = "load_module $module;\n$text" unless $loads;
        $text =~ s/^(\s*load_module $module;)/$main$1/m;
        $text =~ s/^http\s*\{/http {\n$http_head/m;
        return ($head . $text);
    }
    my $ups = missing_upstreams($text);
    $text =~ s/^\s*listen\s+[^;]+;/    listen 127.0.0.1:$port;/mg if $context eq 'http' || $context eq 'server';
    my $inner =
          $context eq 'http'     ? $text
        : $context eq 'upstream' ? "upstream example { $text }\n"
        : $context eq 'server'   ? "server {\n listen 127.0.0.1:$port;\n$text}\n"
        :                          "server {\n listen 127.0.0.1:$port;\n location / {\n$text }\n}\n";
    $inner = $ups . $inner if $context ne 'upstream';
    return ("$head${main}load_module $module;\nevents { worker_connections 64; }\nhttp {\n$http_head$inner}\n");
}

# --- nginx -t of every block ----------------------------------------------
for my $b (@nginx) {
    # (A guide's runnable blocks add to the quick start's site: they are
    # checked in it, below.)
    next if $b->{run} && $b->{run} ne 'quickstart';
    my $where = "$b->{page}:$b->{line}";
    my $dir = tempdir('ngx-gateway-doc-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $dir;
    mkdir "$dir/logs";    # (nginx opens its prefix's error log before reading the file)
    my ($conf, $why) = configuration($b, $dir, free_port());
    if (!defined $conf) {
        if ($why =~ /^needs/) {
            SKIP: { skip "$where: $why", 1 }
        } else {
            fail("$where: $why");
        }
        next;
    }
    open my $fh, '>', "$dir/nginx.conf" or die $!;
    print $fh $conf;
    close $fh;
    my $out = `$bin -t -p $dir/ -c $dir/nginx.conf 2>&1`;
    like($out, qr/test is successful/, "$where: nginx -t") or diag("$out\n--- nginx.conf:\n$conf");
}

# --- the examples that run ------------------------------------------------
sub superuser_psql_file {
    my ($sql) = @_;
    my $dir = tempdir('ngx-gateway-docsql-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    open my $fh, '>', "$dir/page.sql" or die $!;
    print $fh $sql;
    close $fh;
    local $ENV{PGPASSWORD} = $ENV{TEST_NGINX_PG_SUPERPW};
    my $out = `psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p $pg_port -U postgres -d postgres -f $dir/page.sql 2>&1`;
    return ($? == 0, $out);
}

# Runs the `$ ` lines of console blocks in one bash, each one's output cut
# out by a marker line; returns [command, expected, got] per line.
sub run_console {
    my ($blocks, $port) = @_;
    my (@steps, $cur);
    for my $b (@$blocks) {
        for my $l (split /\n/, $b->{text}) {
            if ($l =~ /^\$ (.*)$/) {
                push @steps, $cur = { cmd => $1, want => [], where => "$b->{page}:$b->{line}" };
            } elsif ($cur) {
                push @{ $cur->{want} }, $l;
            }
        }
    }
    my $script = '';
    for my $i (0 .. $#steps) {
        my $cmd = addresses($steps[$i]{cmd}, $port);
        $cmd =~ s/\Q$_\E/$file_of{$_}/g for sort { length $b <=> length $a } keys %file_of;
        $script .= "$cmd\necho; echo '\@\@step $i\@\@'\n";
    }
    my $dir = tempdir('ngx-gateway-docsh-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    open my $fh, '>', "$dir/steps.sh" or die $!;
    print $fh $script;
    close $fh;
    # (A bound, should a page's command wait forever: a stream that never ends.)
    my $limit = int(stretch(120));
    my $out = `cd $root && timeout $limit bash $dir/steps.sh 2>&1`;
    my @got = split /\n?\@\@step \d+\@\@\n/, $out, -1;
    return map { [$steps[$_], $got[$_] // ''] } 0 .. $#steps;
}

sub output_matches {
    my ($want, $got) = @_;
    $got =~ s/\n+\z//;
    my @want = @$want;
    pop @want while @want && $want[-1] eq '';
    my $re = join '\n', map { join '.*?', map { quotemeta } split /\.\.\./, $_, -1 } @want;
    return $got =~ /\A$re\z/s;
}

# The quick start is the base; every other run is a guide that adds to
# its site: `# context: http` blocks above its server block (a map,
# another upstream), `# context: server` blocks inside it. The quick start
# and then every guide are pasted into one site, in the pages' order and
# in the reverse one, each time on a fresh database and Redis: nginx
# starts with the whole, the SQL of each page runs, then its requests.
my $base_name = 'quickstart';
my $base = $run{$base_name};
ok($base && $base->{nginx} && @{ $base->{nginx} } == 1, "run $base_name: one nginx block")
    or BAIL_OUT('no quick start to build on');
my @guides = grep { $_ ne $base_name } @run_order;
my %roles_before = map { ($_ => 1) } split /\n/, superuser_query("select rolname from pg_roles");

sub superuser_query {
    my ($sql) = @_;
    local $ENV{PGPASSWORD} = $ENV{TEST_NGINX_PG_SUPERPW};
    my $out = `psql -X -q -At -h 127.0.0.1 -p $pg_port -U postgres -d postgres -c "$sql" 2>&1`;
    die "psql: $out" if $?;
    return $out;
}

# What keeps a guide from running here (a module this nginx lacks), if any.
sub cannot_run {
    my ($name) = @_;
    for my $b (@{ $run{$name}{nginx} || [] }) {
        my $dir = tempdir('ngx-gateway-doccheck-XXXXXX', TMPDIR => 1, CLEANUP => 1);
        my ($conf, $why) = configuration($b, $dir, 1);
        return $why if !defined $conf;
    }
    return undef;
}

# The site of the quick start with the guides' blocks pasted in.
sub composed {
    my (@names) = @_;
    my $text = $base->{nginx}[0]{text};
    my ($above, $inside) = ('', '');
    for my $name (@names) {
        for my $b (@{ $run{$name}{nginx} || [] }) {
            my ($context) = $b->{text} =~ /\A\s*# context: (\w+)/;
            my $body = $b->{text} =~ s/\A\s*# context: \w+\s*\n//r;
            if ($context eq 'http') { $above .= "# $b->{page}:$b->{line}\n$body\n" }
            elsif ($context eq 'server') { $inside .= "# $b->{page}:$b->{line}\n$body\n" }
            else { fail("$b->{page}:$b->{line}: a guide's block goes in the http or the server context, not $context") }
        }
    }
    $text =~ s/^(server\s*\{)/$above$1/m or fail("the quick start's site has a server block");
    $text =~ s/\}\s*\z/$inside}\n/ or fail("the quick start's server block ends the site");
    return { page => $base->{nginx}[0]{page}, line => $base->{nginx}[0]{line}, text => $text };
}

my @runnable;
for my $name (@guides) {
    ok($run{$name}{console} && @{ $run{$name}{console} }, "run $name: requests to make") or next;
    if (my $why = cannot_run($name)) {
        SKIP: { skip "run $name: $why", 1 }
        next;
    }
    push @runnable, $name;
}

for my $order (['in the pages\' order', @runnable], ['in the reverse order', reverse @runnable]) {
    my ($how, @names) = @$order;
    # A fresh database and Redis: what the quick start made goes.
    superuser_query("drop database if exists app");
    my @made = grep { !$roles_before{$_} } split /\n/, superuser_query("select rolname from pg_roles");
    superuser_query(join '; ', map { qq{drop role "$_"} } @made) if @made;
    redis_cli($redis, 'flushall');
    for my $name ($base_name, @names) {
        for my $sql (@{ $run{$name}{sql} || [] }) {
            my ($ok, $out) = superuser_psql_file($sql->{text});
            ok($ok, "$how: the SQL of $sql->{page}:$sql->{line}") or diag($out);
        }
    }
    my $site = composed(@names);
    my $dir = tempdir('ngx-gateway-docrun-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    chmod 0755, $dir;
    # nginx_start writes the events/http frame itself: give it the inside.
    my ($conf, $why) = configuration($site, $dir, '$PORT');
    ok(defined $conf, "$how: the quick start with " . join(', ', @names) . " can run here") or do { diag($why); next };
    my ($main) = $conf =~ /\A(.*?)load_module \Q$module\E;\n/s;
    $main =~ s/^(error_log|pid) .*\n//mg;
    my ($inner) = $conf =~ /^http \{\n(.*)\}\n\z/ms;
    $inner =~ s/^(access_log|\w+_temp_path) .*\n//mg;
    my $port = eval { nginx_start($inner, main => $main) };
    ok($port, "$how: nginx starts with the quick start and every guide") or do { diag("$@\n$inner"); next };
    for my $name ($base_name, @names) {
        for my $step (run_console($run{$name}{console}, $port)) {
            my ($s, $got) = @$step;
            ok(output_matches($s->{want}, $got), "$how: $s->{where}: \$ $s->{cmd}")
                or diag("want:\n" . join("\n", @{ $s->{want} }) . "\ngot:\n$got");
        }
    }
    stop_nginx();
}

done_testing();
