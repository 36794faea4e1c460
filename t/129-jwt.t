# Authorization in the database (sqldb_jwt_key and friends): requests with
# a verified bearer token run as the token's role, with its claims in
# request.jwt.claims, under a row-level security policy; anonymous requests
# run as sqldb_anonymous_role; bad tokens get 401 and run nothing; a role
# that cannot be set gets 403; nothing of one request's role or settings
# is seen by the next request on the same pooled connection, pipelined or
# not. Tokens are made here: HS256 with Digest::SHA, RS256 and ES256 with
# the openssl command.
use strict;
use warnings;
use lib 't/lib';
use HttpClient qw(unchunk);
use GatewayTest qw(nginx_start stop_nginx nginx_error_log psql);
use Test::More;
use IO::Socket::INET;
use IO::Select;
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64url decode_base64);
use File::Temp qw(tempdir);
use Time::HiRes qw(time);

my $dir = tempdir('ngx-gateway-jwt-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $dir;

sub spew { my ($file, $text) = @_; open my $fh, '>', $file or die "$file: $!"; binmode $fh; print $fh $text; close $fh }
sub slurp { my ($file) = @_; open my $fh, '<', $file or die "$file: $!"; binmode $fh; local $/; return <$fh> }
sub run { my @cmd = @_; system(@cmd) == 0 or die "@cmd failed" }

# Keys: an HMAC secret, an RSA key pair, a second RSA key, a P-256 pair (as a JWKS).
my $secret = 'a secret of more than thirty-two bytes, for HS256';
spew("$dir/secret", "$secret\n");
run('openssl', 'genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048', '-out', "$dir/rsa.pem", '-quiet');
run('openssl', 'pkey', '-in', "$dir/rsa.pem", '-pubout', '-out', "$dir/rsa.pub");
run('openssl', 'genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048', '-out', "$dir/other.pem", '-quiet');
run('openssl', 'genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', "$dir/ec.pem");
run('openssl', 'pkey', '-in', "$dir/ec.pem", '-pubout', '-outform', 'DER', '-out', "$dir/ec.der");
my $point = substr(slurp("$dir/ec.der"), -64);
spew("$dir/jwks.json", sprintf('{"keys":[{"kty":"EC","crv":"P-256","kid":"ec-1","x":"%s","y":"%s"}]}',
    encode_base64url(substr($point, 0, 32)), encode_base64url(substr($point, 32))));

sub b64j { encode_base64url($_[0]) }

sub hs256 {
    my ($claims, %o) = @_;
    my $header = $o{header} // '{"alg":"HS256","typ":"JWT"}';
    my $msg = b64j($header) . '.' . b64j($claims);
    return "$msg." . b64j(hmac_sha256($msg, $o{secret} // $secret));
}

# Signs with the openssl command (RS256, or ES256 with the DER signature
# turned into r || s as JWS wants it).
sub openssl_sign {
    my ($alg, $key, $claims, $kid) = @_;
    my $header = $kid ? qq({"alg":"$alg","kid":"$kid"}) : qq({"alg":"$alg"});
    my $msg = b64j($header) . '.' . b64j($claims);
    spew("$dir/msg", $msg);
    run('openssl', 'dgst', '-sha256', '-sign', $key, '-out', "$dir/sig", "$dir/msg");
    my $sig = slurp("$dir/sig");
    if ($alg eq 'ES256') {
        my ($r, $s) = der_ints($sig);
        $sig = pad32($r) . pad32($s);
    }
    return "$msg." . b64j($sig);
}

sub der_ints {
    my ($der) = @_;
    my $pos = 2;
    $pos++ if ord(substr($der, 1, 1)) & 0x80;
    my @ints;
    for (1 .. 2) {
        my $len = ord(substr($der, $pos + 1, 1));
        push @ints, substr($der, $pos + 2, $len);
        $pos += 2 + $len;
    }
    return @ints;
}
sub pad32 { my $v = shift; $v =~ s/^\x00+//; return ("\x00" x (32 - length $v)) . $v }

my $now = time;
sub claims {
    my (%c) = @_;
    $c{exp} //= int($now) + 600;
    return '{' . join(',', map { my $v = $c{$_}; qq("$_":) . ($v =~ /^-?\d+$/ ? $v : qq("$v")) } sort keys %c) . '}';
}

# The database: roles, grants, a table under a row-level security policy.
psql(<<'SQL');
drop table if exists jwt_notes;
do $$ begin
  if not exists (select from pg_roles where rolname = 'jwt_anon') then create role jwt_anon nologin; end if;
  if not exists (select from pg_roles where rolname = 'jwt_user') then create role jwt_user nologin; end if;
  if not exists (select from pg_roles where rolname = 'jwt_outsider') then create role jwt_outsider nologin; end if;
end $$;
grant jwt_anon, jwt_user to gateway;
create table jwt_notes (id serial primary key, owner text not null, body text not null, public boolean not null default false);
insert into jwt_notes (owner, body, public) values
  ('alice', 'alice one', false), ('alice', 'alice two', false), ('bob', 'bob one', false), ('bob', 'bob public', true);
alter table jwt_notes enable row level security;
grant select, insert on jwt_notes to jwt_user;
grant usage on sequence jwt_notes_id_seq to jwt_user;
grant select on jwt_notes to jwt_anon;
create policy own on jwt_notes to jwt_user
  using (owner = current_setting('request.jwt.claims', true)::json->>'sub')
  with check (owner = current_setting('request.jwt.claims', true)::json->>'sub');
create policy public_rows on jwt_notes for select to jwt_anon using (public);
SQL

my $server = GatewayTest::pg_server_line('jwt');

sub conf {
    my ($max) = @_;
    return <<"HTTP";
upstream database {
    sqldb_server $server;
    sqldb_keepalive max=$max;
}
server {
    listen 127.0.0.1:\$PORT;
    sqldb_jwt_key $dir/secret;
    sqldb_anonymous_role jwt_anon;
    location /notes {
        sqldb_pass database;
        sqldb_output value;
        sqldb_query "select string_agg(body, ',' order by id) from jwt_notes";
        add_header X-Sub \$sqldb_jwt_claim_sub;
        add_header X-Role \$sqldb_jwt_claim_role;
        add_header X-User \$sqldb_jwt_claim_userId;
    }
    location /note {
        sqldb_pass database;
        sqldb_output value;
        sqldb_query "select body from jwt_notes where id = \$arg_id::int";
    }
    location /add {
        sqldb_pass database;
        sqldb_output value;
        sqldb_query "insert into jwt_notes (owner, body) values (\$arg_owner::text, \$arg_body::text) returning body";
    }
    location /stream {
        sqldb_pass database;
        sqldb_stream on;
        sqldb_output csv;
        sqldb_query "select body from jwt_notes order by id";
        add_header X-Exp \$sqldb_jwt_claim_exp;
    }
    location /whoami {
        sqldb_pass database;
        sqldb_output value;
        sqldb_setting request.header.tenant \$http_x_tenant;
        sqldb_query "select concat_ws('|', current_user, coalesce(nullif(current_setting('request.jwt.claims', true), ''), '-'), coalesce(nullif(current_setting('request.header.tenant', true), ''), '-'), current_setting('transaction_read_only'))";
    }
    location /noprep {
        sqldb_pass database;
        sqldb_prepare off;
        sqldb_output value;
        sqldb_query "select current_user || ' ' || (current_setting('request.jwt.claims', true)::json->>'sub')";
    }
    location /nested {
        sqldb_pass database;
        sqldb_jwt_role_claim app.db.role;
        sqldb_output value;
        sqldb_query "select current_user";
    }
    location /strict {
        sqldb_pass database;
        sqldb_jwt_key $dir/secret alg=HS256;
        sqldb_jwt_leeway 0;
        sqldb_output value;
        sqldb_query "select current_user";
    }
    location /rsa {
        sqldb_pass database;
        sqldb_jwt_key $dir/rsa.pub;
        sqldb_output value;
        sqldb_query "select current_user";
    }
    location /ec {
        sqldb_pass database;
        sqldb_jwt_key $dir/jwks.json;
        sqldb_output value;
        sqldb_query "select current_user";
    }
}
server {
    listen 127.0.0.1:\$PORT2;
    # The same upstream and connections, without any role or setting.
    location /dealloc { sqldb_pass database; sqldb_prepare off; sqldb_output none; sqldb_query "deallocate all"; }
    location /held {
        sqldb_pass database;
        sqldb_prepare off;
        sqldb_output value;
        sqldb_query "select count(*) from pg_prepared_statements where statement like 'select pg_catalog.set_config(%'";
    }
    location /plain {
        sqldb_pass database;
        sqldb_output value;
        sqldb_query "select concat_ws('|', current_user, coalesce(nullif(current_setting('request.jwt.claims', true), ''), '-'), coalesce(nullif(current_setting('request.header.tenant', true), ''), '-'), current_setting('transaction_read_only'))";
    }
}
HTTP
}

my $port2;
sub start {
    my ($max) = @_;
    $port2 = GatewayTest::free_port();
    (my $http = conf($max)) =~ s/\$PORT2\b/$port2/g;
    return nginx_start($http);
}

sub request {
    my ($port, $method, $path, %h) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!";
    binmode $s;
    my $headers = join '', map { "$_: $h{$_}\r\n" } sort keys %h;
    print $s "$method $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\n$headers\r\n";
    local $/;
    my $resp = <$s> // '';
    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/\S+ (\d+)};
    return ($status // 0, $body // '', $head // '');
}
my $port;
sub get { my ($path, $token, %h) = @_; $h{Authorization} = "Bearer $token" if defined $token; request($port, 'GET', $path, %h) }
sub header_of { my ($head, $name) = @_; return $head =~ /^\Q$name\E: ([^\r\n]*)/mi ? $1 : undef }

my $alice = hs256(claims(sub => 'alice', role => 'jwt_user'));
my $bob = hs256(claims(sub => 'bob', role => 'jwt_user'));

$port = start(1);

# --- Row-level security: each user sees their rows, anonymous the public ones.
my ($status, $body, $head) = get('/notes', $alice);
is($status, 200, 'alice: 200') or diag($body);
is($body, "alice one,alice two", 'alice sees only her rows');
is(header_of($head, 'X-Sub'), 'alice', '$sqldb_jwt_claim_sub');
is(header_of($head, 'X-Role'), 'jwt_user', '$sqldb_jwt_claim_role');
($status, $body, $head) = get('/notes', hs256(claims(sub => 'alice', role => 'jwt_user', userId => 'u-17')));
is(header_of($head, 'X-User'), 'u-17', '$sqldb_jwt_claim_userId (nginx lowers the name) finds the claim userId');
($status, $body) = get('/notes', $bob);
is($body, "bob one,bob public", 'bob sees only his rows');
($status, $body, $head) = get('/notes');
is($status, 200, 'anonymous: 200');
is($body, "bob public", 'anonymous sees the public rows');
is(header_of($head, 'X-Sub'), undef, 'no claim variable without a token');
($status, $body) = get('/note?id=1', $alice);
is($body, 'alice one', 'pk lookup (a prepared statement) as alice');
($status, $body) = get('/note?id=1', $bob);
is($status, 500, "pk lookup of alice's row as bob finds nothing (value output: no row)");
($status, $body) = get('/note?id=4');
is($body, 'bob public', 'pk lookup of a public row, anonymous');

# --- Writes: POST is read-write and the policy checks the owner; GET is read-only.
($status, $body) = request($port, 'POST', '/add?owner=alice&body=three', Authorization => "Bearer $alice");
is($status, 200, 'alice inserts her row') or diag($body);
($status) = request($port, 'POST', '/add?owner=bob&body=forged', Authorization => "Bearer $alice");
is($status, 403, 'alice cannot insert a row of bob (with check): 403');
like(nginx_error_log(), qr/\[error\].*sqldb: the request's role may not run the query: .*row-level security/, 'the log says why');
($status) = request($port, 'GET', '/add?owner=alice&body=in_a_get', Authorization => "Bearer $alice");
is($status, 500, 'a GET runs read only: its insert fails');
like(nginx_error_log(), qr/read-only transaction/, 'the log says read-only transaction');
($status, $body) = get('/whoami', $alice);
like($body, qr/^jwt_user\|\{.*"sub":"alice".*\}\|-\|on$/, 'GET: role, claims, read only') or diag($body);
($status, $body) = request($port, 'POST', '/whoami', Authorization => "Bearer $alice");
like($body, qr/^jwt_user\|.*\|off$/, 'POST: read-write') or diag($body);
($status) = request($port, 'POST', '/add?owner=anyone&body=x');
is($status, 403, 'anonymous cannot insert (no grant): 403');
is(psql("select count(*) from jwt_notes where body in ('forged', 'in_a_get', 'x')"), '0', 'none of the refused writes happened');

($status) = request($port, 'HEAD', '/add?owner=alice&body=in_a_head', Authorization => "Bearer $alice");
is($status, 500, 'HEAD runs read only too');
is(psql("select count(*) from jwt_notes where body = 'in_a_head'"), '0', 'nothing inserted by the HEAD');
($status, $body, $head) = get('/stream', $alice);
is(unchunk($body), "body\r\nalice one\r\nalice two\r\nthree\r\n", 'a streamed response (single-row mode behind the preamble) under the policy too')
    or diag($body);
like(header_of($head, 'X-Exp') // '', qr/^\d+$/, 'a numeric claim as its JSON text');

# The claims reach SQL as the token carries them: a number of any size
# stays exact (in SQL and in the claim variable).
my $payload = '{"role":"jwt_user","sub":"alice","big":123456789012345678901234567890,"exp":' . (int($now) + 600) . '}';
($status, $body, $head) = get('/whoami', hs256($payload));
is($body, "jwt_user|$payload|-|on", 'the claims as signed, a 30-digit number unchanged') or diag($body);

# --- sqldb_setting with a variable.
($status, $body) = get('/whoami', $bob, 'X-Tenant' => "acme's");
like($body, qr/^jwt_user\|.*"sub":"bob".*\|acme's\|on$/, 'sqldb_setting from $http_x_tenant') or diag($body);
($status, $body) = get('/whoami', undef, 'X-Tenant' => 'anon-tenant');
is($body, "jwt_anon|{}|anon-tenant|on", 'anonymous: its role, empty claims, the setting');
($status) = get('/whoami', $bob, 'X-Tenant' => "\xfc\xfd");
is($status, 400, 'a setting of bytes that are not text: 400');
like(nginx_error_log(), qr/\[info\].*sqldb: a parameter was rejected: .*invalid byte sequence/, 'logged at info');
# A claim holding \u0000: PostgreSQL's text cannot hold it, the token is refused.
($status, undef, $head) = get('/notes', hs256('{"sub":"a\u0000b","role":"jwt_user","exp":' . (int($now) + 600) . '}'));
is($status, 401, 'claims holding \u0000: 401');
like(nginx_error_log(), qr/\[info\].*the token's claims hold \\u0000/, 'and the log says why');
# A claim with a line break is no header line: the claim variable is not found.
my $crlf = hs256(claims(role => 'jwt_anon', sub => 'eve\r\nSet-Cookie: evil=1'));
($status, $body, $head) = get('/notes', $crlf);
is("$status $body", '200 bob public', 'a token whose sub holds CR LF runs (as jwt_anon here)');
unlike($head, qr/Set-Cookie|evil/i, 'and its claim adds no header');
is(header_of($head, 'X-Sub'), undef, 'the variable is not found');

# --- Tokens that get 401 (and run nothing).
my @bad = (
    ['forged claims', do { my @p = split /\./, $alice; join '.', $p[0], b64j(claims(sub => 'bob', role => 'jwt_user')), $p[2] }],
    ['another secret', hs256(claims(sub => 'alice', role => 'jwt_user'), secret => 'another secret, also more than thirty-two bytes')],
    ['expired past the leeway', hs256(claims(sub => 'alice', role => 'jwt_user', exp => int($now) - 120))],
    ['not valid yet', hs256(claims(sub => 'alice', role => 'jwt_user', nbf => int($now) + 300))],
    ['alg none', b64j('{"alg":"none","typ":"JWT"}') . '.' . b64j(claims(sub => 'alice', role => 'jwt_user')) . '.'],
    ['alg none with the signature', do { my @p = split /\./, $alice; join '.', b64j('{"alg":"none"}'), $p[1], $p[2] }],
    ['HS512 header on an HS256 key of 50 bytes', hs256(claims(role => 'jwt_user'), header => '{"alg":"HS512"}')],
    ['garbage', 'not-a-token'],
    ['two parts', 'eyJhbGciOiJIUzI1NiJ9.eyJyb2xlIjoiand0X3VzZXIifQ'],
    ['bad base64', 'eyJhbGciOiJIUzI1NiJ9.%%%.abc'],
    ['claims not json', do { my $m = b64j('{"alg":"HS256"}') . '.' . b64j('not json'); "$m." . b64j(hmac_sha256($m, $secret)) }],
    ['exp as a string', hs256('{"role":"jwt_user","exp":"tomorrow"}')],
);
for my $case (@bad) {
    my ($name, $token) = @$case;
    ($status, $body, $head) = request($port, 'POST', '/add?owner=alice&body=refused_' . ($name =~ s/\W/_/gr), Authorization => "Bearer $token");
    is($status, 401, "$name: 401");
    is(header_of($head, 'WWW-Authenticate'), 'Bearer error="invalid_token"', "$name: WWW-Authenticate invalid_token");
}
is(psql("select count(*) from jwt_notes where body like 'refused%'"), '0', 'no query ran for a refused token');
($status, $body, $head) = get('/notes', undef, Authorization => 'Basic YWxpY2U6eA==');
is($status, 401, 'a Basic Authorization header: 401');
like(nginx_error_log(), qr/\[info\].*sqldb: 401: invalid token: the token has expired/, 'client errors log at info');
($status) = get('/notes', hs256(claims(sub => 'alice', role => 'jwt_user', exp => int($now) - 10)));
is($status, 200, 'expired 10 s ago: within the default leeway of 30 s');
($status) = get('/strict', hs256(claims(sub => 'alice', role => 'jwt_user', exp => int($now) - 10)));
is($status, 401, 'expired 10 s ago with sqldb_jwt_leeway 0: 401');
($status, $body) = get('/strict', $alice);
is($body, "jwt_user", 'alg=HS256 location accepts HS256');
# A verified token is kept (its signature is not checked again) but never
# past its exp.
my $soon = int(time) + 3;
my $short = hs256(claims(sub => 'alice', role => 'jwt_user', exp => $soon));
($status) = get('/strict', $short);
is($status, 200, 'a token that expires in 2 to 3 s: 200');
($status) = get('/strict', $short);
is($status, 200, 'again (from the cache of verified tokens): 200');
select(undef, undef, undef, 0.1) while time < $soon + 1.1;
($status) = get('/strict', $short);
is($status, 401, 'once its exp has passed: 401, though it was verified before');

# --- RS256 with a PEM key, and the algorithm-confusion attack.
my $rs = openssl_sign('RS256', "$dir/rsa.pem", claims(sub => 'alice', role => 'jwt_user'));
($status, $body) = get('/rsa', $rs);
is($body, "jwt_user", 'RS256 token verified with the PEM public key');
($status) = get('/rsa', openssl_sign('RS256', "$dir/other.pem", claims(sub => 'alice', role => 'jwt_user')));
is($status, 401, 'RS256 signed by another key: 401');
my $pem = slurp("$dir/rsa.pub");
($status, undef, $head) = get('/rsa', hs256(claims(sub => 'alice', role => 'jwt_user'), header => '{"alg":"HS256"}', secret => $pem));
is($status, 401, 'HS256 signed with the RSA public key as the secret: 401');
($status) = get('/rsa', $alice);
is($status, 401, 'an HS256 token on an RSA location: 401');

# --- ES256 from a JWKS, chosen by kid.
($status, $body) = get('/ec', openssl_sign('ES256', "$dir/ec.pem", claims(sub => 'alice', role => 'jwt_user'), 'ec-1'));
is($body, "jwt_user", 'ES256 token verified with the JWKS key of its kid') or diag($body);
($status) = get('/ec', openssl_sign('ES256', "$dir/ec.pem", claims(sub => 'alice', role => 'jwt_user'), 'ec-2'));
is($status, 401, 'a kid the JWKS does not hold: 401');

# --- Role claim by a dotted path.
($status, $body) = get('/nested', hs256('{"sub":"alice","role":"jwt_outsider","app":{"db":{"role":"jwt_user"}}}'));
is($body, "jwt_user", 'sqldb_jwt_role_claim app.db.role');

# --- Roles that cannot be used: 403 and a log line naming the role.
($status) = get('/notes', hs256(claims(sub => 'eve', role => 'jwt_nobody')));
is($status, 403, 'a role that does not exist: 403');
like(nginx_error_log(), qr/\[error\].*role "jwt_nobody" cannot be used: .*does not exist/, 'logged with the role');
($status) = get('/notes', hs256(claims(sub => 'eve', role => 'jwt_outsider')));
is($status, 403, 'a role the login role is not a member of: 403');
like(nginx_error_log(), qr/\[error\].*role "jwt_outsider" cannot be used: .*permission denied to set role/, 'logged with the role');
($status) = get('/notes', hs256(claims(sub => 'eve', role => 'postgres')));
is($status, 403, 'the superuser role: 403');
($status, $body) = get('/notes', hs256(claims(sub => 'eve', role => 'none')));
is($status, 403, 'the role "none" (which would be the login role): 403');
like(nginx_error_log(), qr/\[error\].*role "none" cannot be used/, 'logged');
($status, $body) = get('/notes', $alice);
is($body, "alice one,alice two,three", 'the connection serves the next request after a 403');

# --- Nothing leaks to the next request on the connection (max=1: one connection).
my $plain = "gateway|-|-|off";
for my $round (1 .. 3) {
    get('/whoami', $alice, 'X-Tenant' => 'leaky');
    my ($s2, $b2) = request($port2, 'GET', '/plain');
    is($b2, $plain, "round $round: after alice's request the next one runs as the login role, no claims, no setting") or diag($b2);
    get('/notes', hs256(claims(sub => 'eve', role => 'jwt_nobody')));
    ($s2, $b2) = request($port2, 'GET', '/plain');
    is($b2, $plain, "round $round: after a 403 too");
}

# The prepared preambles (one per text: read-write and read-only) are made
# once per connection; dropped behind the gateway's back (DEALLOCATE ALL),
# they are prepared again and the request does not fail.
(undef, $body) = request($port2, 'GET', '/held');
ok($body >= 2, 'preambles prepared on the connection') or diag($body);
($status) = request($port2, 'GET', '/dealloc');
is($status, 200, 'deallocate all');
(undef, $body) = request($port2, 'GET', '/held');
is($body, '0', 'none held now');
($status, $body) = get('/note?id=1', $alice);
is($body, "alice one", "a request after the preamble vanished runs (prepared again)");
(undef, $body) = request($port2, 'GET', '/held');
is($body, '1', 'the read-only preamble is prepared again, once');
unlike(nginx_error_log(), qr/prepared statement .* does not exist/, 'no request met the vanished preamble');
# (A POST: the read-write preamble, which is not prepared since DEALLOCATE ALL.)
($status, $body) = request($port, 'POST', '/noprep', Authorization => "Bearer $bob");
is($body, 'jwt_user bob', 'sqldb_prepare off: the role and claims set');
(undef, $body) = request($port2, 'GET', '/held');
is($body, '1', 'sqldb_prepare off: its preamble is not prepared (unnamed)');

# Pipelined: many requests at once on the one connection, alternating
# alice, bob, anonymous and the location without a role.
sub concurrent {
    my (@reqs) = @_;    # [port, path, token, tenant]
    my (@socks, %buf);
    for my $r (@reqs) {
        my ($p, $path, $token, $tenant) = @$r;
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $p) or die "connect: $!";
        binmode $s;
        my $h = '';
        $h .= "Authorization: Bearer $token\r\n" if $token;
        $h .= "X-Tenant: $tenant\r\n" if $tenant;
        print $s "GET $path HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n$h\r\n";
        push @socks, $s;
        $buf{$s} = '';
    }
    my $sel = IO::Select->new(@socks);
    my $deadline = time + 20;
    while ($sel->count && time < $deadline) {
        for my $s ($sel->can_read(1)) {
            my $n = sysread($s, my $chunk, 65536);
            if ($n) { $buf{$s} .= $chunk } else { $sel->remove($s) }
        }
    }
    return map { my ($h, $b) = split /\r\n\r\n/, $buf{$_}, 2; $b // '' } @socks;
}
my @reqs;
for my $i (1 .. 60) {
    my $k = $i % 4;
    push @reqs, $k == 0 ? [$port, '/whoami', $alice, "t$i"]
              : $k == 1 ? [$port, '/whoami', $bob, "t$i"]
              : $k == 2 ? [$port, '/whoami', undef, "t$i"]
              : [$port2, '/plain', undef, "t$i"];
}
my @got = concurrent(@reqs);
my $wrong = 0;
for my $i (0 .. $#reqs) {
    my ($p, $path, $token, $tenant) = @{ $reqs[$i] };
    my $want = $p == $port2 ? qr/^\Q$plain\E$/
        : !$token ? qr/^jwt_anon\|\{\}\|\Q$tenant\E\|on$/
        : $token eq $alice ? qr/^jwt_user\|\{[^|]*"sub":"alice"[^|]*\}\|\Q$tenant\E\|on$/
        : qr/^jwt_user\|\{[^|]*"sub":"bob"[^|]*\}\|\Q$tenant\E\|on$/;
    if ($got[$i] !~ $want) { $wrong++; diag("request $i ($path, $tenant): $got[$i]") if $wrong < 5 }
}
is($wrong, 0, '60 concurrent requests on one connection: each with its own role, claims and setting, the plain ones with none');
my $log = nginx_error_log();
unlike($log, qr/\[(alert|crit|emerg)\]/, 'no alert');
stop_nginx();

# Pipelined with a pool of two connections and prepared statements too.
$port = start(2);
@reqs = ();
for my $i (1 .. 40) {
    push @reqs, $i % 2 ? [$port, '/note?id=1', $alice, undef] : [$port2, '/plain', undef, undef];
}
@got = concurrent(@reqs);
$wrong = grep { $got[$_] ne ($_ % 2 ? $plain : 'alice one') } 0 .. $#got;
is($wrong, 0, '40 concurrent requests over two connections: pk lookups as alice, plain ones as the login role')
    or diag(join ' | ', @got[0 .. 3]);
stop_nginx();

# --- nginx -t refuses what cannot work, naming the directive, file and line.
sub refused {
    my ($what, $directives, $want, $named) = @_;
    # Each directive on a line of its own: the line the message names must
    # hold the directive it is about.
    $directives =~ s/;\s*(?=sqldb_)/;\n        /g;
    my $ok = eval {
        nginx_start(<<"HTTP");
upstream database { sqldb_server $server; }
server {
    listen 127.0.0.1:\$PORT;
    location /x {
        sqldb_pass database;
        $directives
    }
}
HTTP
        1;
    };
    stop_nginx() if $ok;
    ok(!$ok, "$what: nginx refuses the configuration");
    like($@ // '', $want, "$what: the message");
    if (defined $named) {
        my ($file, $line) = ($@ // '') =~ / in (\S+):(\d+)/;
        my @lines = defined $file && -f $file ? split /\n/, slurp($file) : ();
        like($line ? $lines[$line - 1] // '' : '', qr/^\s*\Q$named\E\b/, "$what: the message names the line of $named");
    }
}
spew("$dir/empty", '');
spew("$dir/short", "too short\n");
spew("$dir/private.pem", slurp("$dir/rsa.pem"));
refused('a missing file', "sqldb_jwt_key $dir/missing; sqldb_query \"select 1\";",
    qr/\[emerg\].*"sqldb_jwt_key" cannot read "\Q$dir\E\/missing": .*in \S+nginx\.conf:\d+/);
refused('an empty file', "sqldb_jwt_key $dir/empty; sqldb_query \"select 1\";", qr/\[emerg\].*the file is empty in \S+:\d+/);
refused('a short secret', "sqldb_jwt_key $dir/short; sqldb_query \"select 1\";", qr/\[emerg\].*too short/);
refused('a private key', "sqldb_jwt_key $dir/private.pem; sqldb_query \"select 1\";", qr/\[emerg\].*private key/);
# A public key in a form not read is never taken for an HMAC secret (whoever
# has the key could sign tokens).
run('openssl', 'pkey', '-pubin', '-in', "$dir/rsa.pub", '-outform', 'DER', '-out', "$dir/rsa.der");
spew("$dir/bom.pub", "\xef\xbb\xbf" . slurp("$dir/rsa.pub"));
spew("$dir/text.pub", "the key:\n" . slurp("$dir/rsa.pub"));
spew("$dir/ssh.pub", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user\@host\n");
spew("$dir/array.json", '[{"kty":"oct","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}]');
for my $f (qw(rsa.der bom.pub text.pub ssh.pub array.json)) {
    refused("a key file $f", "sqldb_jwt_key $dir/$f; sqldb_query \"select 1\";",
        qr/\[emerg\].*the file looks like .*, in a form not read here/);
}
refused('an alg that does not fit the key', "sqldb_jwt_key $dir/rsa.pub alg=HS256; sqldb_query \"select 1\";",
    qr/\[emerg\].*alg=HS256 does not fit the key, an RSA public key/);
refused('an unknown alg', "sqldb_jwt_key $dir/secret alg=none; sqldb_query \"select 1\";", qr/\[emerg\].*invalid parameter "alg=none"/);
refused('an anonymous role that looks like a variable', "sqldb_jwt_key $dir/secret; sqldb_anonymous_role \$http_x; sqldb_query \"select 1\";",
    qr/\[emerg\].*the role "\$http_x" in "sqldb_anonymous_role" directive is a name, not a variable/);
refused('an anonymous role without a key', "sqldb_anonymous_role jwt_anon; sqldb_query \"select 1\";",
    qr/\[emerg\].*"sqldb_anonymous_role" needs "sqldb_jwt_key" in \S+:\d+/, 'sqldb_anonymous_role');
refused('several statements', "sqldb_jwt_key $dir/secret; sqldb_query \"begin; select 1; commit\";",
    qr/\[emerg\].*a query of several statements cannot run with "sqldb_jwt_key"/, 'sqldb_query');
refused('a stream with a key', "sqldb_jwt_key $dir/secret; sqldb_listen news;",
    qr/\[emerg\].*"sqldb_listen" does not check the tokens of "sqldb_jwt_key"/, 'sqldb_listen');
refused('a key file that is missing', "sqldb_query \"select 1\"; sqldb_jwt_key $dir/missing;", qr/cannot read/, 'sqldb_jwt_key');
refused('a setting of the claims', "sqldb_setting Request.JWT.Claims x; sqldb_query \"select 1\";",
    qr/\[emerg\].*"sqldb_setting" cannot set "request.jwt.claims"/);
refused('a setting without a dot', "sqldb_setting tenant x; sqldb_query \"select 1\";",
    qr/\[emerg\].*invalid name "tenant" in "sqldb_setting"/);
for my $bad (qw(request.1x request..x request.x-y)) {
    refused("the setting name $bad", "sqldb_setting $bad v; sqldb_query \"select 1\";",
        qr/\[emerg\].*invalid name "\Q$bad\E" in "sqldb_setting"/, 'sqldb_setting');
}

# A set_config of another schema first in the session's search_path (the
# login role's own setting here; a SET left on a pooler's session would do
# the same) does not stand in for PostgreSQL's: the gateway names
# pg_catalog.set_config.
psql(<<'SQL');
drop schema if exists jwt_evil cascade;
create schema jwt_evil;
create function jwt_evil.set_config(text, text, boolean) returns text language sql as $$
  select pg_catalog.set_config($1, case $1 when 'role' then 'jwt_user' when 'request.jwt.claims' then '{"sub":"bob"}' else $2 end, $3)
$$;
grant usage on schema jwt_evil to public;
SQL
$port = nginx_start(<<"HTTP");
upstream database { sqldb_server $server "options=-c search_path=jwt_evil,pg_catalog,public"; }
server {
    listen 127.0.0.1:\$PORT;
    location /notes {
        sqldb_pass database;
        sqldb_jwt_key $dir/secret;
        sqldb_anonymous_role jwt_anon;
        sqldb_output value;
        sqldb_query "select pg_catalog.current_setting('search_path') || ' ' || current_user || ' ' || (select string_agg(body, ',' order by id) from public.jwt_notes)";
    }
}
HTTP
($status, $body) = request($port, 'GET', '/notes');
is($body, 'jwt_evil,pg_catalog,public jwt_anon bob public', "another schema's set_config first in search_path: anonymous stays anonymous");
($status, $body) = request($port, 'GET', '/notes', Authorization => "Bearer $alice");
is($body, 'jwt_evil,pg_catalog,public jwt_user alice one,alice two,three', 'and alice stays alice');
stop_nginx();
psql('drop schema jwt_evil cascade');

# Without sqldb_anonymous_role: no token is 401 with a bare challenge.
$port = nginx_start(<<"HTTP");
upstream database { sqldb_server $server; }
server {
    listen 127.0.0.1:\$PORT;
    location /x {
        sqldb_pass database;
        sqldb_jwt_key $dir/secret;
        sqldb_output value;
        sqldb_query "select current_user";
    }
}
HTTP
($status, $body, $head) = request($port, 'GET', '/x');
is($status, 401, 'no token and no anonymous role: 401');
is(header_of($head, 'WWW-Authenticate'), 'Bearer', 'WWW-Authenticate: Bearer');
($status, $body) = request($port, 'GET', '/x', Authorization => "Bearer $alice");
is($body, "jwt_user", 'with a token: its role');
($status) = request($port, 'GET', '/x', Authorization => 'Bearer ' . hs256('{"sub":"x"}'));
is($status, 401, 'a token without the role claim and no anonymous role: 401');

# A new key takes effect on reload: tokens of the old one are refused.
my $new_secret = 'the rotated secret, also longer than thirty-two bytes';
spew("$dir/secret", "$new_secret\n");
my $rotated = hs256(claims(sub => 'alice', role => 'jwt_user'), secret => $new_secret);
GatewayTest::nginx_signal('HUP');
ok(GatewayTest::wait_until(sub { (request($port, 'GET', '/x', Authorization => "Bearer $rotated"))[1] eq 'jwt_user' }, 10),
    'after a reload, a token of the new key is accepted');
# (The old worker may take one more connection before it has seen the reload.)
ok(GatewayTest::wait_until(sub { (request($port, 'GET', '/x', Authorization => "Bearer $alice"))[0] == 401 }, 10),
    'and a token of the old key is refused');
stop_nginx();

psql('drop table if exists jwt_notes');
done_testing();
