#!/usr/bin/env python3
"""Soak and fault test of `strata serve` on loopback, with the official `openai` Python client.

Starts `strata serve` on a free port and drives it with STREAMS concurrent workers for REQUESTS
requests of mixed cache policies (streamed and not, completions and chat), among which faults
are injected: clients that vanish mid-stream and mid-request, slow clients (one header line per
half second), oversize and deeply nested bodies, a sequence that runs into the KV budget on
purpose. Then SIGTERM arrives while STREAMS streams run. Checked afterwards:
  - every slot is free and the queue empty before SIGTERM (/health, /slots);
  - the server's RSS after the load is within --rss-bound MiB of its RSS after warm-up;
  - every completed response equals its solo run (the same request alone, afterwards); a
    response stopped by the budget is a prefix of its solo run;
  - every fault got the answer it should (408, 413, 400) or was dropped, and the server kept
    serving;
  - SIGTERM ends every stream with a final chunk and [DONE], the process exits 0, and the
    VestigeKV file archive's folder is empty.
Prints one JSON summary line; exits 1 on any failed check (each printed on stderr).

    .venv/bin/python tools/ref/soak.py --strata build/release/strata --model models/nope-mla.gguf
        [--requests 96 --streams 16 --max-tokens 12 --policies full,streaming:ratio=2,...]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import openai


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def http(port, method, path, body=None, timeout=30.0):
    """A plain HTTP/1.1 request over a socket: (status, body text)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = body.encode() if isinstance(body, str) else (body or b"")
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    s.sendall(head.encode() + b"\r\n" + data)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    s.close()
    text = out.decode("utf-8", "replace")
    m = re.match(r"HTTP/1\.1 (\d+)", text)
    return (int(m.group(1)) if m else 0), text.split("\r\n\r\n", 1)[-1]


