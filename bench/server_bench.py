#!/usr/bin/env python3
"""examples/file_server with rules vs the same server with one std::shared_mutex per file.

  bench/server_bench.py --server build/release/examples/file_server [--rounds 7] [--seconds 5]
                        [--workers 2] [--connections 8] [--mixes getput,mixed] [--csv FILE]

For each mix of tests/server/load.lua ("getput": 80 % GET, 20 % PUT of 32 files; "mixed": also
COPY, MOVE and DELETE of files and directories), each round starts both servers on fresh trees in
turn (the order alternating) and loads each with wrk for --seconds. The row is the median over the
rounds of (requests/s with rules ÷ requests/s with file mutexes in the same round), with the least
and greatest beside it: above 1 is faster. Every round checks its reads (no torn file; with rules
no torn directory and no failed request), so a broken server cannot post a good number. The mixed
row is for information: the mutex server tears directories there (tests/server shows it).
"""

import argparse
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "server"))
import file_server_load as load  # noqa: E402

TARGETS = {"getput": 0.8}


def measure(binary, locks, mix, args):
    with tempfile.TemporaryDirectory() as root:
        load.make_tree(root)
        with load.Server(binary, root, locks, args.workers) as server:
            rate, counts, output = load.wrk(server.port, mix, args.seconds, threads=1,
                                            connections=args.connections)
            server.stop()
    wrong = counts["bad"] or "socket_errors" in counts or (locks == "rules" and (counts["torn"] or counts["errors"]))
    if wrong or counts["checked"] == 0:
        sys.exit(f"{locks} server, {mix}: the reads did not verify: {counts}\n{output}")
    return rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--mixes", default="getput,mixed")
    parser.add_argument("--csv")
    args = parser.parse_args()

    rows = []
    for mix in args.mixes.split(","):
        ours, theirs, ratios = [], [], []
        for round_ in range(args.rounds):
            order = ("rules", "mutex") if round_ % 2 == 0 else ("mutex", "rules")
            rates = {locks: measure(args.server, locks, mix, args) for locks in order}
            ours.append(rates["rules"])
            theirs.append(rates["mutex"])
            ratios.append(rates["rules"] / rates["mutex"])
            print(f"{mix} round {round_ + 1}: rules {rates['rules']:.0f}/s, "
                  f"file mutexes {rates['mutex']:.0f}/s, ratio {ratios[-1]:.2f}", flush=True)
        rows.append((mix, statistics.median(ratios), statistics.median(ours), statistics.median(theirs),
                     min(ratios), max(ratios), TARGETS.get(mix, "")))

    print("\n| row | requests/s with rules | with a shared_mutex per file | ratio | target |")
    print("|---|---|---|---|---|")
    for mix, ratio, ours, theirs, least, greatest, target in rows:
        target_text = f"≥ {target}" if target else ""
        print(f"| file server, {mix} | {ours:,.0f} | {theirs:,.0f} | "
              f"{ratio:.2f}× [{least:.2f}–{greatest:.2f}] | {target_text} |")
    if args.csv:
        with open(args.csv, "w") as out:
            out.write("workload,ratio,median_ours_per_s,median_base_per_s,min_ratio,max_ratio,target\n")
            for mix, ratio, ours, theirs, least, greatest, target in rows:
                out.write(f"file server {mix},{ratio:.4f},{ours:.0f},{theirs:.0f},{least:.4f},{greatest:.4f},{target}\n")


if __name__ == "__main__":
    main()
