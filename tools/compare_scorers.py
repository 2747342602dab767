"""The engine's two scorers on one split: `host` (each policy scores its heads) against `paged`
(the GPU pipeline's CPU twin, every planned head of a step in one call; docs/gpu.md).

Greedy-decodes the first NUM problems with each and prints both results and how many outputs
are identical token for token.

Usage: python3 tools/compare_scorers.py --model DIR --split S [--num 200] --budget B
       --interval I [--policy beacon]
"""

from __future__ import annotations

import argparse
import sys

from beaconkv.evaluate import evaluate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="models/tiny-reasoner")
    p.add_argument("--split", default="dev")
    p.add_argument("--num", type=int, default=200)
    p.add_argument("--policy", default="beacon")
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--interval", type=int, required=True)
    args = p.parse_args(argv)
    outputs = {}
    for scorer in ("host", "paged"):
        outs: dict[int, list[int]] = {}
        r = evaluate(args.model, args.split, args.policy, args.budget, num=args.num,
                     interval=args.interval, scorer=scorer,
                     on_output=lambda prob, o: outs.__setitem__(o["id"], list(o["output"])))
        st = r.engine_stats
        print(f"{scorer}: accuracy={r.accuracy:.3f} compression={r.compression_ratio:.2f}x "
              f"compressions={st['compressions']} tokens_evicted={st['tokens_evicted']}")
        outputs[scorer] = outs
    same = sum(outputs["host"][i] == outputs["paged"].get(i) for i in outputs["host"])
    print(f"identical outputs: {same}/{len(outputs['host'])}")
    return 0 if same == len(outputs["host"]) else 1


if __name__ == "__main__":
    sys.exit(main())
