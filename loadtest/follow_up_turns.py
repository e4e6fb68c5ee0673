#!/usr/bin/env python3
"""Where follow-up turns go and what they find cached there, per contender.

Usage: follow_up_turns.py TRACE RESULTS [--skip N] [--within S] [--sent-window S]

TRACE is the Mooncake-format trace that was replayed (JSON Lines with `hash_ids`), RESULTS a
`kvgate-loadtest compare ... --keep-records` result; `--skip N` the run's `--skip-requests`.
A follow-up is a request that shares at least half of its hash ids with an earlier one (the
most recent request holding the deepest shared id is its *previous* turn) and was sent within
`--within` seconds of it (default 20; wall seconds, as the records keep them). For each
contender, the follow-ups sent back to their previous turn's instance and those sent elsewhere:
how many, and the share of their prompt tokens the engines found cached. For those sent
elsewhere, also how often the instance chosen was the one that had been *sent* the deepest part
of the prompt's prefix within the last `--sent-window` seconds (default 60; by the requests the
run sent, not what the engines still held) and what share of the hash ids that was. Used in
docs/gossip.md to tell whether replicas lose hits by sending turns away, by choosing worse
places, or by what those places still hold.
"""
import argparse
import collections
import json


def sent_prefix(sent: dict, ids: list, now: float, window: float) -> int:
    """Leading hash ids of `ids` sent to one instance (`sent`: id -> last time) within `window`."""
    n = 0
    for h in ids:
        if h not in sent or now - sent[h] >= window:
            break
        n += 1
    return n


def follow_ups(trace: list, records: dict, within: float, window: float) -> dict:
    """Counts and sums by where each follow-up went ("previous" or "elsewhere")."""
    holder = {}
    sent = collections.defaultdict(dict)
    rows = collections.defaultdict(
        lambda: {"n": 0, "cached": 0, "prompt": 0, "deepest": 0, "share": 0.0}
    )
    for i, request in enumerate(trace):
        ids = request.get("hash_ids") or []
        previous, shared = None, 0
        for k in range(len(ids) - 1, -1, -1):
            if ids[k] in holder:
                previous, shared = holder[ids[k]], k + 1
                break
        for h in ids:
            holder[h] = i
        record = records.get(i)
        if record is None or not record.get("instance"):
            continue
        now = record["scheduled_at_s"]
        before = records.get(previous) if previous is not None else None
        if (
            before is not None
            and before.get("instance")
            and shared * 2 >= len(ids)
            and now - before["scheduled_at_s"] < within
        ):
            where = "previous" if record["instance"] == before["instance"] else "elsewhere"
            row = rows[where]
            row["n"] += 1
            row["cached"] += record.get("cached_tokens") or 0
            row["prompt"] += record.get("prompt_tokens") or 0
            if where == "elsewhere" and ids:
                depth = {
                    inst: sent_prefix(held, ids, now, window)
                    for inst, held in sent.items()
                    if inst != before["instance"]
                }
                got = depth.get(record["instance"], 0)
                if got > 0 and got == max(depth.values()):
                    row["deepest"] += 1
                row["share"] += got / len(ids)
        for h in ids:
            sent[record["instance"]][h] = now
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("results")
    parser.add_argument("--skip", type=int, default=0, help="the run's --skip-requests")
    parser.add_argument("--within", type=float, default=20.0, help="seconds since the previous turn")
    parser.add_argument(
        "--sent-window", type=float, default=60.0, help="seconds a sent prefix counts as held"
    )
    args = parser.parse_args()
    with open(args.results, encoding="utf-8") as f:
        results = json.load(f)
    contenders = results.get("contenders") or []
    longest = max((len(c.get("records") or []) for c in contenders), default=0)
    trace = []
    with open(args.trace, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if n < args.skip:
                continue
            if len(trace) >= longest:
                break
            trace.append(json.loads(line))
    for c in contenders:
        records = {r["index"]: r for r in c.get("records") or []}
        if not records:
            print(f"{c['name']}: no records (run compare with --keep-records)")
            continue
        rows = follow_ups(trace, records, args.within, args.sent_window)
        parts = []
        for where in ("previous", "elsewhere"):
            row = rows[where]
            cached = 100.0 * row["cached"] / row["prompt"] if row["prompt"] else 0.0
            parts.append(f"{where} {row['n']} ({cached:.1f} % cached)")
        away = rows["elsewhere"]
        if away["n"]:
            parts.append(
                f"elsewhere to the deepest sent prefix {100.0 * away['deepest'] / away['n']:.0f} %,"
                f" {away['share'] / away['n']:.2f} of its hash ids"
            )
        print(f"{c['name']}: follow-ups within {args.within:g} s: " + ", ".join(parts))


if __name__ == "__main__":
    main()
