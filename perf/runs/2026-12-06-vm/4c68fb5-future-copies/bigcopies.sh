#!/bin/bash
# bigcopies.sh BIN: functions with memcpy of constant size >= 2 KB (the sizes of moved futures)
objdump -d --no-show-raw-insn -C "$1" | python3 -c "
import sys,re
fn='';last=0;out={}
for l in sys.stdin:
    if l.endswith('>:\n'): fn=l.split('<',1)[1][:-3]; last=0; continue
    m=re.search(r'mov\s+\\\$0x([0-9a-f]+),%edx',l)
    if m: last=int(m.group(1),16); continue
    if 'memcpy' in l or re.search(r'call\s+\*%r(1[2-5]|bp|bx)',l):
        if 0x800<=last<0x100000: out.setdefault(fn,[]).append(last)
        last=0
for f,v in sorted(out.items(), key=lambda x:-max(x[1])):
    if 'clamp' in f: print(max(v), len(v), f[:150])
"
