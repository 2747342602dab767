#!/bin/bash
# Held-out check of the offsets tools/calibrate_layer_budgets.py chose for the two-task model
# (-8/-8/8/8), run once, 2026-12-05. Two workers: plan-exec (96 / 32) and def-use (96 / 16).
M=models/tiny-reasoner-2task
pe() { for s in 31337 47711 90210; do for p in beacon beacon-pooled; do for o in "" "-8/-8/8/8"; do
  k=${o:+--knob layer_budget_offsets=$o}
  echo "pe $p ${o:-none} $s: $(OMP_NUM_THREADS=1 python3 -m beaconkv eval --model $M --split heldout-$s --num 200 --policy $p --budget 96 --knob interval=32 $k 2>/dev/null | tail -1)"
done; done; done; }
du() { for s in 83117 90533 97241; do for p in beacon beacon-pooled; do for o in "" "-8/-8/8/8"; do
  k=${o:+--knob layer_budget_offsets=$o}
  echo "du $p ${o:-none} $s: $(OMP_NUM_THREADS=1 python3 -m beaconkv eval --model $M --split defuse12-heldout-$s --num 200 --policy $p --budget 96 --knob interval=16 $k 2>/dev/null | tail -1)"
done; done; done; }
pe > /tmp/ho_pe.txt & du > /tmp/ho_du.txt & wait
