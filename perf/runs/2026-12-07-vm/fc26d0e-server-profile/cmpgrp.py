import sys, re, collections
def grp(sym, kind):
    if kind == 'k': return '[kernel]'
    s = sym.lstrip('<')
    m = re.match(r'([A-Za-z_][A-Za-z0-9_]*)(::([A-Za-z_][A-Za-z0-9_]*))?(::([A-Za-z_][A-Za-z0-9_]*))?', s)
    if not m: return sym[:30]
    if m.group(1) == 'clamp': return 'clamp::' + (m.group(3) or '') + '::' + (m.group(5) or '')
    if m.group(1).startswith('mi_') or m.group(1).startswith('_mi'): return 'mimalloc'
    if m.group(1).startswith('__') : return 'libc:' + m.group(1)[:20]
    return m.group(1)
def load(path, rps):
    d = collections.Counter()
    for line in open(path):
        m = re.match(r'\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)', line)
        if not m: continue
        pct, comm, kind, sym = m.groups()
        d[grp(sym.strip(), kind)] += float(pct) / 100 * 2 / rps * 1e6
    return d
a = load(sys.argv[1], float(sys.argv[2])); b = load(sys.argv[3], float(sys.argv[4]))
print("total A %.1f B %.1f" % (sum(a.values()), sum(b.values())))
for k in sorted(set(a)|set(b), key=lambda k: -abs(b.get(k,0)-a.get(k,0)))[:35]:
    print("%7.2f %7.2f %+6.2f %s" % (a.get(k,0), b.get(k,0), b.get(k,0)-a.get(k,0), k))
