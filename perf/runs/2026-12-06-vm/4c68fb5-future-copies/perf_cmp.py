import re,sys
# usage: cmp.py old1:reqs old2:reqs -- new1:reqs new2:reqs
args=sys.argv[1:]; i=args.index('--'); A=args[:i]; B=args[i+1:]
def load(n):
    d={}
    for l in open(f'/tmp/{n}.full'):
        m=re.match(r'\s*([\d.]+)%\s+(\d+)\s+\[(.)\]\s+(.*)',l)
        if m:
            k=re.sub(r"\s+-\s+-\s*$","",m.group(4)).strip(); d[k]=d.get(k,0)+int(m.group(2))
    return d
def agg(lst):
    t={}
    for a in lst:
        n,r=a.split(':'); r=float(r)
        for k,v in load(n).items(): t[k]=t.get(k,0)+v/(r*20)/1999*1e9/len(lst)
    return t
o=agg(A); h=agg(B)
print('total ns/req A %.0f B %.0f'%(sum(o.values()),sum(h.values())))
keys=set(o)|set(h)
diff=sorted(keys,key=lambda k:-(h.get(k,0)-o.get(k,0)))
N=int(__import__('os').environ.get('N','40'))
for k in diff[:N]: print('%7.0f %7.0f %+7.0f  %s'%(o.get(k,0),h.get(k,0),h.get(k,0)-o.get(k,0),k[:110]))
print('---- decreased')
for k in diff[-12:]: print('%7.0f %7.0f %+7.0f  %s'%(o.get(k,0),h.get(k,0),h.get(k,0)-o.get(k,0),k[:110]))
