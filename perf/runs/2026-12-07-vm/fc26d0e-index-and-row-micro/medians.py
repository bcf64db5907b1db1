import collections,statistics,sys
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
    p=l.split()
    if p and p[0]=='round' and len(p)==4: d[int(p[1])][p[2]]=float(p[3])
tabs=['t_all','t_noexpr','t_fewer','t_old','t_narrow']
for t in tabs:
    v=[d[k][t] for k in sorted(d) if t in d[k]]
    r=[d[k][t]/d[k]['t_all'] for k in sorted(d) if t in d[k] and 't_all' in d[k]]
    print('%-9s median tps %7.1f  ÷ t_all by round %s  median %.3f' % (t, statistics.median(v), ' '.join('%.3f'%x for x in r), statistics.median(r)))
r=[d[k]['t_narrow']/d[k]['t_old'] for k in sorted(d) if 't_narrow' in d[k]]
print('t_narrow ÷ t_old by round', ' '.join('%.3f'%x for x in r), 'median %.3f'%statistics.median(r))
