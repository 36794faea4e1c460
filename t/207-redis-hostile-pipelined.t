# t/202's hostile and broken Redis, with the shared, pipelined connections
# (`cache_pipeline on`, the default): every case, status, log line and
# next request the same, except where the file says the two differ.
use strict;
use warnings;

BEGIN { $ENV{GATEWAY_CACHE_PIPELINE} = 'on' }
my $file = 't/202-redis-hostile.t';
my $rc = do "./$file";
die "$file: $@" if $@;
