import sys, re, collections
def load(path, rps):
    d = collections.Counter()
    for line in open(path):
        m = re.match(r'\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)', line)
        if not m: continue
        pct, comm, kind, sym = m.groups()
        if not comm.startswith('clamp'): continue
        d[sym.strip()] += float(pct)
    # % of machine samples per 1000 req/s -> µs per request: 2 cores * pct/100 / rps * 1e6
    return {k: v / 100 * 2 / rps * 1e6 for k, v in d.items()}
a = load(sys.argv[1], float(sys.argv[2])); b = load(sys.argv[3], float(sys.argv[4]))
print("total A %.1f B %.1f µs/req" % (sum(a.values()), sum(b.values())))
keys = set(a) | set(b)
rows = sorted(keys, key=lambda k: -(b.get(k, 0) - a.get(k, 0)))
for k in rows[:40]:
    print("%7.2f %7.2f %+7.2f  %s" % (a.get(k, 0), b.get(k, 0), b.get(k, 0) - a.get(k, 0), k[:110]))
print("...")
for k in rows[-15:]:
    print("%7.2f %7.2f %+7.2f  %s" % (a.get(k, 0), b.get(k, 0), b.get(k, 0) - a.get(k, 0), k[:110]))
