#!/bin/bash
# usage: ab.sh EXPDIR BATCH ROUNDS "ENV1" "ENV2" ...
d=$1; b=$2; n=$3; shift 3
for r in $(seq $n); do for e in "$@"; do
  echo "$e|$(env $e PYTHONPATH=$d python3 docs/results/scoring-cost-2026-12-06/engine_driver.py $b beacon 3 | awk '{print $4}' | sort -n | sed -n 2p)"
done; done | python3 -c "
import sys,collections,statistics
d=collections.defaultdict(list)
for l in sys.stdin:
  k,v=l.strip().split('|'); d[k].append(float(v.rstrip('%')))
for k,v in d.items(): print('%-40s median %.2f%%  %s'%(k,statistics.median(v),v))
"
