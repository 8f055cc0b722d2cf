#!/usr/bin/env python3
"""The file server under load (ctest label `server`).

  run_server_test.py --server build/.../examples/file_server [--wrk /usr/bin/wrk] [--seconds 3]

1. With rules: wrk runs load.lua's mixed load (GET, PUT, COPY, MOVE of files and directories,
   DELETE) on overlapping paths. Every body read must be whole (no torn or mixed file), every
   directory read must list all its files (a MOVE, COPY or DELETE of a directory is atomic for
   readers), no request fails, and afterwards nothing is lost: every file and every directory is
   there, once, whole. SIGTERM then stops the server with every request answered.
2. With one std::shared_mutex per file (--locks mutex), the same load: single files stay whole,
   but readers see directories halfway through a MOVE, COPY or DELETE. The test requires at least
   one such read (up to three rounds), so that part 1 shows what the rules add.
"""

import argparse
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import file_server_load as load  # noqa: E402


WRK = "wrk"


def fail(message):
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def check_tree(server):
    """Nothing lost: each file whole, each moved file and directory in exactly one place."""
    for i in range(load.FILES):
        status, data = server.get(f"/f/{i}")
        if status != 200 or not load.whole_file(data):
            fail(f"/f/{i}: {status}, whole={load.whole_file(data)}")
    for i in range(load.MOVING):
        found = [server.get(f"/m/{side}{i}") for side in ("x", "y")]
        there = [data for status, data in found if status == 200]
        if len(there) != 1 or not load.whole_file(there[0]):
            fail(f"/m/x{i} and /m/y{i}: statuses {[status for status, _ in found]}, expected one whole file")
    for j in range(load.DIRS):
        found = [server.get(f"/d/{side}{j}") for side in ("a", "b")]
        there = [data for status, data in found if status == 200]
        if len(there) != 1 or not load.whole_dir(there[0]):
            fail(f"/d/a{j} and /d/b{j}: statuses {[status for status, _ in found]}, expected one whole directory")
        status, data = server.get(f"/c/{j}")
        if status not in (200, 404) or (status == 200 and not load.whole_dir(data)):
            fail(f"/c/{j}: {status}, expected a whole copy or none")


def stop(server):
    code, last = server.stop()
    print(f"  {last}")
    requests, replies = (int(n) for n in last.split()[1:4:2]) if last.startswith("stopped:") else (-1, -2)
    if code != 0 or requests != replies or requests <= 0:
        fail(f"file_server exited {code} with '{last}'")


def with_rules(binary, seconds):
    with tempfile.TemporaryDirectory() as root:
        load.make_tree(root)
        with load.Server(binary, root, "rules", 2) as server:
            rate, counts, output = load.wrk(server.port, "mixed", seconds, program=WRK)
            print(f"rules: {rate:.0f} requests/s, {counts}")
            if counts["checked"] == 0 or counts["bad"] or counts["torn"] or counts["errors"] or "socket_errors" in counts:
                print(output)
                fail("with rules every read must be whole and no request may fail")
            check_tree(server)
            stop(server)


def with_file_mutexes(binary, seconds):
    for round_ in range(1, 4):
        with tempfile.TemporaryDirectory() as root:
            load.make_tree(root)
            with load.Server(binary, root, "mutex", 2) as server:
                rate, counts, output = load.wrk(server.port, "mixed", seconds, program=WRK)
                print(f"shared_mutex per file, round {round_}: {rate:.0f} requests/s, {counts}")
                stop(server)
            if counts["bad"]:
                print(output)
                fail("a file lock keeps a single file whole")
            if counts["torn"]:
                return
    fail("three rounds without a torn directory read: the load no longer shows what rules add")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--wrk", default="wrk")
    parser.add_argument("--seconds", type=int, default=3)
    args = parser.parse_args()
    global WRK
    WRK = args.wrk
    with_rules(args.server, args.seconds)
    with_file_mutexes(args.server, args.seconds)
    print("ok")


if __name__ == "__main__":
    main()
