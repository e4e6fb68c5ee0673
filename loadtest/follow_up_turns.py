#!/usr/bin/env python3
"""Where follow-up turns go and what they find cached there, per contender.

Usage: follow_up_turns.py TRACE RESULTS [--skip N] [--within S] [--sent-window S]

TRACE is the Mooncake-format trace that was replayed (JSON Lines with `hash_ids`), RESULTS a
`kvgate-loadtest compare ... --keep-records` result; `--skip N` the run's `--skip-requests`.
A follow-up is a request that shares at least half of its hash ids with an earlier one (the
most recent request holding the deepest shared id is its *previous* turn) and was sent within
`--within` seconds of it (default 20; wall seconds, as the records keep them). For each
contender, the follow-ups sent back to their previous turn's instance and those sent elsewhere:
how many, their share of the follow-ups' prompt tokens, and the share of their prompt tokens the
engines found cached. For those sent elsewhere, also how often the instance chosen was the one
that had been *sent* the deepest part of the prompt's prefix within the last `--sent-window`
seconds (default 60; by the requests the run sent, not what the engines still held) and what
share of the hash ids that was (mean over the requests; and of their prompt tokens, summed).
Those sent to such a prefix are split by the state of the request that put it there (the latest
one sent to that instance with the deepest shared id): still waiting for its first token when
the follow-up was sent (its prefill not yet done), or done, and then how long before and how
many uncached prompt tokens the instance was sent between its first token and the follow-up
(what could have evicted the prefix); with the share of the sent prefix's tokens found cached.
With several replicas (records naming one), the follow-ups that reached the replica that had
decided their previous turn and those that reached another: how many went back, and their share
of the prompt tokens. Used in docs/gossip.md to tell whether replicas lose hits by sending turns
away, by choosing worse places, or by what those places still hold.

Follow-ups are found as in `loadtest/src/report/follow_ups.rs` (what `compare` prints as
"follow-up turns"), but in trace order over every request rather than in send order over the
completed ones, without its two-block minimum, and within the `--within` window.
"""
import argparse
import bisect
import collections
import json
import statistics

# Tokens per hash id in the Mooncake format (`DEFAULT_BLOCK_TOKENS` in loadtest/src/trace.rs).
BLOCK_TOKENS = 512


def sent_prefix(sent: dict, ids: list, now: float, window: float) -> int:
    """Leading hash ids of `ids` sent to one instance (`sent`: id -> (last time, request)) within
    `window`."""
    n = 0
    for h in ids:
        if h not in sent or now - sent[h][0] >= window:
            break
        n += 1
    return n


def first_token_at(record: dict) -> float:
    """When a request's first token came (wall seconds); infinity if it never did."""
    ttft = record.get("ttft_s")
    return record["sent_at_s"] + ttft if ttft is not None else float("inf")


def uncached_between(log: list, start: float, end: float) -> int:
    """Uncached prompt tokens of the requests in `log` ((first token, uncached) sorted by first
    token) whose first token came in (start, end]."""
    lo = bisect.bisect_right(log, (start, float("inf")))
    hi = bisect.bisect_right(log, (end, float("inf")))
    return sum(u for _, u in log[lo:hi])


def source_row() -> dict:
    """Sums over the turns sent elsewhere whose prefix's request was in one state."""
    return {"n": 0, "cached": 0, "sent": 0, "age": [], "between": []}


def replica_row() -> dict:
    """Sums over the turns that reached one kind of replica (the deciding one, or another)."""
    return {"n": 0, "back": 0, "prompt": 0, "back_prompt": 0}


