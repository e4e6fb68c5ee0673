#!/usr/bin/env python3
"""Spread a Mooncake-format trace's simultaneous arrivals over time.

Usage: spread_bursts.py IN.jsonl OUT.jsonl [MAX_REQUESTS]

Requests that share a timestamp (a coarse trace clock makes bursts) are spread evenly over the
interval up to the next distinct timestamp; the last group over one second. Order, lengths and
hash ids are unchanged, and so is the mean arrival rate: only the bursts go. Used to tell what
simultaneous arrivals cost several gateway replicas (docs/gossip.md).
"""
import json
import sys


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    limit = int(sys.argv[3]) if len(sys.argv) == 4 else None
    with open(sys.argv[1], encoding="utf-8") as f:
        rows = [json.loads(line) for i, line in enumerate(f) if limit is None or i < limit]
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j]["timestamp"] == rows[i]["timestamp"]:
            j += 1
        start = rows[i]["timestamp"]
        end = rows[j]["timestamp"] if j < len(rows) else start + 1000
        for k in range(i, j):
            rows[k]["timestamp"] = start + (end - start) * (k - i) // (j - i)
        i = j
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
