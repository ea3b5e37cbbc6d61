"""Start ``gambit scorer serve`` N times and stop each with a signal: how many stops exit cleanly.

    PYTHONPATH=services .venv/bin/python tools/server_stop_loop.py [--runs 8] [--signal SIGTERM]
        [--after-s 3] [--sigint-ignored]

Each run waits for the server's ready line, lets it serve ``--after-s`` seconds, sends the signal and
waits for the exit (30 s at most). A clean stop exits 0 after printing "<SIGNAL>: stopping"; before
``ScorerCore.close`` joined its batcher about half of the stops aborted at interpreter exit ("terminate
called without an active exception", exit -6). ``--sigint-ignored`` starts the server as a script's
background job does, with SIGINT ignored.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time


def one_stop(sig: signal.Signals, after_s: float, sigint_ignored: bool) -> tuple[int | None, str]:
    """(exit code, None if it never got ready; the output's last line)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gambit.cli", "scorer", "serve", "--scorer", "mlp", "--port", "0",
         "--metrics-port", "-1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and not line.startswith("ScorerService on "):
            line = proc.stdout.readline()
            if not line:
                return None, "exited before it was ready"
        time.sleep(after_s)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
        lines = [x for x in out.splitlines() if x.strip()]
        return proc.returncode, lines[-1] if lines else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8, help="servers started and stopped, one after another")
    p.add_argument("--signal", default="SIGTERM", choices=("SIGTERM", "SIGINT"), help="the stop signal")
    p.add_argument("--after-s", type=float, default=3.0, help="seconds each server serves before the signal")
    p.add_argument("--sigint-ignored", action="store_true", help="start it with SIGINT ignored (`cmd &`)")
    args = p.parse_args(argv)
    sig = signal.Signals[args.signal]
    clean = 0
    for i in range(args.runs):
        rc, last = one_stop(sig, args.after_s, args.sigint_ignored)
        clean += rc == 0
        print(f"run {i + 1}/{args.runs}: exit {rc}  {last}", flush=True)
    print(f"{clean} of {args.runs} stops clean ({args.signal} after {args.after_s:g} s)")
    return 0 if clean == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
