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

our @EXPORT_OK = qw(write_secret hs256_token status_body waves);

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

# Sends one request (with the token as a bearer one, if any).
sub send_one {
    my ($port, $method, $path, $token) = @_;
    return http_send_request($port, $method, $path, undef, $token ? (Authorization => "Bearer $token") : ());
}

# Its answer: "STATUS BODY".
sub answer {
    my ($status, $body) = http_read($_[0], 20);
    return (($status // 0) . ' ' . ($body // ''));
}

# One request: "STATUS BODY".
sub status_body {
    my ($port, @request) = @_;
    return answer(send_one($port, @request));
}

# `$count` waves of `$size` requests drawn at random from `@$kinds`
# ([METHOD, PATH, TOKEN or undef, the answer: a string or a pattern]), each
# wave sent at once on connections of their own, then read. Returns
# (answers that were wrong, answers); the first five wrong ones are shown.
sub waves {
    my ($port, $kinds, $count, $size) = @_;
    my ($wrong, $total) = (0, 0);
    for my $wave (1 .. $count) {
        my @batch = map { $kinds->[int rand @$kinds] } 1 .. $size;
        my @socks = map { send_one($port, @$_[0 .. 2]) } @batch;
        for my $i (0 .. $#batch) {
            my $got = answer($socks[$i]);
            my $want = $batch[$i][3];
            $total++;
            next if ref $want ? $got =~ $want : $got eq $want;
            $wrong++;
            Test::More::diag("wave $wave: $batch[$i][0] $batch[$i][1] got $got") if $wrong <= 5;
        }
    }
    return ($wrong, $total);
}

1;
