"""`make bench-scale`: the figures behind docs/scaling.md.

    python3 bench/scale.py [OUT_DIR]

Measures, on loopback, with Debian's nginx and the module:
  1. server connections the database gateway holds under load, by nginx
     workers, client concurrency and `sqldb_keepalive max`;
  2. the same through PgBouncer in transaction mode: the gateway's
     connections count against PgBouncer's max_client_conn, PgBouncer's
     pool bounds the server's;
  3. the size and round-trip time of CLUSTER SLOTS on a real Redis Cluster
     of three masters with a replica each (what a slot map refresh costs);
  4. a network partition between nginx and PostgreSQL, simulated by a TCP
     relay that stops passing bytes without closing anything (as dropped
     packets do): what requests get during it and how soon after it heals
     they succeed again.
Prints a report and writes it to OUT_DIR/scale.txt (default target/bench).
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from common import HERE, MODULE, NGINX, PGPW, REPO, free_port

SECS = int(os.environ.get("BENCH_SECONDS", "5"))



def run(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def psql(port, sql, user="demo", db="demo"):
    env = dict(os.environ, PGPASSWORD=PGPW)
    return run("psql", "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(port), "-U", user, "-d", db, "-c", sql,
               env=env).strip()


def backends(port):
    return int(psql(port, "select count(*) from pg_stat_activity where datname = 'demo' and pid <> pg_backend_pid()"))


class Nginx:
    def __init__(self, root, http, workers=1):
        self.root = root
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(os.path.join(root, "logs"))
        self.port = free_port()
        conf = f"""load_module {MODULE};
worker_processes {workers};
error_log logs/error.log warn;
pid logs/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    {http.replace("$PORT", str(self.port))}
}}
"""
        with open(os.path.join(root, "nginx.conf"), "w") as f:
            f.write(conf)
        run(NGINX, "-p", root + "/", "-c", os.path.join(root, "nginx.conf"))
        time.sleep(0.3)

    def stop(self):
        pidfile = os.path.join(self.root, "logs", "nginx.pid")
        try:
            os.kill(int(open(pidfile).read()), signal.SIGQUIT)
        except (OSError, ValueError):
            return
        for _ in range(50):
            if not os.path.exists(pidfile):
                break
            time.sleep(0.1)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"


def wrk(url, conns, secs, sample=None):
    """Runs wrk; while it runs, calls sample() every 100 ms and keeps the
    largest value. Returns (requests/s, non-2xx, peak sample)."""
    peak = [0]
    stop = threading.Event()

    def sampler():
        while not stop.wait(0.1):
            try:
                peak[0] = max(peak[0], sample())
            except Exception:
                pass

    t = threading.Thread(target=sampler) if sample else None
    if t:
        t.start()
    out = run("wrk", "-t1", f"-c{conns}", f"-d{secs}s", url)
    stop.set()
    if t:
        t.join()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, int(bad.group(1)) if bad else 0, peak[0]


def pool_connections(tmp, pgport, report):
    report.append("1. Server connections held by the database gateway under load (pk lookup, wrk -c clients, "
                  f"{SECS} s each; peak of pg_stat_activity sampled every 100 ms)")
    report.append(f"   {'workers':>7} {'clients':>7} {'sqldb_keepalive':<22} {'requests/s':>10} {'non-2xx':>7} "
                  f"{'peak server conns':>17}")
    for workers, conns, line in [(1, 32, ""), (1, 256, ""), (2, 32, ""), (2, 256, ""),
                                 (2, 256, "sqldb_keepalive max=2;"), (2, 256, "sqldb_pipeline off;")]:
        ngx = Nginx(os.path.join(tmp, "nginx"), f"""
    upstream db {{
        sqldb_server 127.0.0.1:{pgport} dbname=demo user=demo "password={PGPW}" sslmode=disable;
        {line}
    }}
    server {{
        listen 127.0.0.1:$PORT;
        location = /b {{ sqldb_pass db; sqldb_query "select id, label from items where id = 42"; }}
    }}""", workers)
        try:
            wrk(ngx.url("/b"), conns, 1)
            rps, bad, peak = wrk(ngx.url("/b"), conns, SECS, lambda: backends(pgport))
        finally:
            ngx.stop()
        report.append(f"   {workers:>7} {conns:>7} {line or '(none: max=10)':<22} {rps:>10.0f} {bad:>7} {peak:>17}")
    report.append("")


def through_pgbouncer(tmp, pgport, report):
    bouncer = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(bouncer):
        report.append("2. PgBouncer: not installed, skipped\n")
        return
    d = os.path.join(tmp, "bouncer")
    os.makedirs(d)
    os.chmod(d, 0o777)
    bport = free_port()
    with open(os.path.join(d, "users.txt"), "w") as f:
        f.write(f'"demo" "{PGPW}"\n')
    with open(os.path.join(d, "pgbouncer.ini"), "w") as f:
        f.write(f"""[databases]
