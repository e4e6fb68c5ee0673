#!/usr/bin/env python3
"""How a comparison placed the trace's simultaneous bursts, per contender.

Usage: burst_collisions.py TRACE.jsonl RESULTS.json

RESULTS.json is a `kvgate-loadtest compare ... --keep-records` result over TRACE.jsonl (the same
requests, indexed as replayed). For every group of requests sharing a timestamp, counts the pairs
that went to the same instance ("collisions") and the uncached prompt tokens queued behind a
burst-mate on the same instance (all but the largest request per instance), and reports their
means per burst with each contender's mean decode time (first token to end, wall seconds).
Needs kvgate's instance header, so external routers show nothing. Used in docs/gossip.md.
"""
import collections
import json
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(sys.argv[2], encoding="utf-8") as f:
        results = json.load(f)
    timestamps = []
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            timestamps.append(json.loads(line)["timestamp"])
    for c in results["contenders"]:
        recs = {r["index"]: r for r in c.get("records") or [] if r.get("instance")}
        if not recs:
            print(f"{c['name']}: no records with an instance (run with --keep-records)")
            continue
        bursts = collections.defaultdict(list)
        for i in sorted(recs):
            if i < len(timestamps):
                bursts[timestamps[i]].append(recs[i])
        pairs = queued = 0.0
        for members in bursts.values():
            by_instance = collections.defaultdict(list)
            for r in members:
                uncached = (r.get("prompt_tokens") or 0) - (r.get("cached_tokens") or 0)
                by_instance[r["instance"]].append(max(uncached, 0))
            for sizes in by_instance.values():
                pairs += len(sizes) * (len(sizes) - 1) / 2
                queued += sum(sizes) - max(sizes)
        done = [r for r in recs.values() if r.get("ttft_s") is not None and r.get("e2e_s") is not None]
        decode = sum(r["e2e_s"] - r["ttft_s"] for r in done) / max(len(done), 1)
        n = max(len(bursts), 1)
        print(
            f"{c['name']}: {len(bursts)} bursts, collisions {pairs / n:.2f} per burst, "
            f"uncached tokens behind a burst-mate {queued / n:.0f} per burst, "
            f"decode {decode:.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
