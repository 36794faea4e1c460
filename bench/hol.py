"""Head-of-line check for `make bench`: fast requests while SLOW queries
(default 1) run for a second each on the same upstream.

    python3 hol.py BASE_URL COUNT CONCURRENCY [SLOW]

Two rounds: the slow requests go first and the fast ones start 50 ms
later; then the fast ones run and the slow ones join them in the middle.
Prints the fast requests' latency percentiles of each round."""

import http.client
import sys
import threading
import time
import urllib.parse


def get(conn, path):
    start = time.monotonic()
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    return resp.status, time.monotonic() - start


def fast_requests(base, count, concurrency, slow_at=None, slow_count=1):
    host = urllib.parse.urlsplit(base).netloc
    latencies = []
    lock = threading.Lock()
    next_i = [0]
    failures = [0]

    def worker():
        conn = http.client.HTTPConnection(host, timeout=10)
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= count:
                break
            if slow_at is not None and i == slow_at:
                for _ in range(slow_count):
                    threading.Thread(target=slow, daemon=True).start()
            status, took = get(conn, "/b?id=%d" % (i % 10000 + 1))
            with lock:
                latencies.append(took)
                if status != 200:
                    failures[0] += 1
        conn.close()

    def slow():
        conn = http.client.HTTPConnection(host, timeout=10)
        get(conn, "/sleep")
        conn.close()

    if slow_at is None:
        for _ in range(slow_count):
            threading.Thread(target=slow, daemon=True).start()
        time.sleep(0.05)
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    n = len(latencies)
    pct = lambda p: latencies[min(n - 1, int(n * p))] * 1000
    return pct(0.5), pct(0.99), latencies[-1] * 1000, failures[0]


def main():
    base, count, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    slow_count = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    # Warm the pool, then let the connections settle.
    fast_requests(base, 50, concurrency, slow_at=10**9)
    p50, p99, mx, bad = fast_requests(base, count, concurrency, slow_count=slow_count)
    print("p99 %.2f ms, p50 %.2f ms, max %.1f ms, %d failed (slow query first);" % (p99, p50, mx, bad), end=" ")
    time.sleep(1.2 if slow_count == 1 else 2.2)
    p50, p99, mx, bad = fast_requests(base, count, concurrency, slow_at=count // 4, slow_count=slow_count)
    print("p99 %.2f ms, p50 %.2f ms, max %.1f ms, %d failed (slow query joins mid-way)" % (p99, p50, mx, bad))


if __name__ == "__main__":
    main()
