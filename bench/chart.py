"""Draws `make bench`'s figures (results.tsv) as an SVG bar chart.

    python3 chart.py results.tsv chart.svg

Left: each SQL scenario, the gateway under each pool setting as a ratio to
pgbench -M prepared. Middle: cache GET, each client as a ratio to nginx's
`return 200` of the same bytes. Right: each SQL scenario (default pool)
and the cache GET as a ratio to nginx's `return 200` of a body of the same
length, with the worker's CPU microseconds per request of both under the
bar. A line marks 1.0."""

import csv
import sys

CONFIGS = [("default", "no keepalive line", "#1f77b4"), ("max32", "max=32", "#ff7f0e"), ("max2", "max=2", "#2ca02c")]
SCENARIOS = [("a", "echo"), ("b", "pk lookup"), ("c", "100 rows x 3")]
CACHE = [("r", "gateway cache_pass", "#1f77b4"), ("roff", "cache_pipeline off", "#aec7e8"), ("m", "memc + memcached", "#9467bd"), ("rb", "redis-benchmark", "#8c564b")]


def load(path):
    rows = list(csv.DictReader(open(path), delimiter="\t"))
    rps, cpu = {}, {}
    for r in rows:
        key = (r["scenario"], r["client"], r["config"])
        rps[key] = float(r["rps"] or 0)
        cpu[key] = float(r.get("cpu_us") or 0)
    return rps, cpu


def bars(groups, width, height, top, left, title, ymax):
    """groups: [(label, [(value, colour, caption)])] -> SVG elements; a
    label may have a second line after a newline."""
    out = []
    plot_h = height - 60
    scale = plot_h / ymax
    base = top + plot_h
    out.append('<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>' % (left, top - 12, title))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>' % (left, base, left + width, base))
    one = base - scale
    out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#c00" stroke-dasharray="4 3"/>' % (left, one, left + width, one))
    out.append('<text x="%d" y="%.1f" font-size="11" fill="#c00" text-anchor="end">1.0</text>' % (left - 4, one + 4))
    group_w = width / max(1, len(groups))
    for gi, (label, values) in enumerate(groups):
        bar_w = (group_w - 20) / max(1, len(values))
        x0 = left + gi * group_w + 10
        for vi, (value, colour, _) in enumerate(values):
            h = min(value, ymax) * scale
            x = x0 + vi * bar_w
            out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>' % (x, base - h, bar_w - 4, h, colour))
            out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%.2f</text>' % (x + (bar_w - 4) / 2, base - h - 3, value))
        for li, line in enumerate(label.split("\n")):
            size = 12 if li == 0 else 10
            out.append('<text x="%.1f" y="%d" font-size="%d" text-anchor="middle">%s</text>' % (x0 + (group_w - 20) / 2, base + 16 + li * 13, size, line))
    return out


def legend(items, x, y):
    out = []
    for i, (caption, colour) in enumerate(items):
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/>' % (x, y + i * 18, colour))
        out.append('<text x="%d" y="%d" font-size="12">%s</text>' % (x + 18, y + i * 18 + 10, caption))
    return out


def main():
    rps, cpu = load(sys.argv[1])
    sql = []
    for s, label in SCENARIOS:
        pg = rps.get((s, "pgbench -M prepared", "-"), 0)
        values = []
        for cfg, caption, colour in CONFIGS:
            g = rps.get((s, "gateway", cfg), 0)
            values.append((g / pg if pg else 0, colour, caption))
        sql.append((label, values))
    ceiling = rps.get(("ret", "nginx", "-"), 0)
    cache_values = []
    for key, caption, colour in CACHE:
        v = rps.get(("r", "redis-benchmark", "-"), 0) if key == "rb" else rps.get((key, "nginx", "-"), 0)
        cache_values.append((v / ceiling if ceiling else 0, colour, caption))
    floor = []
    for s, label in SCENARIOS + [("r", "cache GET")]:
        mine = ("r", "nginx", "-") if s == "r" else (s, "gateway", "default")
        theirs = ("ret", "nginx", "-") if s == "r" else ("ret_" + s, "nginx", "-")
        ceiling_s = rps.get(theirs, 0)
        caption = "%s\n%.1f / %.1f us" % (label, cpu.get(mine, 0), cpu.get(theirs, 0))
        floor.append((caption, [(rps.get(mine, 0) / ceiling_s if ceiling_s else 0, "#1f77b4", label)]))
    ymax = max([1.2] + [v for _, vs in sql for v, _, _ in vs] + [v for v, _, _ in cache_values]) * 1.1
    elements = []
    elements += bars(sql, 420, 320, 40, 50, "SQL: gateway / pgbench -M prepared", ymax)
    elements += legend([(c, col) for _, c, col in CONFIGS], 60, 345)
    elements += bars([("cache GET", cache_values)], 220, 320, 40, 540, "Cache: client / nginx return 200", ymax)
    elements += legend([(c, col) for _, c, col in CACHE], 550, 345)
    elements += bars(floor, 340, 320, 40, 840, "Gateway / return 200 of the same length", ymax)
    elements.append('<text x="850" y="400" font-size="11">under each: worker CPU us/request, gateway / return 200</text>')
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="1200" height="420" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>'] + elements + ["</svg>"]
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
