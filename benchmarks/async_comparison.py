"""The asynchronous examples side by side with the one-process baseline, in one run.

    python benchmarks/async_comparison.py              # 3 repeats: about 10 min on 2 cores
    python benchmarks/async_comparison.py --repeats 1 --steps 3000

Runs Non-Distributed-Setup (1 process) and Distributed-Setup, Hogwild, DOWNPOUR and ADAG (1 ps +
2 workers each), every one through its own run.sh with its own defaults and the same budget:
--steps mini-batch steps, summed over the workers. Each repeat is two runs per example:
  - a throughput run without evaluation: steps/s (mini-batch steps of all workers per second of
    the chief's training loop, process start-up excluded) and examples/s;
  - a timeline run that evaluates the test accuracy every --eval_every local steps of the chief:
    the wall time to reach --target test accuracy (seconds since the chief started its session,
    from its metrics history), and the final test accuracy.
Prints a markdown table of the medians over the repeats.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGURATIONS = [("Non-Distributed-Setup", 1), ("Distributed-Setup", 2), ("Hogwild", 2),
                  ("DOWNPOUR", 2), ("ADAG", 2)]


def run_once(example, workers, args, extra):
    """One run through run.sh; returns the chief's metrics (the JSON of its summary line)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics_file = os.path.join(tmp, "metrics.json")
        command = ["bash", os.path.join(ROOT, example, "run.sh"), "--steps", str(args.steps),
                   "--log_every", str(10 ** 9), "--log_dir", os.path.join(tmp, "logs"),
                   "--metrics_file", metrics_file] + extra
        env = dict(os.environ, NUM_WORKERS=str(workers))
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not os.path.exists(metrics_file):
            sys.exit("benchmark: %s with %d worker(s) failed (exit %d):\n%s"
                     % (example, workers, proc.returncode, proc.stdout[-2000:]))
        with open(metrics_file) as f:
            return json.load(f)


def seconds_to(target, history):
    """Seconds since the chief started until the first evaluation at or above target."""
    for seconds, _, accuracy in history:
        if accuracy >= target:
            return seconds
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000,
                   help="mini-batch steps per run, summed over workers (default: 2000)")
    p.add_argument("--repeats", type=int, default=3, help="runs per example (default: 3)")
    p.add_argument("--eval_every", type=int, default=10,
                   help="evaluate every N local steps of the chief in timeline runs (default: 10)")
    p.add_argument("--target", type=float, default=0.95,
                   help="test accuracy to time (default: 0.95)")
    args, extra = p.parse_known_args()  # anything else goes to every train.py
    rows = []
    for example, workers in CONFIGURATIONS:
        throughput, timeline = [], []
        for _ in range(args.repeats):
            throughput.append(run_once(example, workers, args, ["--eval_every", "0"] + extra))
            timeline.append(run_once(example, workers, args,
                                     ["--eval_every", str(args.eval_every)] + extra))
        times = [seconds_to(args.target, m["history"]) for m in timeline]
        reached = [t for t in times if t is not None]
        row = (example, workers,
               statistics.median(m["steps_per_sec"] for m in throughput),
               statistics.median(m["examples_per_sec"] for m in throughput),
               statistics.median(reached) if len(reached) > len(times) // 2 else None,
               "%d/%d" % (len(reached), len(times)),
               statistics.median(m["global_step"] for m in timeline),
               statistics.median(m["test_accuracy"] for m in timeline))
        rows.append(row)
        print("  %-22s workers=%d %8.0f steps/s  to %.2f: %s" % (
            example, workers, row[2], args.target,
            "%.2f s" % row[4] if row[4] is not None else "not reached"), file=sys.stderr)
    print("| example | workers | steps/s | examples/s | seconds to %.2f | runs reaching it "
          "| ps updates | final test accuracy |" % args.target)
    print("|---|---|---|---|---|---|---|---|")
    for example, workers, rate, examples, seconds, reached, updates, accuracy in rows:
        print("| %s | %d | %.0f | %.0f | %s | %s | %d | %.3f |" % (
            example, workers, rate, examples, "%.2f" % seconds if seconds is not None else "-",
            reached, updates, accuracy))
    print("\nmedians of %d repeat(s) of %d mini-batch steps (batch %s), each example with its "
          "own defaults; steps/s from runs without evaluation, time to %.2f from runs that "
          "evaluate every %d chief steps; %d CPU core(s)"
          % (args.repeats, args.steps, "64" if "--batch_size" not in extra else
             extra[extra.index("--batch_size") + 1], args.target, args.eval_every,
             os.cpu_count()))


if __name__ == "__main__":
    main()
