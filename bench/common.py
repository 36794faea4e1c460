"""What the Python benchmarks share: where nginx and the module are, the
sandbox's password, and a free loopback port."""

import os
import socket

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NGINX = os.environ.get("NGINX", "/usr/sbin/nginx")
MODULE = os.environ.get("MODULE", os.path.join(REPO, "objs", "ngx_http_gateway_module.so"))
# The password of pg-sandbox.sh's role "demo".
PGPW = "demo pass"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
