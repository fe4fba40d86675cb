"""Throughput of the examples on the same model and batch size, side by side, in one run.

    python benchmarks/throughput.py                  # batch 32 and 128, 3 repeats (medians)
    python benchmarks/throughput.py --batch_sizes 128 --repeats 1 --steps 1000

Each configuration runs through the example's own run.sh (so it measures what a user runs),
with the chief's summary line read back: steps/s counts global steps (all workers together)
over the training loop only, not process start-up. The last column divides by the
one-process rate of Non-Distributed-Setup at the same batch size.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import example_runs  # the chief's summary line, read
import published_tables  # the figures reach the READMEs only through here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = ("Non-Distributed-Setup", 1)
CONFIGURATIONS = [BASELINE, ("Distributed-Setup", 1), ("Distributed-Setup", 2)]


def run_once(example, workers, batch_size, steps, extra):
    """The chief's summary of one run (example_runs.summary_fields)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["bash", os.path.join(ROOT, example, "run.sh"), "--batch_size", str(batch_size),
                "--steps", str(steps), "--log_every", str(10 ** 9),
                "--log_dir", os.path.join(tmp, "logs")] + extra
        env = dict(os.environ, NUM_WORKERS=str(workers))
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        summary = example_runs.summary_fields(proc.stdout)
        if proc.returncode != 0 or summary is None:
            sys.exit("benchmark: %s with %d worker(s) failed (exit %d):\n%s"
                     % (example, workers, proc.returncode, proc.stdout[-2000:]))
        return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_sizes", default="32,128", help="comma-separated (default: 32,128)")
    p.add_argument("--steps", type=int, default=3000, help="global steps per run (default: 3000)")
    p.add_argument("--repeats", type=int, default=3, help="runs per configuration (default: 3)")
    p.add_argument("--no_publish", action="store_true", help="print only; leave the READMEs")
    args, extra = p.parse_known_args()  # anything else goes to every train.py
    rows = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        rates = {}
        for example, workers in CONFIGURATIONS:
            runs = [run_once(example, workers, batch_size, args.steps, extra)
                    for _ in range(args.repeats)]
            rate = statistics.median(r["steps_per_sec"] for r in runs)
            rates[(example, workers)] = rate
            rows.append((example, workers, batch_size, rate, rate * batch_size,
                         rate / rates[BASELINE], statistics.median(r["test_accuracy"]
                                                                   for r in runs)))
            print("  %-22s workers=%d batch=%-4d %8.1f steps/s" % (example, workers, batch_size,
                                                                  rate), file=sys.stderr)
    lines = ["| example | workers | batch | steps/s | examples/s | vs one process | test accuracy |",
             "|---|---|---|---|---|---|---|"]
    for example, workers, batch, rate, examples, ratio, accuracy in rows:
        lines.append("| %s | %d | %d | %.0f | %.0f | %.2f | %.3f |" % (
            example, workers, batch, rate, examples, ratio, accuracy))
    lines += ["", "medians of %d run(s) of %d global steps; %d CPU core(s)"
              % (args.repeats, args.steps, os.cpu_count())]
    print("\n".join(lines))
    if not args.no_publish:
        published_tables.publish("throughput.py", "\n".join(lines),
                                 [published_tables.BENCHMARKS_README])


if __name__ == "__main__":
    main()