demo = host=127.0.0.1 port={pgport} dbname=demo
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {bport}
unix_socket_dir =
auth_type = plain
auth_file = {d}/users.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = {d}/pgbouncer.log
pidfile = {d}/pgbouncer.pid
admin_users = demo
""")
    for n in ("users.txt", "pgbouncer.ini"):
        os.chmod(os.path.join(d, n), 0o644)
    cmd = [bouncer, "-d", "-q", os.path.join(d, "pgbouncer.ini")]
    if os.geteuid() == 0:
        cmd = ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(cmd)]
    subprocess.run(cmd, check=True)
    for _ in range(50):
        try:
            socket.create_connection(("127.0.0.1", bport)).close()
            break
        except OSError:
            time.sleep(0.1)

    def clients():
        rows = psql(bport, "show clients", db="pgbouncer").splitlines()
        return sum(1 for r in rows if "|demo|demo|" in "|" + r)

    report.append("2. Through PgBouncer (transaction mode, default_pool_size=4), 2 workers, 256 clients, "
                  "sqldb_prepare off")
    try:
        for line in ["", "sqldb_keepalive max=2;"]:
            ngx = Nginx(os.path.join(tmp, "nginx"), f"""
    upstream db {{
        sqldb_server 127.0.0.1:{bport} dbname=demo user=demo "password={PGPW}" sslmode=disable;
        {line}
    }}
    server {{
        listen 127.0.0.1:$PORT;
        sqldb_prepare off;
        location = /b {{ sqldb_pass db; sqldb_query "select id, label from items where id = 42"; }}
    }}""", 2)
            try:
                wrk(ngx.url("/b"), 256, 1)
                server_peak = [0]

                def both():
                    server_peak[0] = max(server_peak[0], backends(pgport))
                    return clients()

                rps, bad, peak = wrk(ngx.url("/b"), 256, SECS, both)
            finally:
                ngx.stop()
            report.append(f"   {line or '(no sqldb_keepalive line)':<26} {rps:>8.0f} requests/s, {bad} non-2xx, "
                          f"{peak} gateway connections to PgBouncer, {server_peak[0]} PgBouncer connections to "
                          "PostgreSQL")
    finally:
        try:
            os.kill(int(open(os.path.join(d, "pgbouncer.pid")).read()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
    report.append("")


def resp_read_reply(sock):
    """Reads one whole RESP reply; returns its bytes."""
    buf = b""

    def need(n):
        nonlocal buf
        while len(buf) < n:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk

    def line(at):
        while True:
            i = buf.find(b"\r\n", at)
            if i >= 0:
                return i
            need(len(buf) + 1)

    def parse(at):
        need(at + 1)
        end = line(at)
        kind, head = buf[at:at + 1], buf[at + 1:end]
        at = end + 2
        if kind == b"$":
            n = int(head)
            if n < 0:
                return at
            need(at + n + 2)
            return at + n + 2
        if kind == b"*":
            for _ in range(max(int(head), 0)):
                at = parse(at)
            return at
        return at

    end = parse(0)
    return buf[:end]


def cluster_slots(tmp, report):
    if not shutil.which("redis-server"):
        report.append("3. Redis Cluster: redis-server is not installed, skipped\n")
        return
    d = os.path.join(tmp, "cluster")
    os.makedirs(d)
    ports = [free_port() for _ in range(6)]
    procs = []
    try:
        for p in ports:
            procs.append(subprocess.Popen(
                ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", f"{d}/nodes-{p}.conf", "--cluster-node-timeout", "1000",
                 # The bus port is the port + 10000 unless given: past 65535 for a high one.
                 "--cluster-port", str(free_port()),
                 "--save", "", "--appendonly", "no", "--dir", d, "--logfile", f"{d}/{p}.log"]))
        for p in ports:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", p)).close()
                    break
                except OSError:
                    time.sleep(0.05)
        run("redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "1",
            "--cluster-yes")
        for _ in range(100):
            if all("cluster_state:ok" in run("redis-cli", "-p", str(p), "cluster", "info") for p in ports):
                break
            time.sleep(0.1)
        s = socket.create_connection(("127.0.0.1", ports[0]))
        cmd = b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n"
        s.sendall(cmd)
        reply = resp_read_reply(s)
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            s.sendall(cmd)
            resp_read_reply(s)
        rtt = (time.perf_counter() - t0) / n * 1e6
        s.sendall(b"*2\r\n$7\r\nCLUSTER\r\n$6\r\nSHARDS\r\n")
        shards = resp_read_reply(s)
        s.close()
        report.append("3. A slot map refresh on a Redis Cluster of 3 masters with 1 replica each (loopback)")
        report.append(f"   CLUSTER SLOTS: {len(cmd)} bytes sent, a reply of {len(reply)} bytes "
                      f"({len(reply) / 6:.0f} bytes per node), {rtt:.0f} us per round trip ({n} in a row)")
        report.append(f"   (CLUSTER SHARDS, for comparison: a reply of {len(shards)} bytes)")
        report.append("")
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()


class BlackHoleRelay:
    """A TCP relay to a server that can stop passing bytes in both
    directions without closing anything, as a network partition does."""

    def __init__(self, target):
        self.target = target
        self.open = threading.Event()
        self.open.set()
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(256)
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            # A partition also keeps new connections from being made: the
            # relay accepts (the kernel would have), but nothing goes on.
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        self.open.wait()
        try:
            u = socket.create_connection(("127.0.0.1", self.target))
        except OSError:
            c.close()
            return
        for a, b in ((c, u), (u, c)):
            threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    def pump(self, a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                self.open.wait()
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def get_status(url, timeout=30):
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    except Exception:
        code = 0
    return code, time.monotonic() - t0


def partition(tmp, pgport, report):
    relay = BlackHoleRelay(pgport)
    ngx = Nginx(os.path.join(tmp, "nginx"), f"""
    upstream db {{
        sqldb_server 127.0.0.1:{relay.port} dbname=demo user=demo "password={PGPW}" sslmode=disable;
    }}
    server {{
        listen 127.0.0.1:$PORT;
        sqldb_connect_timeout 2s;
        sqldb_result_timeout 3s;
        location = /b {{ sqldb_pass db; sqldb_query "select id, label from items where id = 42"; }}
    }}""", 1)
    try:
        warm = [get_status(ngx.url("/b"))[0] for _ in range(20)]
        relay.open.clear()
        during = []
        threads = [threading.Thread(target=lambda: during.append(get_status(ngx.url("/b")))) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        healed = time.monotonic()
        relay.open.set()
        first_ok = None
        for _ in range(400):
            code, _ = get_status(ngx.url("/b"), timeout=10)
            if code == 200:
                first_ok = time.monotonic() - healed
                break
            time.sleep(0.01)
    finally:
        ngx.stop()
    codes = sorted({c for c, _ in during})
    times = sorted(t for _, t in during)
    report.append("4. A partition between nginx and PostgreSQL (a relay that stops passing bytes), "
                  "sqldb_connect_timeout 2s, sqldb_result_timeout 3s, 1 worker")
    report.append(f"   before: {warm.count(200)} of {len(warm)} requests 200")
    report.append(f"   during: 10 requests, statuses {codes}, answered after {times[0]:.2f} to {times[-1]:.2f} s")
    report.append("   after the partition heals: first 200 " +
                  (f"{first_ok * 1000:.0f} ms later" if first_ok is not None else "not within 4 s"))
    report.append("")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "target", "bench")
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ngx-gateway-scale-")
    os.chmod(tmp, 0o755)
    pgdir = os.path.join(tmp, "pg")
    pgport = free_port()
    report = [f"ngx_gateway scale-out figures, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
              f"{run(NGINX, '-v').strip() or subprocess.run([NGINX, '-v'], capture_output=True, text=True).stderr.strip()}",
              ""]
    subprocess.run([os.path.join(REPO, "nginx-conf", "pg-sandbox.sh"), "start", pgdir, str(pgport),
                    os.path.join(HERE, "schema.sql")], check=True, stdout=subprocess.DEVNULL)
    try:
        pool_connections(tmp, pgport, report)
        through_pgbouncer(tmp, pgport, report)
        cluster_slots(tmp, report)
        partition(tmp, pgport, report)
    finally:
        subprocess.run([os.path.join(REPO, "nginx-conf", "pg-sandbox.sh"), "stop", pgdir])
        shutil.rmtree(tmp, ignore_errors=True)
    text = "\n".join(report)
    print(text)
    with open(os.path.join(out, "scale.txt"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