class Soak:
    def __init__(self, a):
        self.a = a
        self.failures = []
        self.lock = threading.Lock()
        self.results = []  # (request dict, endpoint, stream, text, finish, message)
        self.faults = {}

    def fail(self, what):
        with self.lock:
            self.failures.append(what)
        print("FAIL: " + what, file=sys.stderr)

    def count(self, kind, ok, detail=""):
        with self.lock:
            n, good = self.faults.get(kind, (0, 0))
            self.faults[kind] = (n + 1, good + (1 if ok else 0))
        if not ok:
            self.fail(f"fault {kind}: unexpected answer {detail}")

    def start_server(self):
        a = self.a
        self.archive = tempfile.mkdtemp(prefix="strata_soak_archive_")
        cmd = [a.strata, "serve", "-m", a.model, "--port", "0", "--threads", "1",
               "--parallel", "4", "--queue", "64", "--kv-budget", a.kv_budget,
               "--header-timeout", "2", "--read-timeout", "2", "-c", "8192",
               "--max-connections-per-peer", "96"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not m:
            raise SystemExit("server did not start: " + line)
        self.port = int(m.group(1))
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x",
                                    max_retries=0, timeout=120.0)
        self.model = os.path.splitext(os.path.basename(a.model))[0]

    def policy(self, p):
        return p.replace("ARCHIVE", self.archive)

    def request(self, rng, i):
        a = self.a
        policy = self.policy(rng.choice(a.policies.split(",")))
        words = " ".join(rng.choice(["the", "lord", "said", "unto", "moses", "and", "light",
                                     "water", "day", "night"]) for _ in range(rng.randint(4, 40)))
        return dict(prompt=f"{i}: {words}", max_tokens=a.max_tokens,
                    temperature=rng.choice([0.0, 0.8]), seed=rng.randint(0, 1 << 30),
                    extra_body={"strata": {"policy": policy}})

    def run_one(self, req, stream):
        text, finish, message = "", None, ""
        if stream:
            for chunk in self.client.completions.create(model=self.model, stream=True, **req):
                for ch in chunk.choices:
                    text += ch.text
                    finish = ch.finish_reason or finish
                extra = getattr(chunk, "model_extra", None) or {}
                if "strata" in extra and "message" in extra["strata"]:
                    message = extra["strata"]["message"]
        else:
            r = self.client.completions.create(model=self.model, **req)
            text, finish = r.choices[0].text, r.choices[0].finish_reason
            message = (r.model_extra or {}).get("strata", {}).get("message", "")
        return text, finish, message

    # Faults.
    def vanish_mid_stream(self, rng, i):
        body = json.dumps(dict(model=self.model, prompt=f"{i} vanish", max_tokens=2000,
                               ignore_eos=True, stream=True))
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                   f"\r\n\r\n{body}").encode())
        got = s.recv(4096)
        s.close()
        self.count("vanish_mid_stream", got.startswith(b"HTTP/1.1 200"))

    def vanish_mid_request(self, rng, i):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{\"pro")
        s.close()
        self.count("vanish_mid_request", True)

    def slow_client(self, rng, i):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.sendall(b"GET /health HTTP/1.1\r\n")
        answer = b""
        t0 = time.time()
        try:
            while time.time() - t0 < 10:
                time.sleep(0.5)
                s.sendall(b"X-Slow: 1\r\n")
        except OSError:
            pass
        try:
            s.settimeout(10)
            while True:
                c = s.recv(4096)
                if not c:
                    break
                answer += c
        except OSError:
            pass
        s.close()
        # The header deadline (2 s here) ends it with a 408, long before the client would stop.
        self.count("slow_client", answer.startswith(b"HTTP/1.1 408") and time.time() - t0 < 8)

    def oversize(self, rng, i):
        status, _ = http(self.port, "POST", "/v1/completions", "x" * (5 << 20))
        self.count("oversize_body", status == 413)

    def deep(self, rng, i):
        status, body = http(self.port, "POST", "/v1/completions", "[" * (1 << 20))
        self.count("deep_body", status == 400 and "nests deeper" in body)

    def budget(self, rng, i):
        req = dict(prompt=f"{i} budget", max_tokens=6000, temperature=0.0,
                   extra_body={"ignore_eos": True, "strata": {"policy": "full"}})
        text, finish, message = self.run_one(req, stream=rng.random() < 0.5)
        ok = finish == "length" and ("budget" in message or "context size" in message)
        self.count("budget_stop", ok, f"(finish {finish}, message {message!r}, {len(text)} chars)")

    def worker(self, jobs):
        while True:
            with self.lock:
                if not jobs:
                    return
                i, kind, seed = jobs.pop()
            rng = random.Random(seed)
            try:
                if kind == "normal":
                    req = self.request(rng, i)
                    stream = rng.random() < 0.5
                    text, finish, message = self.run_one(req, stream)
                    with self.lock:
                        self.results.append((req, stream, text, finish, message))
                else:
                    getattr(self, kind)(rng, i)
            except Exception as e:  # noqa: BLE001 - any client error is a failed check
                self.fail(f"request {i} ({kind}): {type(e).__name__}: {e}")

    def run(self):
        a = self.a
        self.start_server()
        try:
            self.run_one(self.request(random.Random(0), -1), stream=False)  # warm-up
            rss0 = rss_mib(self.proc.pid)
            rng = random.Random(a.seed)
            kinds = ["vanish_mid_stream", "vanish_mid_request", "slow_client", "oversize", "deep",
                     "budget"]
            jobs = []
            for i in range(a.requests):
                kind = kinds[(i // 4) % len(kinds)] if i % 4 == 3 else "normal"
                jobs.append((i, kind, rng.randint(0, 1 << 30)))
            rng.shuffle(jobs)
            t0 = time.time()
            threads = [threading.Thread(target=self.worker, args=(jobs,)) for _ in range(a.streams)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            load_s = time.time() - t0
            # Every slot free, nothing queued (the scheduler frees a vanished client's slot at
            # its next step).
            health = {}
            for _ in range(200):
                health = json.loads(http(self.port, "GET", "/health")[1])
                if health.get("active") == 0 and health.get("queue") == 0:
                    break
                time.sleep(0.05)
            if health.get("active") != 0 or health.get("queue") != 0:
                self.fail(f"slots not free after the load: {health}")
            slots = json.loads(http(self.port, "GET", "/slots")[1])
            if any(s["is_processing"] for s in slots):
                self.fail(f"/slots shows a busy slot after the load: {slots}")
            rss1 = rss_mib(self.proc.pid)
            if rss1 > rss0 + a.rss_bound:
                self.fail(f"RSS grew from {rss0:.0f} MiB to {rss1:.0f} MiB (bound +{a.rss_bound})")
            # Solo runs: each completed response again, alone.
            mismatches = 0
            for req, stream, text, finish, message in self.results:
                solo, solo_finish, _ = self.run_one(req, stream=False)
                same = solo == text if not message else solo.startswith(text)
                if not same:
                    mismatches += 1
                    self.fail(f"response differs from its solo run: {req['prompt'][:30]!r} "
                              f"{req['extra_body']} stream={stream}: {text!r} vs {solo!r}")
            # SIGTERM while STREAMS streams run.
            ends = []

            # The streams SIGTERM meets hold the file archive when one is among the policies
            # (whichever of them the scheduler admits first), else the policies in turn.
            policies = a.policies.split(",")
            archived = [p for p in policies if "ARCHIVE" in p]

            def long_stream(j):
                policy = archived[0] if archived else policies[j % len(policies)]
                req = dict(prompt=f"term {j}", max_tokens=2000, temperature=0.0,
                           extra_body={"ignore_eos": True,
                                       "strata": {"policy": self.policy(policy)}})
                try:
                    _, finish, message = self.run_one(req, stream=True)
                    with self.lock:
                        ends.append((finish, message))
                except openai.APIStatusError as e:
                    # Not admitted before the signal: refused, as every new request then is.
                    if e.status_code == 503 and "shutting down" in str(e):
                        with self.lock:
                            ends.append(("refused", ""))
                    else:
                        self.fail(f"stream {j} during SIGTERM: {e}")
                except Exception as e:  # noqa: BLE001
                    self.fail(f"stream {j} during SIGTERM: {type(e).__name__}: {e}")

            streams = [threading.Thread(target=long_stream, args=(j,)) for j in range(a.streams)]
            for t in streams:
                t.start()
            for _ in range(400):
                h = json.loads(http(self.port, "GET", "/health")[1])
                if h.get("active", 0) + h.get("queue", 0) >= a.streams:
                    break
                time.sleep(0.02)
            # With a file archive among the policies, its files must exist now (so that "none
            # left" below means they were removed, not never written).
            archive_seen = 0
            if "ARCHIVE" in a.policies:
                for _ in range(3000):
                    archive_seen = len(os.listdir(self.archive))
                    if archive_seen:
                        break
                    time.sleep(0.02)
                if not archive_seen:
                    self.fail("the file archive held no file while its streams ran")
            self.proc.send_signal(signal.SIGTERM)
            for t in streams:
                t.join()
            code = self.proc.wait(timeout=60)
            if code != 0:
                self.fail(f"strata serve exited {code} after SIGTERM")
            if len(ends) != a.streams:
                self.fail(f"{a.streams - len(ends)} streams did not end cleanly at SIGTERM")
            left = os.listdir(self.archive)
            if left:
                self.fail(f"the file archive left {left}")
            print(json.dumps({
                "requests": a.requests, "streams": a.streams, "completed": len(self.results),
                "solo_mismatches": mismatches, "faults": self.faults, "load_seconds": round(load_s, 1),
                "rss_mib_start": round(rss0, 1), "rss_mib_end": round(rss1, 1),
                "archive_files_before_sigterm": archive_seen,
                "sigterm_streams_ended": sum(1 for f, _ in ends if f != "refused"),
                "sigterm_streams_refused": sum(1 for f, _ in ends if f == "refused"),
                "failures": len(self.failures)}))
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            shutil.rmtree(self.archive, ignore_errors=True)
        return 1 if self.failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--strata", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=12)
    # Small enough that a sequence sent to run long (the budget fault) meets it, large enough
    # for 4 normal sequences beside it (nope-mla: 640 bytes of cache per token).
    p.add_argument("--kv-budget", default="1MiB")
    p.add_argument("--rss-bound", type=float, default=64.0, help="MiB of RSS growth allowed")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policies",
                   default="full,streaming:ratio=2,vestige@64:block=64:archive=file:ARCHIVE,"
                           "vestige@64:block=64")
    return Soak(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
