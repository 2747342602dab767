import numpy as np, sys, collections
data=open('fps.bin','rb').read(); off=0; calls=[]
while off < len(data):
    n,dim,count,stop=np.frombuffer(data,np.int32,4,off); off+=16
    pts=np.frombuffer(data,np.float32,n*dim,off).reshape(n,dim); off+=4*n*dim
    calls.append((pts,count))
print(len(calls),"calls", collections.Counter((c[0].shape[0],c[1]) for c in calls).most_common(5))
def fps(u,count):
    n=len(u); m=u.mean(0); m/=np.linalg.norm(m)
    d=1-u@m; seed=int(np.argmax(d)); md=np.full(n,np.inf); order=[]; p=seed
    active=np.ones(n,bool)
    for j in range(count):
        order.append(p); active[p]=False
        md=np.minimum(md,1-u@u[p]); md[~active]=-1
        if j+1<count: p=int(np.argmax(md))
    return order
B=int(sys.argv[1]) if len(sys.argv)>1 else 16; K=int(sys.argv[2]) if len(sys.argv)>2 else 16
tot=0; skip=0; totpairs=0; skippairs=0
rng=np.random.default_rng(0)
for ci,(pts,count) in enumerate(calls[:: max(1,len(calls)//60)]):
    nrm=np.linalg.norm(pts,axis=1,keepdims=True); u=pts/np.where(nrm>0,nrm,1)
    n=len(u)
    # anchors: first K points of the buffer (survivors in FPS order from last draw)
    anchors=u[:K]
    assign=np.argmax(u@anchors.T,1)
    perm=np.argsort(assign,kind='stable')
    blocks=[perm[i:i+B] for i in range(0,n,B)]
    cen=[]; rad=[]
    for b in blocks:
        c=u[b].sum(0); c/=np.linalg.norm(c); cen.append(c)
        rad.append(np.arccos(np.clip(u[b]@c,-1,1)).max())
    cen=np.array(cen); rad=np.array(rad)
    # fps with block pruning stats
    m=u.mean(0); m/=np.linalg.norm(m); p=int(np.argmax(1-u@m))
    md=np.full(n,np.inf); alive=np.ones(n,bool)
    for j in range(count):
        alive[p]=False
        th=np.arccos(np.clip(cen@u[p],-1,1))
        for bi,b in enumerate(blocks):
            live=b[alive[b]]
            if len(live)==0: continue
            tot+=1; totpairs+=len(live)
            mdmax=md[live].max()
            angmax=np.arccos(np.clip(1-mdmax,-1,1)) if np.isfinite(mdmax) else np.inf
            if th[bi]-rad[bi] >= angmax:
                skip+=1; skippairs+=len(live); continue
            md[live]=np.minimum(md[live],1-u[live]@u[p])
        md[~alive]=-1
        if j+1<count: p=int(np.argmax(np.where(alive,md,-1)))
print("B",B,"K",K,"block-updates skipped %.1f%%, pairs skipped %.1f%%"%(100*skip/tot,100*skippairs/totpairs))
