#!/usr/bin/env python3
"""Who makes the end-to-end tail: the slowest 1 % of requests against all, per contender.

Usage: tail_requests.py RECORDS

RECORDS is either a `kvgate-loadtest compare ... --keep-records` result (JSON; times are scaled
to model seconds by the simulated fleet's time scale) or an `offline ... --records` file (JSON
Lines, one record per line with its policy). For each
contender (or policy), the requests at or above the p99 end-to-end latency against all of them:
mean prompt and output tokens, mean TTFT, mean decode pace (first token to end over the tokens
after the first, ms per token); then the same pace and the mean prompt per instance, which shows
whether the tail is a queue (TTFT) or a slow batch (pace) and where it sits. Used in
docs/offline-simulator.md.
"""
import collections
import json
import sys


def load(path: str) -> dict:
    """Records by contender name."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    groups = collections.defaultdict(list)
    try:
        results = json.loads(text)
    except json.JSONDecodeError:
        results = None
    if isinstance(results, dict) and "contenders" in results:
        # Live records are in wall seconds; the summaries (and the offline simulator) in the
        # engines' model time: scale by the simulated fleet's time scale.
        fleet = (results.get("parameters") or {}).get("fleet") or {}
        scale = float(fleet.get("time_scale") or 1.0)
        for c in results["contenders"]:
            for r in c.get("records") or []:
                r = dict(r)
                for key in ("ttft_s", "e2e_s"):
                    if r.get(key) is not None:
                        r[key] *= scale
                groups[c["name"]].append(r)
        return groups
    for line in text.splitlines():
        if line.strip():
            r = json.loads(line)
            groups[r.get("policy", "?")].append(r)
    return groups


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def pace_ms(r: dict) -> float:
    out = r.get("completion_tokens") or r.get("output_length") or 1
    return 1000.0 * (r["e2e_s"] - r["ttft_s"]) / max(1, out - 1)


def profile(rs: list) -> str:
    return "prompt %7.0f  output %5.0f  TTFT %7.2f s  pace %6.1f ms" % (
        mean(r["input_length"] for r in rs),
        mean(r["output_length"] for r in rs),
        mean(r["ttft_s"] for r in rs),
        mean(pace_ms(r) for r in rs),
    )


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    for name, recs in load(sys.argv[1]).items():
        done = [r for r in recs if r.get("e2e_s") is not None and r.get("ttft_s") is not None]
        if not done:
            continue
        done.sort(key=lambda r: r["e2e_s"])
        p99 = done[min(len(done) - 1, int(0.99 * len(done)))]["e2e_s"]
        tail = [r for r in done if r["e2e_s"] >= p99]
        print("%s: %d requests, tail from %.1f s E2E (99th percentile, nearest rank)" % (name, len(done), p99))
        print("  all       %s" % profile(done))
        print("  p99 tail  %s  (%d requests)" % (profile(tail), len(tail)))
        by = collections.defaultdict(list)
        for r in done:
            if r.get("instance"):
                by[r["instance"]].append(r)
        for inst in sorted(by, key=lambda k: (len(k), k)):
            rs = by[inst]
            print("  instance %-12s %5.1f %%  prompt %7.0f  pace %6.1f ms  tail %d" % (
                inst[-12:], 100.0 * len(rs) / len(done), mean(r["input_length"] for r in rs),
                mean(pace_ms(r) for r in rs), sum(1 for r in rs if r["e2e_s"] >= p99)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
