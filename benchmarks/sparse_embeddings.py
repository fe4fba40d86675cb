"""Sparse-Embeddings on separate hosts: bytes per mini-batch with row-sparse and with densified
gradients, the load on each ps with 1, 2 and 4 ps, and mini-batches/s at 100 Mbit/s.

    sudo python benchmarks/sparse_embeddings.py            # the published run, about 15 min
    sudo python benchmarks/sparse_embeddings.py --quick    # a smoke run that publishes nothing

Every run is benchmarks/cluster.py: each task a host of its own (a network namespace), whose
interface counters give the bytes each host sent and received. The table is the example's
default, 1M x 32 (128 MB, and the 4 MB linear table).

1. Bytes per mini-batch, 1 ps and 2 workers, unlimited links: each run twice, with N and 2N
   mini-batches and no evaluation in between (--log_every past the end), and the difference
   divided by N, so that what every run pays once (start-up, the final checkpoint, which reads
   the tables to the chief) drops out. Sparse: N = --steps; dense: N = --dense_steps.
2. The load of each ps with 1, 2 and 4 ps (2 workers, --steps mini-batches, unlimited links):
   the bytes its host sent and received over the whole run (the final checkpoint included:
   each ps sends its slices once), and its peak resident memory (VmHWM, read from /proc while
   it runs).
3. Mini-batches/s with 1, 2 and 4 ps, 3 workers, every link at 100 Mbit/s, at --big_batch
   examples per mini-batch, so that with 1 ps its link is the bound. The busiest link and its
   bytes per mini-batch come from two runs again (--rate_steps and a quarter of it, differenced
   link by link); the bound is the rate at which that link carries them.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import published_tables  # the figures reach the READMEs only through here
import example_runs  # the command line that measures it again; PeakMemory
import command_line  # the one-line error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER_PY = os.path.join(ROOT, "benchmarks", "cluster.py")
EXAMPLE = "Sparse-Embeddings"
TRAIN_PY = os.path.join(ROOT, EXAMPLE, "train.py")
NEVER = str(10 ** 9)  # --log_every: no evaluation (and no checkpoint) inside the training loop


def parser():
    p = example_runs.argparse_for("sparse_embeddings.py", __doc__)
    p.add_argument("--steps", type=int, default=2000,
                   help="mini-batches of the sparse runs, all workers (default: 2000)")
    p.add_argument("--dense_steps", type=int, default=10,
                   help="mini-batches of the first --dense_gradients run (default: 10)")
    p.add_argument("--big_batch", type=int, default=8192,
                   help="batch size of the 100 Mbit/s runs (default: 8192)")
    p.add_argument("--rate_steps", type=int, default=240,
                   help="mini-batches of each 100 Mbit/s run (default: 240)")
    p.add_argument("--ps_counts", default="1,2,4", help="(default: 1,2,4)")
    p.add_argument("--quick", action="store_true",
                   help="a 100k-row table and few steps: a smoke run that publishes nothing")
    p.add_argument("--out", default=published_tables.RESULTS,
                   help="where the logs go, under logs/sparse_embeddings-* (default: "
                        "benchmarks/results)")
    return p



def ps_index(pid):
    """The ps task index of a train.py process of this example, by its TF_CONFIG (None: not one)."""
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            if TRAIN_PY.encode() not in f.read():
                return None
        with open("/proc/%s/environ" % pid, "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        task = json.loads(env[b"TF_CONFIG"])["task"]
    except (OSError, KeyError, ValueError):
        return None
    return task["index"] if task["type"] == "ps" else None


def run(args, tag, ps, workers, steps, train_args=(), bandwidth="unlimited"):
    """One cluster.py run; returns the chief's metrics with cluster.py's report under
    "cluster" and each ps's peak memory in kB under "ps_peak_kb"."""
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    log_path, metrics_path = (os.path.join(logs, "sparse_embeddings-%s%s" % (tag, ext))
                              for ext in (".log", ".json"))
    command = [sys.executable, CLUSTER_PY, EXAMPLE, "--ps", str(ps), "--workers", str(workers),
               "--bandwidth", bandwidth, "--timeout", "900", "--metrics_file", metrics_path,
               "--", "--steps", str(steps), "--log_every", NEVER] + list(train_args)
    print("sparse_embeddings: %s" % tag, file=sys.stderr, flush=True)
    with open(log_path, "w") as log, example_runs.PeakMemory(ps_index) as memory:
        log.write("$ %s\n" % " ".join(command))
        log.flush()
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, timeout=1000)
    if code != 0 or not os.path.exists(metrics_path):
        sys.exit("sparse_embeddings: %s failed (exit %d); see %s" % (tag, code, log_path))
    with open(metrics_path) as f:
        metrics = json.load(f)
    metrics["ps_peak_kb"] = [memory.peak.get(i, 0) for i in range(ps)]
    return metrics


def bytes_per_mini_batch(args, name, steps, train_args):
    """The bytes a mini-batch adds: runs of steps and 2 * steps mini-batches, differenced."""
    short, long = (run(args, "%s-%d" % (name, n), 1, 2, n, train_args) for n in (steps, 2 * steps))
    extra_bytes = long["cluster"]["total_bytes"] - short["cluster"]["total_bytes"]
    extra_batches = long["cluster"]["mini_batches"] - short["cluster"]["mini_batches"]
    return extra_bytes / extra_batches, short


