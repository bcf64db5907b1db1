import subprocess, sys, re
def load(prefix):
    out = subprocess.run(["perf","report","-i",prefix+".data","--children","--sort","sym","--stdio","-g","none","--percent-limit","0.3"],capture_output=True,text=True).stdout
    total = None; d = {}
    for line in out.splitlines():
        m = re.match(r"# Samples: (\d+)(K?)", line)
        if m: total = int(m.group(1)) * (1000 if m.group(2) else 1)
        m = re.match(r"\s*([\d.]+)%\s+([\d.]+)%\s+\[(.)\]\s+(.*)$", line)
        if m:
            k = m.group(4).strip()
            if k.startswith('0x'): continue
            d[k] = (float(m.group(1)), float(m.group(2)))
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", open(prefix+".wrk").read()).group(1))
    return d, total, rate
a, ta, ra = load(sys.argv[1]); b, tb, rb = load(sys.argv[2])
secs = 8
# µs per request: samples at 499 Hz
fa = ta/100 * 1e6/499/(ra*secs); fb = tb/100 * 1e6/499/(rb*secs)
print(f"total: A {ta/499*1e6/(ra*secs):.1f} µs/req  B {tb/499*1e6/(rb*secs):.1f} µs/req")
keys = sys.argv[3:] if len(sys.argv) > 3 else sorted(set(a)|set(b), key=lambda k: -abs(b.get(k,(0,0))[0]*fb - a.get(k,(0,0))[0]*fa))[:60]
for k in keys:
    ca = a.get(k,(0,0))[0]*fa; cb = b.get(k,(0,0))[0]*fb
    print(f"{ca:7.2f} {cb:7.2f} {cb-ca:+7.2f}  {k[:80]}")
