"""Data of a distributed job's size: each process's peak memory, and the mini-batches per second,
from an .npz and from TFRecord shards, against the digits.

    python benchmarks/big_data.py                       # every run below, about 10 minutes
    python benchmarks/big_data.py --runs digits,cifar   # some of them
    python benchmarks/big_data.py --from_logs           # the table again, from the last runs

The sets are generated (offline) with real shapes: uint8 images, each a class's template plus
noise, learnable. CIFAR-shaped is 50,000 x 32x32x3 (614 MB as float32), "large" 200,000 x 3072
(2.4 GB as float32); each has 10,000 test examples. A run is the example's own run.sh
(Distributed-Setup: 1 ps + 2 workers) or Non-Distributed-Setup's train.py, --steps 2000 at the
defaults (but the learning rate on the generated sets); a process's peak resident memory is its
VmHWM in /proc, read twice a second.
With every run, the table goes to benchmarks/results/big_data.md and its section of
benchmarks/README.md; with some, to stdout only.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

import example_runs  # PeakMemory, the chief's summary line
import published_tables  # the figures reach the READMEs only through here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETS = {"cifar": ((50000, 32, 32, 3), 10000), "large": ((200000, 3072), 10000)}
# name: (the set, the example, "npz" or "records" (or None: the digits), what it shows)
RUNS = {
    "digits": (None, "Distributed-Setup", None, "the baseline: the digits in memory"),
    "cifar": ("cifar", "Distributed-Setup", "npz", "goal: largest process under 2.5 GB"),
    "large-one-process": ("large", "Non-Distributed-Setup", "npz",
                          "goal: no 2 GB error, peak under 6 GB"),
    "large-npz": ("large", "Distributed-Setup", "npz", "each worker holds the whole set"),
    "large-records": ("large", "Distributed-Setup", "records",
                      "goal: every process under 1.5 GB; mini-batches/s within 20% of npz"),
}
STEPS = 2000
LOG_EVERY = 200  # a worker's rate over each 200 of its mini-batches, evaluations left out
LEARNING_RATE = 0.002  # on the generated sets


def generate(name, folder):
    """The set as an .npz of uint8 (and its TFRecord shards), made once in folder."""
    npz = os.path.join(folder, name + ".npz")
    shards = os.path.join(folder, name + "-records")
    if not os.path.exists(npz):
        (train_shape, test_count), rng = SETS[name], np.random.default_rng(0)
        features = int(np.prod(train_shape[1:]))
        templates = rng.integers(0, 256, (10, features)).astype(np.float32)

        def examples(count):
            x, y = np.empty((count, features), np.uint8), rng.integers(0, 10, count)
            for i in range(0, count, 10000):  # a float copy of 10,000 rows at a time
                noise = rng.integers(0, 256, (len(y[i:i + 10000]), features))
                x[i:i + 10000] = 0.5 * templates[y[i:i + 10000]] + 0.5 * noise
            return x.reshape((count,) + train_shape[1:]), y
        x_train, y_train = examples(train_shape[0])
        x_test, y_test = examples(test_count)
        np.savez(npz + ".part.npz", x_train=x_train, y_train=y_train, x_test=x_test,
                 y_test=y_test)
        os.rename(npz + ".part.npz", npz)
    if not os.path.exists(os.path.join(shards, "meta.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "npz_to_tfrecord.py"), npz,
                        shards, "--shards", "8"], check=True)
    return npz, shards


def role_of(marker):
    """pid -> the role of a train.py process whose command line holds marker ("local" for one
    process), or None."""
    def role(pid):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            return None
        if marker not in args or not any(a.endswith("train.py") for a in args):
            return None
        if "--job_name" not in args:
            return "local"
        return args[args.index("--job_name") + 1] + args[args.index("--task_index") + 1]
    return role


def run(name, folder):
    data_set, example, kind, _ = RUNS[name]
    log_dir = os.path.join(folder, "logs", name)
    shutil.rmtree(log_dir, ignore_errors=True)  # a new run, not a resume
    args = ["--steps", str(STEPS), "--log_every", str(LOG_EVERY), "--log_dir", log_dir]
    if data_set:  # 3072 inputs in [0, 1], not centred: the digits' rate of 0.1 diverges
        npz, shards = generate(data_set, folder)
        args += ["--data_path", npz if kind == "npz" else shards, "--learning_rate",
                 str(LEARNING_RATE)]
    command = ([sys.executable, os.path.join(ROOT, example, "train.py")]
               if example == "Non-Distributed-Setup" else
               ["bash", os.path.join(ROOT, example, "run.sh")]) + args
    started = time.time()
    with example_runs.PeakMemory(role_of(log_dir)) as memory:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    seconds = time.time() - started
    peaks = {role: kb // 1024 for role, kb in memory.peak.items()}  # in MB
    errors = [l for l in (proc.stdout + proc.stderr).splitlines() if "error" in l.lower()]
    result = dict(run=name, code=proc.returncode, seconds=round(seconds, 1), peaks_mb=peaks,
                  errors=errors[:3])
    summary = example_runs.summary_fields(proc.stdout)
    if proc.returncode == 0 and summary is None:  # the table shows it as failed, with why
        result.update(code=1, errors=["exit 0, but no summary line from the chief"])
    elif proc.returncode == 0:
        result.update(steps_per_sec=minibatches_per_second(proc.stdout),
                      test_accuracy=summary.get("test_accuracy"))
    with open(os.path.join(folder, name + ".result.json"), "w") as f:
        json.dump(result, f)
    return result


def minibatches_per_second(output):
    """The run's mini-batches per second: each process's median progress-line rate, its first
    line (the pipeline filling) left out, summed over the processes that train."""
    rates = {}
    for line in output.splitlines():
        match = re.match(r"\[(\w+)\] local_step=\d+ .*steps_per_sec=([\d.]+)", line)
        if match:
            rates.setdefault(match.group(1), []).append(float(match.group(2)))
    return sum(float(np.median(r[1:] or r)) for r in rates.values())


def table(results):
    lines = ["| run | data | example | training set as float32 | peak resident memory (MB), by process "
             "| mini-batches/s | against the digits | test accuracy | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]
    digits = next((r.get("steps_per_sec") for r in results if r["run"] == "digits"), None)
    for r in results:
        data_set, example, kind, _ = RUNS[r["run"]]
        size = "%.0f MB" % (4 * np.prod(SETS[data_set][0]) / 1e6) if data_set else "0.4 MB"
        peaks = ", ".join("%s %d" % (role, mb) for role, mb in sorted(r["peaks_mb"].items()))
        if r["code"] != 0:
            lines.append("| %s | %s | %s | %s | %s | failed: %s | | | %.0f |" % (
                r["run"], kind or "digits", example, size, peaks, "; ".join(r["errors"])[:200],
                r["seconds"]))
            continue
        ratio = "%.2fx" % (r["steps_per_sec"] / digits) if digits else "n/a"
        lines.append("| %s | %s | %s | %s | %s | %.0f | %s | %.3f | %.0f |" % (
            r["run"], ("%s (%s)" % (data_set, kind)) if data_set else "digits", example, size,
            peaks, r["steps_per_sec"], ratio, r["test_accuracy"], r["seconds"]))
    return "\n".join(lines) + (
        "\n\n%d mini-batches of 64 each run, at the defaults but --learning_rate %g on the "
        "generated sets; mini-batches/s: each process's median progress-line rate (every %d of "
        "its mini-batches, the first left out, the chief's evaluations not in it), summed; Distributed-Setup: 1 ps + 2 workers (run.sh); %d CPU core(s). "
        "Written by `python benchmarks/big_data.py`.\n" % (STEPS, LEARNING_RATE, LOG_EVERY,
                                                             os.cpu_count()))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=",".join(RUNS), help="which runs, comma-separated: %s"
                   % ", ".join(RUNS))
    p.add_argument("--work", default="/tmp/big_data", help="where the sets and logs go "
                   "(some 5 GB)")
    p.add_argument("--from_logs", action="store_true", help="the table from the last runs")
    args = p.parse_args(argv)
    names = args.runs.split(",")
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        print("error: unknown run(s) %s: use %s" % (",".join(unknown), ", ".join(RUNS)),
              file=sys.stderr)
        return 2
    os.makedirs(args.work, exist_ok=True)
    results = []
    for name in names:
        if args.from_logs:
            with open(os.path.join(args.work, name + ".result.json")) as f:
                results.append(json.load(f))
        else:
            results.append(run(name, args.work))
            print(json.dumps(results[-1]), flush=True)
    text = table(results)
    print(text)
    if names == list(RUNS):
        published_tables.publish("big_data.py", text, [published_tables.BENCHMARKS_README])
    return 0


if __name__ == "__main__":
    sys.exit(main())
