#!/usr/bin/env python3
"""Time per size of nccl-tests logs, each variant divided by Socket's (out of place, median of rounds).

usage: nccl_ratios.py DIR VARIANT[,VARIANT...]  (logs named nccl-<coll>-<variant>-r<round>.log, one variant socket)
"""
import re,sys,glob,statistics,os
d=sys.argv[1]; variants=sys.argv[2].split(',')
rows={}
for f in glob.glob(os.path.join(d,'nccl-*.log')):
    name=os.path.basename(f)[:-4]; r={}
    for line in open(f):
        m=re.match(r'^\s+(\d+)\s+\d+\s+(float|int8|char)\s+\S+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)',line)
        if m: r[int(m.group(1))]=(float(m.group(3)),float(m.group(5)))
    rows[name]=r
sizes=[8,32,2048,8192,32768,131072,524288,2097152,8388608,33554432,134217728]
lab={8:'8 B',32:'32 B',2048:'2 KiB',8192:'8 KiB',32768:'32 KiB',131072:'128 KiB',524288:'512 KiB',2097152:'2 MiB',8388608:'8 MiB',33554432:'32 MiB',134217728:'128 MiB'}
for coll in ['all_reduce','all_gather','alltoall','sendrecv']:
    def med(var):
        ks=[k for k in rows if re.match(f'nccl-{coll}-{var}-r\\d$',k)]
        out={}
        for s in sizes:
            t=[rows[k][s][0] for k in ks if s in rows[k]]; b=[rows[k][s][1] for k in ks if s in rows[k]]
            if t: out[s]=(statistics.median(t),statistics.median(b),len(t))
        return out
    S=med('socket'); ss=[s for s in sizes if s in S]
    print(f'\n{coll}: time / Socket time (medians of rounds: ' + ', '.join(f'{v} {max([x[2] for x in med(v).values()] or [0])}' for v in ['socket']+variants)+')')
    print('| variant | '+' | '.join(lab[s] for s in ss)+' |')
    print('|---|'+'---|'*len(ss))
    print('| Socket, us | '+' | '.join(f'{S[s][0]:.0f}' for s in ss)+' |')
    for v in variants:
        m=med(v); print(f'| {v} | '+' | '.join(f'{m[s][0]/S[s][0]:.2f}' if s in m else '-' for s in ss)+' |')
    print('busbw GB/s at 32 MiB / 128 MiB: '+'; '.join(f'{v} {med(v)[33554432][1]:.2f} / {med(v)[134217728][1]:.2f}' for v in ['socket']+variants if 134217728 in med(v)))
