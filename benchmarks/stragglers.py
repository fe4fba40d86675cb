"""Sync-SGD with a straggler: step time with and without a backup worker, in one run.

    python benchmarks/stragglers.py                 # 3 workers, one 0.1 s slower each step
    python benchmarks/stragglers.py --delay 0.25 --steps 600

Runs Sync-SGD/run.sh with NUM_WORKERS workers, the last one sleeping --delay seconds before
each step, once with no backup worker (every step waits for all) and once with one (a step
takes the first workers - 1 gradients), and once more without a straggler for reference.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import example_runs  # the chief's summary line, read
import published_tables  # the figures reach the READMEs only through here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(workers, backup, delay, steps):
    """The chief's summary of one run of Sync-SGD (example_runs.summary_fields)."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            ["bash", os.path.join(ROOT, "Sync-SGD", "run.sh"), "--steps", str(steps),
             "--backup_workers", str(backup), "--straggler_delay", str(delay),
             "--log_every", str(10 ** 9), "--log_dir", os.path.join(tmp, "logs")],
            env=dict(os.environ, NUM_WORKERS=str(workers)),
            capture_output=True, text=True, timeout=900)
        summary = example_runs.summary_fields(proc.stdout)
        if proc.returncode != 0 or summary is None:
            sys.exit("stragglers: the run with b=%d failed:\n%s" % (backup, proc.stdout[-2000:]))
        return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3, help="(default: 3)")
    p.add_argument("--delay", type=float, default=0.1, help="straggler's extra seconds a step")
    p.add_argument("--steps", type=int, default=600, help="mini-batches per run (default: 600)")
    p.add_argument("--no_publish", action="store_true", help="print only; leave the READMEs")
    args = p.parse_args()
    lines = ["| straggler delay | backup workers | gradients a step | step time | steps/s "
             "| dropped gradients | test accuracy |", "|---|---|---|---|---|---|---|"]
    for delay, backup in [(0, 0), (args.delay, 0), (args.delay, 1)]:
        m = run(args.workers, backup, delay, args.steps)
        n = m["replicas_to_aggregate"]
        step_seconds = n / m["steps_per_sec"]  # a synchronous step aggregates n mini-batches
        dropped = sum(s for s in m["local_steps"] if s > 0) - m["updates"] * n  # pushed, unused
        lines.append("| %g s | %d | %d of %d | %.3f s | %.1f | %d | %.3f |" % (
            delay, backup, n, m["workers"], step_seconds, 1 / step_seconds, dropped,
            m["test_accuracy"]))
        print(lines[-1], flush=True)
    lines += ["", "%d workers on %d CPU core(s); --steps %d mini-batches per run"
              % (args.workers, os.cpu_count(), args.steps)]
    print(lines[-1])
    if not args.no_publish:
        published_tables.publish("stragglers.py", "\n".join(lines), [
            published_tables.BENCHMARKS_README,
            os.path.join(published_tables.ROOT, "Sync-SGD", "README.md")])


if __name__ == "__main__":
    main()