RATE_BYTES_PER_SEC = 100e6 / 8  # 100 Mbit/s


def busiest_link_per_mini_batch(short, long):
    """(host, direction, bytes per mini-batch) of the link that carries the most bytes per
    mini-batch: the difference of two runs' interface counters, over their mini-batches."""
    batches = long["mini_batches"] - short["mini_batches"]
    per_link = [((long["hosts"][h][d + "_bytes"] - short["hosts"][h][d + "_bytes"]) / batches,
                 h, d) for h in long["hosts"] for d in ("sent", "received")]
    link_bytes, host, direction = max(per_link)
    return host, direction, link_bytes


def spread(values):
    """The largest distance from the mean, as a fraction of the mean."""
    mean = statistics.mean(values)
    return max(abs(v - mean) for v in values) / mean


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    if os.geteuid() != 0:
        return command_line.error("needs root, as benchmarks/cluster.py does: sudo python "
                            "benchmarks/sparse_embeddings.py")
    table = []
    if args.quick:
        table = ["--rows", "100000"]
        args.steps, args.dense_steps, args.rate_steps = 200, 4, 40
    ps_counts = [int(n) for n in args.ps_counts.split(",")]
    started = time.time()

    sparse, sparse_run = bytes_per_mini_batch(args, "sparse", args.steps, table)
    dense, _ = bytes_per_mini_batch(args, "dense", args.dense_steps,
                                    table + ["--dense_gradients"])
    lines = ["| gradients pushed | bytes per mini-batch (batch 256, 1 ps, 2 workers) |",
             "|---|---|",
             "| row-sparse (default) | %.1f kB |" % (sparse / 1e3),
             "| densified (`--dense_gradients`) | %.1f MB |" % (dense / 1e6),
             "| ratio | %.0fx |" % (dense / sparse),
             ""]

    lines += ["| ps | bytes of each ps (MB, sent + received) | spread | peak memory of each ps "
              "(MB) | spread | its slices (MB) | test AUC (best) |", "|---|---|---|---|---|---|---|"]
    for ps in ps_counts:
        m = sparse_run if ps == 1 else run(args, "load-%dps" % ps, ps, 2, args.steps, table)
        hosts = m["cluster"]["hosts"]
        load = [(hosts["ps%d" % i]["sent_bytes"] + hosts["ps%d" % i]["received_bytes"]) / 1e6
                for i in range(ps)]
        memory = [kb / 1e3 for kb in m["ps_peak_kb"]]
        slices = m["rows"] * (m["dim"] + 1) * 4 / ps / 1e6  # both tables, float32
        lines.append("| %d | %s | %.0f%% | %s | %.0f%% | %.0f | %.3f (%.3f) |" % (
            ps, ", ".join("%.0f" % b for b in load), 100 * spread(load),
            ", ".join("%.0f" % b for b in memory), 100 * spread(memory), slices,
            m["test_auc"], m["best_auc"]))
    lines.append("")

    lines += ["| ps | mini-batches/s (3 workers, batch %d, 100 Mbit/s) | vs 1 ps | busiest link "
              "| its kB per mini-batch | its bound (mini-batches/s) | achieved / bound |"
              % args.big_batch, "|---|---|---|---|---|---|---|"]
    first = None
    for ps in ps_counts:
        short, m = (run(args, "rate-%dps-%d" % (ps, n), ps, 3, n,
                        table + ["--batch_size", str(args.big_batch)], bandwidth="100mbit")
                    for n in (args.rate_steps // 4, args.rate_steps))
        first = first or m["steps_per_sec"]
        host, direction, link_bytes = busiest_link_per_mini_batch(short["cluster"], m["cluster"])
        bound = RATE_BYTES_PER_SEC / link_bytes
        lines.append("| %d | %.2f | %.2fx | %s %s | %.0f | %.2f | %.2f |" % (
            ps, m["steps_per_sec"], m["steps_per_sec"] / first, host, direction,
            link_bytes / 1e3, bound, m["steps_per_sec"] / bound))
    lines += ["", "`%s`: %.0f min on %d shared CPU core(s), the default 1M x 32 table%s. Bytes "
              "per mini-batch: the difference of runs of N and 2N mini-batches (N = %d sparse, "
              "%d dense), divided by N. The load of each ps counts whole runs, with start-up and the "
              "final checkpoint (each ps sends its slices to the chief once); peak memory is "
              "VmHWM, TensorFlow's own included."
              % (example_runs.rerun_command("sparse_embeddings.py", argv, sudo=True),
                 (time.time() - started) / 60, os.cpu_count(),
                 " (--quick: 100k rows)" if args.quick else "", args.steps, args.dense_steps)]
    text = "\n".join(lines)
    print(text)
    if os.path.abspath(args.out) == published_tables.RESULTS and not args.quick:
        published_tables.publish("sparse_embeddings.py", text, [published_tables.BENCHMARKS_README])
    return 0


if __name__ == "__main__":
    sys.exit(main())
