# The Debian package on this machine, as a user installs it: apt-get
# install of the .deb next to Debian's nginx, the module enabled, nginx -t
# on the stock configuration, a site with sqldb_* and cache_pass served by
# an nginx of the test's own (Debian's binary, its own prefix and loopback
# port) that loads the module as the stock nginx.conf does (include of
# /etc/nginx/modules-enabled/*.conf), answers, then purge: nginx -t passes
# and no file of the package is left. The machine's nginx service is not
# started, stopped or reloaded by the test: dpkg's nginx-reload trigger,
# which reloads a running nginx when a module package is installed or
# purged, goes through invoke-rc.d, and a /usr/sbin/policy-rc.d of the
# test's own (the Debian way to keep package operations from touching
# services) refuses it while the test installs and purges; when the
# machine has a policy-rc.d of its own that allows the reload and nginx
# runs, the test leaves the package alone. A running nginx keeps its worker processes (a reload
# would replace them). Run by make test-package (root; TEST_PACKAGE_DEB
# names the .deb).
use strict;
use warnings;
use lib 't/lib';
use GatewayTest qw(start_redis psql nginx_start stop_nginx);
use HttpClient qw(keepalive_requests);
use Test::More;
use Time::HiRes qw(sleep time);

my $deb = $ENV{TEST_PACKAGE_DEB};
plan skip_all => 'needs root and TEST_PACKAGE_DEB (make test-package)' unless $> == 0 && $deb && -f $deb;
plan skip_all => 'libnginx-mod-http-gateway is installed already: not touching it'
    if `dpkg-query -W -f='\${Status}' libnginx-mod-http-gateway 2>/dev/null` =~ /install ok installed/;

my $pidfile = '/run/nginx.pid';
sub nginx_master { open my $f, '<', $pidfile or return 0; my $p = <$f> // ''; chomp $p; return $p =~ /^\d+$/ && kill(0, $p) ? $p : 0 }
sub nginx_running { nginx_master() ? 1 : 0 }
# The worker processes of the machine's nginx (a reload replaces them).
sub nginx_workers { my $m = nginx_master() or return ''; join ' ', sort split ' ', `pgrep -P $m` }
my $was_running = nginx_running();
my $workers_before = nginx_workers();

my $policy = '/usr/sbin/policy-rc.d';
my $policy_mark = '# ngx_gateway t/package/install.t';
# (A policy-rc.d of the machine's that refuses nginx's reload does as well.)
plan skip_all => "nginx runs and $policy, the machine's own, lets dpkg reload it: not installing a module package"
    if $was_running && -e $policy && (system($policy, 'nginx', 'reload') >> 8) != 101;
my $own_policy = 0;
sub put_policy {
    return if -e $policy;
    open my $f, '>', $policy or die "$policy: $!";
    print $f "#!/bin/sh\n$policy_mark: services are left alone while it installs and purges\nexit 101\n";
    close $f;
    chmod 0755, $policy;
    $own_policy = 1;
}
sub drop_policy {
    return unless $own_policy;
    open my $f, '<', $policy or return;
    my $text = do { local $/; <$f> };
    unlink $policy if index($text, $policy_mark) >= 0;
    $own_policy = 0;
}
my $installed;

sub cleanup {
    stop_nginx();
    if ($installed) {
        put_policy();
        system('env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q libnginx-mod-http-gateway >/dev/null 2>&1');
        $installed = 0;
    }
    drop_policy();
}
END { cleanup() if $installed || $own_policy }

put_policy();

is(system("env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $deb >/tmp/ngx-gateway-package-install.log 2>&1"), 0,
    'apt-get install of the .deb') or diag(`tail -n 20 /tmp/ngx-gateway-package-install.log`);
$installed = 1;
drop_policy();
my @files = grep { -f $_ || -l $_ } split /\n/, `dpkg -L libnginx-mod-http-gateway`;
ok(-l '/etc/nginx/modules-enabled/50-mod-http-gateway.conf', 'the module is enabled');
ok((grep { m{/usr/lib/nginx/modules/ngx_http_gateway_module\.so$} } @files), 'the module is in nginx\'s module folder');
like(`file -L /usr/lib/nginx/modules/ngx_http_gateway_module.so`, qr/stripped/, 'stripped') ;
unlike(`file -L /usr/lib/nginx/modules/ngx_http_gateway_module.so`, qr/not stripped/, 'not with its symbols');
is(system('nginx -t -q'), 0, 'nginx -t passes with the stock configuration');

# A site on loopback, with a database and a cache location, in an nginx of
# the test's own that loads the installed module through its load file.
psql('drop table if exists pkg_items');
psql("create table pkg_items (id int primary key, label text); insert into pkg_items values (1, 'from the package')");
psql('grant select on pkg_items to gateway');
my $redis = start_redis();
my $port = eval {
    # (Debian's load files name the modules relative to nginx's prefix.)
    nginx_start(<<"CONF", main => "include /etc/nginx/modules-enabled/*.conf;\n", prefix => '/usr/share/nginx/');
upstream ngx_gateway_pkg_db { sqldb_server \$TEST_NGINX_PG_SERVER; }
upstream ngx_gateway_pkg_redis { server 127.0.0.1:$redis->{port}; keepalive 2; }
server {
    listen 127.0.0.1:\$PORT;
    location /item { sqldb_pass ngx_gateway_pkg_db; sqldb_output json; sqldb_query "select id, label from pkg_items where id = \$arg_id::int"; }
    location /kv/ { set \$cache_key \$uri; cache_pass ngx_gateway_pkg_redis; }
}
CONF
};
ok($port, 'an nginx with the modules the package enabled serves the site') or diag($@);
my @r = keepalive_requests($port, 5, ['GET', '/item?id=1'], ['PUT', '/kv/k', 'a value'], ['GET', '/kv/k']);
is($r[0]{status}, 200, 'a database location: 200');
is($r[0]{body}, '[{"id":1,"label":"from the package"}]', 'with the row as JSON');
is($r[1]{status}, 201, 'a cache PUT: 201');
is($r[2]{body}, 'a value', 'and a GET of it');

# Back as it was: the test's nginx, then the package.
cleanup();
ok(!-e $_, "removed: $_") for @files;
ok(!-e '/etc/nginx/modules-enabled/50-mod-http-gateway.conf', 'the module is no longer enabled');
is(system('nginx -t -q'), 0, 'nginx -t passes after the purge');
is(nginx_running() ? 1 : 0, $was_running ? 1 : 0, 'nginx runs, or not, as before');
is(nginx_workers(), $workers_before, "and was not reloaded (the same worker processes: $workers_before)") if $was_running;
ok(!(-e $policy && `cat $policy` =~ /\Q$policy_mark\E/), "no $policy of the test's is left");
psql('drop table if exists pkg_items');
done_testing();
