#!/usr/bin/env python3
# Reproduces the built-in length distributions of planner/lengths.cpp: lognormal (mu, sigma) whose token shares per
# length group best match (squared log error) the static column of seed 004 Table 3, read as token shares.
# Documents over 32K are counted in the top group (the sampler cuts them into 32K pieces). Pure Python.
import math
K=1024
edges=[0,1*K,4*K,8*K,16*K,32*K]
targets={"commoncrawl":[42.1,12.5,3.5,2.9,2.4],"github":[34.9,38.4,25.0,27.3,53.0]}
def Phi(z): return 0.5*(1+math.erf(z/math.sqrt(2)))
def shares(mu,s):
    # token-weighted lengths of a lognormal(mu,s) count distribution are lognormal(mu+s^2,s);
    # tokens of documents longer than 32K are cut into 32K pieces: counted in the top group
    mt=mu+s*s
    cdf=lambda x: 0.0 if x<=0 else Phi((math.log(x)-mt)/s)
    out=[cdf(edges[i+1])-cdf(edges[i]) for i in range(5)]
    out[4]+=1-cdf(edges[5])
    return out
for name,t in targets.items():
    tot=sum(t); t=[x/tot for x in t]
    best=None
    for i in range(0,300):
        mu=2+i*0.03
        for j in range(1,200):
            s=j*0.02
            sh=shares(mu,s)
            err=sum((math.log(a+1e-9)-math.log(b))**2 for a,b in zip(sh,t))
            if best is None or err<best[0]: best=(err,mu,s,sh)
    err,mu,s,sh=best
    print(name,"mu=%.2f sigma=%.2f err=%.4f"%(mu,s,err),"median=%.0f"%math.exp(mu),"mean=%.0f"%math.exp(mu+s*s/2))
    print("  target",[round(x,3) for x in t]); print("  fit   ",[round(x,3) for x in sh])
