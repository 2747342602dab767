#!/bin/bash
# Held-out check of the offsets tools/calibrate_layer_budgets.py chose for the base model
# (0/-24/24/0, plan-exec tuning split only), run once, 2026-12-05. One worker per policy.
run() { for s in 31337 47711 90210 70123 80917; do
  echo "pe $1 0/-24/24/0 $s: $(OMP_NUM_THREADS=1 python3 -m beaconkv eval --split heldout-$s --num 200 --policy $1 --budget 96 --knob interval=32 --knob layer_budget_offsets=0/-24/24/0 2>/dev/null | tail -1)"
done; }
run beacon > /tmp/hob_u.txt & run beacon-pooled > /tmp/hob_p.txt & wait
