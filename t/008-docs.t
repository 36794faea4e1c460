# The reference in docs/ against the code: every directive the module
# registers (the command tables, each beside its gateway's handlers) has its entry, with the
# Syntax line naming it and the Context line that its flags give, on the
# page of its module; every variable it adds (or reads from the
# configuration) is in that page's "Embedded variables" table; and no page
# documents a directive or variable the code does not have. Reads the
# sources only: no server is started.
use strict;
use warnings;
use Test::More;
use File::Basename qw(dirname);

my $root = dirname(dirname(__FILE__));
$root = '.' if $root eq '';

sub slurp {
    my ($f) = @_;
    open my $fh, '<', "$root/$f" or die "$root/$f: $!";
    local $/;
    return scalar <$fh>;
}

# --- what the code registers ----------------------------------------------

my %page_of_table = ('src/sqldb/config/commands.rs' => 'docs/sqldb.md', 'src/cache/config/commands.rs' => 'docs/cache.md',
    'src/status.rs' => 'docs/status.md');
my %directive;    # name => { page, contexts }
my %flag_context = (NGX_HTTP_MAIN_CONF => 'http', NGX_HTTP_SRV_CONF => 'server', NGX_HTTP_LOC_CONF => 'location',
    NGX_HTTP_LIF_CONF => 'if in location', NGX_HTTP_UPS_CONF => 'upstream');
