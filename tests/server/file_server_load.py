"""Starts examples/file_server on a fresh tree and loads it with wrk (tests/server/load.lua).

Used by the server test (run_server_test.py) and the benchmark (bench/server_bench.py).
"""

import http.client
import pathlib
import random
import re
import signal
import subprocess
import zlib

FILES, MOVING, DIRS, PER_DIR = 32, 8, 4, 8  # as in load.lua
LOAD_LUA = pathlib.Path(__file__).with_name("load.lua")


def body(rng):
    """A file that proves itself whole: "<adler32> <length>\\n<payload>"."""
    payload = bytes(rng.randrange(97, 123) for _ in range(16)) * rng.randrange(4, 65)
    return b"%d %d\n" % (zlib.adler32(payload), len(payload)) + payload


def whole_file(data):
    head, _, payload = data.partition(b"\n")
    match = re.fullmatch(rb"(\d+) (\d+)", head)
    return bool(match) and int(match[2]) == len(payload) and int(match[1]) == zlib.adler32(payload)


def whole_dir(data):
    match = re.match(rb"dir (\d+)\n", data)
    if not match or int(match[1]) != PER_DIR:
        return False
    pos, listed = match.end(), 0
    while pos < len(data):
        entry = re.compile(rb"\S+ (\d+)\n").match(data, pos)
        if not entry:
            return False
        stop = entry.end() + int(entry[1])
        if stop > len(data) or not whole_file(data[entry.end():stop]):
            return False
        pos, listed = stop, listed + 1
    return listed == PER_DIR


def make_tree(root):
    """The tree load.lua works on (see there)."""
    rng = random.Random(42)
    root = pathlib.Path(root)
    for name in ("f", "m", "d", "c"):
        (root / name).mkdir()
    for i in range(FILES):
        (root / "f" / str(i)).write_bytes(body(rng))
    for i in range(MOVING):
        (root / "m" / f"x{i}").write_bytes(body(rng))
    for j in range(DIRS):
        (root / "d" / f"a{j}").mkdir()
        for k in range(PER_DIR):
            (root / "d" / f"a{j}" / str(k)).write_bytes(body(rng))


class Server:
    """examples/file_server on `root`, on a free loopback port."""

    def __init__(self, binary, root, locks, workers):
        self.process = subprocess.Popen(
            [str(binary), "--root", str(root), "--locks", locks, "--workers", str(workers)],
            stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        match = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", line)
        if not match:
            self.process.kill()
            raise RuntimeError(f"file_server did not start: {line!r}")
        self.port = int(match[1])

    def __enter__(self):
        return self

    def __exit__(self, *_):
        if self.process.poll() is None:  # left by a failure: no server outlives its test
            self.process.kill()
            self.process.wait()

    def get(self, path):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def stop(self):
        """SIGTERM; returns (exit status, its last line: "stopped: N requests, M replies")."""
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=60)
        return self.process.returncode, out.strip()


def wrk(port, mix, seconds, threads=2, connections=8, program="wrk"):
    """Runs load.lua; returns (requests per second, {checked, bad, torn, errors}, wrk's output)."""
    result = subprocess.run(
        [program, "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "-s", str(LOAD_LUA),
         f"http://127.0.0.1:{port}", "--", mix],
        capture_output=True, text=True, timeout=seconds + 60, check=True)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", result.stdout)
    verify = re.search(r"verify: (.*)", result.stdout)
    if not rate or not verify:
        raise RuntimeError(f"wrk said:\n{result.stdout}{result.stderr}")
    counts = {key: int(value) for key, value in (pair.split("=") for pair in verify[1].split())}
    if "Socket errors" in result.stdout:
        counts["socket_errors"] = 1
    return float(rate[1]), counts, result.stdout
