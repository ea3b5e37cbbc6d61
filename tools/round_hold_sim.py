"""What holding a speculative Gambit run's traces at each round's token would cost (a simulation).

A speculative step advances a run's Δ clock by its mean τ, so a Gambit tree with speculation is not the
plain one (docs/notes/speculative.md, stop 55). Making it the plain one by holding each trace at the
next round's token (its accepted path clipped there, the round waiting for the slowest trace) costs
steps: each trace emits 1 + (accepted drafts) tokens a step, the drafts accepted one after another with
probability ``a`` up to the chain's 6 (the engine's default tree); this counts the steps a round of Δ
tokens takes held, against Δ / τ free.

Usage: python tools/round_hold_sim.py [--rounds 3000] [--seed 0]
"""
import argparse
import random

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--rounds", type=int, default=3000, help="simulated rounds per setting")
ap.add_argument("--seed", type=int, default=0, help="random seed")
ap.add_argument("--depth", type=int, default=6, help="draft tokens a step at most (the chain's length)")
args = ap.parse_args()
rng = random.Random(args.seed)


def emitted(a: float) -> int:
    k = 1
    for _ in range(args.depth):
        if rng.random() >= a:
            break
        k += 1
    return k


print("| accept a | C | Δ | steps a round, held | free (Δ / τ) | held / free |")
print("|---:|---:|---:|---:|---:|---:|")
for a in (0.6, 0.7, 0.8, 0.9):
    tau = sum(emitted(a) for _ in range(100_000)) / 100_000
    for c in (4, 8, 16):
        for delta in (8, 16):
            steps = 0
            for _ in range(args.rounds):
                left = [delta] * c
                while any(x > 0 for x in left):
                    steps += 1
                    left = [x - min(x, emitted(a)) if x > 0 else 0 for x in left]
            held = steps / args.rounds
            print(f"| {a} | {c} | {delta} | {held:.2f} | {delta / tau:.2f} | {held / (delta / tau):.2f} |")
