# What the tests of the role a session keeps (t/136, t/137) share: an
# HS256 secret in a file, tokens signed with it, and a request whose
# answer is "STATUS BODY".
package SessionJwt;
use strict;
use warnings;
use Exporter 'import';
use Digest::SHA qw(hmac_sha256);
use MIME::Base64 qw(encode_base64url);
use File::Basename qw(dirname);
use lib dirname(__FILE__);
use HttpClient qw(http_send_request http_read);

our @EXPORT_OK = qw(write_secret hs256_token status_body);

# Writes `$secret` to "$dir/secret" (for sqldb_jwt_key).
sub write_secret {
    my ($dir, $secret) = @_;
    open my $fh, '>', "$dir/secret" or die "$dir/secret: $!";
    print $fh "$secret\n";
    close $fh;
}

# A token of `sub` and `role` that expires in ten minutes.
sub hs256_token {
    my ($secret, $sub, $role) = @_;
    my $msg = encode_base64url('{"alg":"HS256"}') . '.'
        . encode_base64url(sprintf '{"sub":"%s","role":"%s","exp":%d}', $sub, $role, time + 600);
    return "$msg." . encode_base64url(hmac_sha256($msg, $secret));
}

# One request (with the token as a bearer one, if any): "STATUS BODY".
sub status_body {
    my ($port, $method, $path, $token) = @_;
    my $s = http_send_request($port, $method, $path, undef, $token ? (Authorization => "Bearer $token") : ());
    my ($status, $body) = http_read($s, 20);
    return (($status // 0) . ' ' . ($body // ''));
}

1;
