import re, collections, sys
stacks=[]; cur=[]
for line in open(sys.argv[1]):
    line=line.rstrip()
    if not line:
        if cur: stacks.append(cur)
        cur=[]; continue
    if line.startswith('\t') or line.startswith(' '):
        parts=line.strip().split(' ',1)
        if len(parts)==2:
            sym=re.sub(r'\+0x[0-9a-f]+',' ',parts[1]).split(' (')[0].strip()
            cur.append(sym)
if cur: stacks.append(cur)
comp=[s for s in stacks if any('Engine::Compress' in f for f in s)]
dec=[s for s in stacks if any('Engine::DecodeStep' in f for f in s)]
print("decode",len(dec),"compress",len(comp), "%.1f%% of decode"%(100*len(comp)/len(dec)))
keys=['MaxProbScores','AttentionScores','FpsOrder','BeaconBank::Beacons','OrderedHead::OrderedHead','ToKeepSet','RotateMany','TopK','GatherHead','SelectUniform','ProtectMask','Pool1d','ReservePrompt','CoverageFor','CopyOrdered','DueHeads','malloc','free','operator new','memset','memmove']
mid=collections.Counter()
for s in comp:
    hit='other:'+s[0][:60]
    for f in s:
        k2=[k for k in keys if k in f]
        if k2: hit=k2[0]; break
    mid[hit]+=1
for k,v in mid.most_common(25): print("%5.1f%%  %s"%(100*v/len(comp),k))
sub=[s for s in comp if any('MaxProbScores' in f for f in s)]
c=collections.Counter(s[0][:70] for s in sub)
print("MaxProbScores leaves:")
for k,v in c.most_common(15): print("  %5.1f%% %s"%(100*v/len(comp),k))
