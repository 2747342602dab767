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
key=sys.argv[2]
sub=[s for s in comp if any(key in f for f in s)]
print(key, "%.1f%% of compress"%(100*len(sub)/len(comp)))
# first frame below key's innermost frame occurrence toward leaf: report leaf and the child frame
c=collections.Counter(); c2=collections.Counter()
for s in sub:
    i=max(i for i,f in enumerate(s) if key in f)  # s[0] is leaf
    i=min(i for i,f in enumerate(s) if key in f)
    c[s[0][:80]]+=1
    c2[(s[i-1][:80] if i>0 else 'self')]+=1
for k,v in c.most_common(20): print("  leaf %5.1f%% %s"%(100*v/len(comp),k))
for k,v in c2.most_common(12): print("  child %5.1f%% %s"%(100*v/len(comp),k))
