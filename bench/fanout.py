"""`make bench-fanout`: one event to many server-sent-event subscribers.

    python3 bench/fanout.py [SUBSCRIBERS [SOURCE...]]
        (default 10000 subscribers, each source in turn: sqldb_listen,
        cache_subscribe, cache_stream; name some to run only those, e.g.
        for a worker's RSS that no run before it has grown)

Starts a throwaway PostgreSQL, Redis and nginx (one worker) with a
`sqldb_listen`, a `cache_subscribe` and a `cache_stream` location. For
each, in turn: opens SUBSCRIBERS event streams on one channel (or stream
key), sends one event (NOTIFY, PUBLISH or XADD with redis-cli), and prints the worker's RSS with everyone
subscribed and the time from the event to each subscriber's copy (p50,
p99, max: the clients run on the same machine, so these include their own
scheduling).
"""

import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from common import MODULE, NGINX, PGPW, REPO, free_port


def worker_rss_kb(master_pid):
    pids = subprocess.run(["pgrep", "-P", str(master_pid)], capture_output=True, text=True).stdout.split()
    total = 0
    for pid in pids:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS"):
                total += int(line.split()[1])
    return total


async def subscriber(port, path, ready, got):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    await w.drain()
    buf = b""
    while b": subscribed" not in buf:
        chunk = await r.read(4096)
        if not chunk:
            raise ConnectionError("the stream ended before it was subscribed")
        buf += chunk
    ready.append(1)
    while b"data: go" not in buf:
        chunk = await r.read(4096)
        if not chunk:
            break
        buf += chunk
    if b"data: go" in buf:
        got.append(time.monotonic())
    w.close()


async def run(n, port, path, send, master_pid):
    ready, got = [], []
    tasks = []
    rss0 = worker_rss_kb(master_pid)
    for _ in range(n):
        tasks.append(asyncio.create_task(subscriber(port, path, ready, got)))
        if len(tasks) % 500 == 0:
            await asyncio.sleep(0.05)
    deadline = time.monotonic() + 120
    while len(ready) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    rss = worker_rss_kb(master_pid)
    t0 = time.monotonic()
    subprocess.run(send, env=dict(os.environ, PGPASSWORD=PGPW), check=True, stdout=subprocess.DEVNULL)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    errors = {}
    for r in results:
        if isinstance(r, BaseException):
            errors[repr(r)[:80]] = errors.get(repr(r)[:80], 0) + 1
    for e, count in sorted(errors.items()):
        print(f"{count} subscribers failed: {e}")
    lat = sorted((t - t0) * 1000 for t in got)
    if not lat:
        print("no subscriber received the event")
        return
    print(f"{len(ready)} of {n} subscribed, one nginx worker: RSS {rss} kB ({rss * 1024 // max(len(ready), 1)} bytes "
          f"per subscriber with the worker's own; {(rss - rss0) * 1024 // max(len(ready), 1)} bytes per subscriber "
          f"over the {rss0} kB before they came)")
    print(f"event to subscriber: p50 {lat[len(lat) // 2]:.1f} ms, p99 {lat[int(len(lat) * 0.99)]:.1f} ms, "
          f"max {lat[-1]:.1f} ms; {len(lat)} of {len(ready)} received it")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    only = set(sys.argv[2:])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = hard if hard != resource.RLIM_INFINITY else 1 << 20
    want = min(hard, n + 1000)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < n + 100:
        sys.exit(f"the open files limit ({hard}) is too low for {n} subscribers")
    tmp = tempfile.mkdtemp(prefix="ngx-gateway-fanout-")
    os.chmod(tmp, 0o755)
    pgport, port, rport = free_port(), free_port(), free_port()
    sandbox = os.path.join(REPO, "nginx-conf", "pg-sandbox.sh")
    subprocess.run([sandbox, "start", f"{tmp}/pg", str(pgport)], check=True, stdout=subprocess.DEVNULL)
    redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    os.makedirs(f"{tmp}/nginx/logs")
    with open(f"{tmp}/nginx/nginx.conf", "w") as f:
        f.write(f"""load_module {MODULE};
worker_processes 1;
worker_rlimit_nofile {min(2 * n + 1000, hard)};
error_log logs/error.log warn;
pid logs/nginx.pid;
events {{ worker_connections {2 * n + 500}; }}
http {{
    access_log off;
    upstream db {{ sqldb_server 127.0.0.1:{pgport} dbname=demo user=demo "password={PGPW}" sslmode=disable; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location /events {{ sqldb_pass db; sqldb_listen $arg_channel; }}
        location /cache-events {{ cache_pass 127.0.0.1:{rport}; cache_subscribe $arg_channel; }}
        location /stream-events {{ cache_pass 127.0.0.1:{rport}; cache_stream $arg_key; }}
    }}
}}
""")
    try:
        subprocess.run([NGINX, "-p", f"{tmp}/nginx/", "-c", f"{tmp}/nginx/nginx.conf"], check=True)
        time.sleep(0.3)
        master = int(open(f"{tmp}/nginx/logs/nginx.pid").read())
        for name, path, send in [
            ("sqldb_listen, one NOTIFY", "/events?channel=fan",
             ["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(pgport), "-U", "demo", "demo", "-c", "notify fan, 'go'"]),
            ("cache_subscribe, one PUBLISH", "/cache-events?channel=fan",
             ["redis-cli", "-p", str(rport), "publish", "fan", "go"]),
            ("cache_stream, one XADD", "/stream-events?key=fan",
             ["redis-cli", "-p", str(rport), "xadd", "fan", "*", "data", "go"]),
        ]:
            if only and name.split(",")[0] not in only:
                continue
            print(f"== {name}")
            asyncio.run(run(n, port, path, send, master))
            time.sleep(1)
    finally:
        lines = [l for l in open(f"{tmp}/nginx/logs/error.log") if "[notice]" not in l]
        if lines:
            print(f"nginx's error log ({len(lines)} lines), the last ones:")
            print("".join(lines[-5:]), end="")
        try:
            os.kill(int(open(f"{tmp}/nginx/logs/nginx.pid").read()), 3)
            time.sleep(1)
        except (OSError, ValueError):
            pass
        subprocess.run([sandbox, "stop", f"{tmp}/pg"], stdout=subprocess.DEVNULL)
        redis.terminate()
        redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