def follow_ups(trace: list, records: dict, within: float, window: float) -> dict:
    """Counts and sums by where each follow-up went ("previous" or "elsewhere"); for those sent
    elsewhere, by the state of their prefix's request ("computing" or "computed"); under
    replicas, by the replica they reached ("same replica" or "other replica")."""
    holder = {}
    sent = collections.defaultdict(dict)
    # Per instance, (first token, uncached prompt tokens) of every request it served, sorted.
    served = collections.defaultdict(list)
    for r in records.values():
        if r.get("instance") and r.get("ttft_s") is not None:
            uncached = (r.get("prompt_tokens") or 0) - (r.get("cached_tokens") or 0)
            served[r["instance"]].append((first_token_at(r), max(0, uncached)))
    for log in served.values():
        log.sort()
    rows = collections.defaultdict(
        lambda: {"n": 0, "cached": 0, "prompt": 0, "deepest": 0, "share": 0.0, "sent": 0}
    )
    rows["computing"] = source_row()
    rows["computed"] = source_row()
    rows["same replica"] = replica_row()
    rows["other replica"] = replica_row()
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
            prompt = record.get("prompt_tokens") or 0
            cached = record.get("cached_tokens") or 0
            if record.get("replica") is not None:
                same = record.get("replica") == before.get("replica")
                by = rows["same replica" if same else "other replica"]
                by["n"] += 1
                by["prompt"] += prompt
                if where == "previous":
                    by["back"] += 1
                    by["back_prompt"] += prompt
            row = rows[where]
            row["n"] += 1
            row["cached"] += cached
            row["prompt"] += prompt
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
                sent_tokens = min(got * BLOCK_TOKENS, prompt)
                row["sent"] += sent_tokens
                if got > 0:
                    source = records[sent[record["instance"]][ids[got - 1]][1]]
                    first = first_token_at(source)
                    state = "computed" if first <= record["sent_at_s"] else "computing"
                    src = rows[state]
                    src["n"] += 1
                    src["cached"] += cached
                    src["sent"] += sent_tokens
                    if state == "computed":
                        src["age"].append(record["sent_at_s"] - first)
                        src["between"].append(
                            uncached_between(
                                served[record["instance"]], first, record["sent_at_s"]
                            )
                        )
        for h in ids:
            sent[record["instance"]][h] = (now, i)
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
        total = sum(rows[where]["prompt"] for where in ("previous", "elsewhere"))
        for where in ("previous", "elsewhere"):
            row = rows[where]
            cached = 100.0 * row["cached"] / row["prompt"] if row["prompt"] else 0.0
            tokens = 100.0 * row["prompt"] / total if total else 0.0
            parts.append(
                f"{where} {row['n']} ({tokens:.1f} % of the prompt tokens, {cached:.1f} % cached)"
            )
        away = rows["elsewhere"]
        if away["n"]:
            parts.append(
                f"elsewhere to the deepest sent prefix {100.0 * away['deepest'] / away['n']:.0f} %,"
                f" {away['share'] / away['n']:.2f} of its hash ids"
                f" ({100.0 * away['sent'] / away['prompt'] if away['prompt'] else 0.0:.1f} % of"
                " their prompt tokens)"
            )
        print(f"{c['name']}: follow-ups within {args.within:g} s: " + ", ".join(parts))
        for state in ("computing", "computed"):
            src = rows[state]
            if not src["n"]:
                continue
            kept = 100.0 * src["cached"] / src["sent"] if src["sent"] else 0.0
            line = f"  elsewhere, to a prefix whose request was {state}: {src['n']}, {kept:.1f} % of the sent prefix cached"
            if src["age"]:
                line += (
                    f"; its first token {statistics.median(src['age']):.1f} s before (median),"
                    f" {statistics.median(src['between']) / 1000:.0f}K uncached tokens sent there since (median),"
                    f" {statistics.mean(src['between']) / 1000:.0f}K (mean)"
                )
            print(line)
        for by, label in (
            ("same replica", "the replica that decided their previous turn"),
            ("other replica", "another replica"),
        ):
            row = rows[by]
            if row["n"]:
                back = 100.0 * row["back_prompt"] / row["prompt"] if row["prompt"] else 0.0
                print(
                    f"  sent to {label}: {row['n']}, {row['back']} back"
                    f" ({back:.1f} % of their prompt tokens)"
                )


if __name__ == "__main__":
    main()
