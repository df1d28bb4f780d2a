"""k7 as a beanstalkd server, used by an unchanged beanstalkd client (greenstalk).

    python examples/beanstalk_greenstalk.py        # pip install greenstalk (and k7py[cli])

Starts ``k7 serve`` on a fresh temporary directory, on a free port (``--listen
127.0.0.1:0``: the server prints where it listens), puts a few jobs with greenstalk,
reserves and deletes them, then stops the server with SIGTERM.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile

import greenstalk


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # `k7 serve DIR`; `python -m k7core` is the `k7` command of this interpreter
        server = subprocess.Popen(
            [sys.executable, "-m", "k7core", "serve", f"{tmp}/jobs",
             "--listen", "127.0.0.1:0", "--fsync", "sync"],
            stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            line = server.stdout.readline()  # "listening on 127.0.0.1:PORT" once ready
            if not line.startswith("listening on "):
                sys.exit(f"the server did not start (exit {server.wait()})")
            host, _, port = line.split()[-1].rpartition(":")
            print(f"k7 serve: listening on {host}:{port}")

            with greenstalk.Client((host, int(port)), use="emails", watch="emails") as c:
                for to in ("ada", "grace", "linus"):
                    job_id = c.put(f"mail to {to}", ttr=30)  # INSERTED: msync'd (sync)
                    print(f"put job {job_id}: mail to {to}")
                for _ in range(3):
                    job = c.reserve(timeout=1)
                    print(f"reserved job {job.id}: {job.body}")
                    c.delete(job)
                    print(f"deleted job {job.id}")
                print(f"jobs left in 'emails': {c.stats_tube('emails')['current-jobs-ready']}")
        finally:
            server.send_signal(signal.SIGTERM)
            print(f"server stopped (exit {server.wait(timeout=30)})")


if __name__ == "__main__":
    main()