my @order = ('http', 'server', 'upstream', 'location', 'if in location');
for my $table (sort keys %page_of_table) {
    my $page = $page_of_table{$table};
    my ($body) = slurp($table) =~ /const \w+: &(?:'static )?\[ngx_command_t\] = &\[(.*?)\n *\];/s;
    ok(defined $body, "the command table of $table was read") or next;
    while ($body =~ /command\(\s*"(\w+)\\0",\s*([^,]+),/g) {
        my ($name, $flags) = ($1, $2);
        $flags =~ s/\bLOC_ANY\b/NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF/;
        my %ctx = map { $flag_context{$_} ? ($flag_context{$_} => 1) : () } split /\s*\|\s*/, $flags;
        $directive{$name} = { page => $page, contexts => join(', ', grep { $ctx{$_} } @order) };
    }
}
cmp_ok(scalar(keys %directive), '>=', 50, 'the command tables were read')
    or diag('found: ' . join(' ', sort keys %directive));

# Variables: the $sqldb_* ones (Var::ALL), the $sqldb_jwt_claim_ prefix,
# and those the cache gateway reads (defined with `set`).
my %variable;    # name => page
my $sqldb_conf = slurp('src/sqldb/config/mod.rs');
my ($all) = $sqldb_conf =~ /pub const ALL: \[\(Var, &'static str\); \d+\] = \[(.*?)\];/s;
$variable{$_} = 'docs/sqldb.md' for ($all // '') =~ /"(\w+)"/g;
my ($prefix) = slurp('src/sqldb/config/upstream.rs') =~ /pub const CLAIM_PREFIX: &str = "(\w+)";/;
$variable{"${prefix}NAME"} = 'docs/sqldb.md' if $prefix;
$variable{$_} = 'docs/cache.md' for slurp('src/cache/config/mod.rs') =~ /index\("(\w+)"\)/g;
cmp_ok(scalar(keys %variable), '>=', 9, 'the variables were read from the code')
    or diag('found: ' . join(' ', sort keys %variable));
# The two typed parameters of sqldb_listen_replay templates (not nginx
# variables): documented under that directive.
my @replay_params = slurp('src/sqldb/config/replay.rs') =~ /"(sqldb_\w+)" => ReplayParam::/g;
is(scalar(@replay_params), 2, 'the parameters of sqldb_listen_replay were read');

# --- what the pages document ----------------------------------------------

my %documented;    # name => { page, syntax, context }
my %documented_var;
for my $page (sort values %page_of_table) {
    my $text = slurp($page);
    my ($dirs) = $text =~ /^## Directives\n(.*?)(?=^## |\z)/ms;
    ok(defined $dirs, "$page has a Directives section") or next;
    for my $entry (split /^(?=### )/m, $dirs) {
        my ($name) = $entry =~ /^### (\S+)\s*$/m or next;
        my ($syntax) = $entry =~ /^ {4}Syntax: +(.*)$/m;
        my ($default) = $entry =~ /^ {4}Default: +(.*)$/m;
        my ($context) = $entry =~ /^ {4}Context: +(.*)$/m;
        $documented{$name} = { page => $page, syntax => $syntax, default => $default, context => $context };
    }
    my ($vars) = $text =~ /^## Embedded variables\n(.*?)(?=^## |\z)/ms;
    ok(defined $vars, "$page has an Embedded variables section") or next;
    $documented_var{$1} = $page while $vars =~ /^\| `\$(\w+)` \|/mg;
}

for my $name (sort keys %directive) {
    my $d = $documented{$name};
    my $want = $directive{$name};
    ok($d && $d->{page} eq $want->{page}, "directive $name has an entry in $want->{page}") or next;
    like($d->{syntax} // '', qr/^\Q$name\E\b/, "$name: its Syntax line names it");
    ok(defined $d->{default}, "$name: a Default line");
    is($d->{context}, $want->{contexts}, "$name: the Context line is what the code registers");
}
for my $name (sort keys %documented) {
    ok($directive{$name}, "$documented{$name}{page} documents $name, which the module registers");
}
for my $name (sort keys %variable) {
    is($documented_var{$name}, $variable{$name}, "variable \$$name is in the table of $variable{$name}");
}
for my $name (sort keys %documented_var) {
    ok($variable{$name}, "$documented_var{$name} documents \$$name, which the module has");
}
my ($replay) = slurp('docs/sqldb.md') =~ /^### sqldb_listen_replay\n(.*?)(?=^### )/ms;
for my $p (@replay_params) {
    like($replay // '', qr/\$\Q$p\E\b/, "sqldb_listen_replay's entry names \$$p");
}

# --- no page names what does not exist ------------------------------------
# Every sqldb_* / cache_* word in README.md and docs/*.md is a directive, a
# variable, a metric's name or a prefix of directives (`cache_ssl_*`).
my @pages = ('README.md', map { s{^\Q$root\E/}{}r } sort glob("$root/docs/*.md"));
my %known = (%directive, map { ($_ => 1) } keys %variable, @replay_params);
my $metrics = slurp('core/src/metrics.rs');
my %metric = map { ($_ => 1) } $metrics =~ /= "(\w+)", (?:Counter|Gauge|Histogram)/g;
for my $page (@pages) {
    my $text = slurp($page);
    my %unknown;
    while ($text =~ /(?<![\w.\/-])(\$?)((?:sqldb|cache)_[a-z_]+)/g) {
        my ($dollar, $word) = ($1, $2);
        next if $known{$word} || $metric{$word};
        next if $word =~ /_$/ && grep { /^\Q$word\E/ } keys %known;
        next if $dollar && $word =~ /^sqldb_jwt_claim_/;
        $unknown{"$dollar$word"}++;
    }
    is(join(' ', sort keys %unknown), '', "$page names no directive or variable the module lacks");
    while ($text =~ /^ {4}Syntax: +(\w+)/mg) {
        ok($directive{$1}, "$page: the Syntax line of $1 is of a registered directive");
    }
}

# --- links between the pages -----------------------------------------------
# Every relative link of README.md and docs/*.md reaches a page, and a
# #fragment one of its headings (GitHub's anchors: lower case, spaces as
# -, other punctuation dropped).
sub anchors {
    my ($text) = @_;
    my %a;
    for my $h ($text =~ /^#+ (.+)$/mg) {
        (my $id = lc $h) =~ s/[^\w\- ]//g;
        $id =~ s/ /-/g;
        $a{$id} = 1;
    }
    return \%a;
}
for my $page (@pages) {
    my $text = slurp($page);
    (my $dir = $page) =~ s{[^/]*$}{};
    while ($text =~ /\]\(([^)\s]+)\)/g) {
        my $link = $1;
        next if $link =~ m{^[a-z]+://};
        my ($file, $frag) = split /#/, $link, 2;
        my $target = $file eq '' ? $page : "$dir$file";
        1 while $target =~ s{[^/]+/\.\./}{};
        if (!-e "$root/$target") {
            fail("$page: the link $link reaches a file");
            next;
        }
        next unless defined $frag && $target =~ /\.md$/;
        ok(anchors(slurp($target))->{$frag}, "$page: the link $link reaches a heading");
    }
}

done_testing();
