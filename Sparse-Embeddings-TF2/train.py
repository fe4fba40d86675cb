"""Sparse-Embeddings-TF2: ../Sparse-Embeddings with TensorFlow 2's ParameterServerStrategy.

What it teaches
    The same sharded table and row-sparse updates, written the TensorFlow 2 way (as
    ../ParameterServerStrategy is to ../Distributed-Setup). Under strategy.scope(), a
    variable_partitioner cuts each table into a slice per ps: a tf.Variable made there is a
    ShardedVariable, its slices on the ps tasks in order. The coordinator ("chief") schedules a
    tf.function on a free worker; tf.nn.embedding_lookup on the ShardedVariable gathers each
    slice's rows on its ps, tf.GradientTape gives each slice a tf.IndexedSlices (its rows' ids
    and gradients), and slice.scatter_sub applies it there: no other row moves or changes. No
    Keras layer is involved (a custom loop: Keras 3 has no fit() for this strategy).

The update rule (each step; asynchronous, as in ../Sparse-Embeddings)
    r      <- hash(ids of the worker's next mini-batch)
    logit  =  <v_user, v_item> + w_user + w_item + b       # v, w: rows r, from their slices
    g      <- grad of the clicks' log loss: per slice, (rows of r in it, one gradient row each)
    slice.scatter_sub(learning_rate * g)                   # on the slice's ps

Run it
    bash run.sh                           # 1 ps + 2 workers + the coordinator: a 1M x 32 table
    NUM_PS=4 bash run.sh                  # a slice of each table on each of 4 ps
    By hand or with TF_CONFIG: as in ../ParameterServerStrategy.

Use your own data and model: the sections marked "(replace with your own)", as in
../Sparse-Embeddings. A checkpoint (tf.train.Checkpoint) keeps each table as one tensor and
restores into any number of slices.

References
    TensorFlow guide "Parameter server training with ParameterServerStrategy" (the
    variable_partitioner and ShardedVariable); S. Rendle, "Factorization Machines", ICDM 2010.
"""
import argparse
import collections
import contextlib
import json
import math
import os
import socket
import sys
import threading
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "Sparse-Embeddings-TF2"
JOBS = ("chief", "worker", "ps")  # the jobs of its cluster; deploy/ and the tests read them here


def example_flags(parser):
    parser.add_argument("--chief_host", default="", help="host:port of the coordinator")
    parser.add_argument("--steps_per_call", type=positive_int, default=10,
                        help="K: mini-batch steps inside one scheduled function")
    parser.set_defaults(batch_size=256, steps=2000, log_every=500,  # a checkpoint a progress line
                        learning_rate=5.0)  # a row's gradient: its pairs' share of the mean loss
    parser.add_argument("--rows", type=positive_int, default=1000000,
                        help="rows of the embedding table: users and items, one row each")
    parser.add_argument("--dim", type=positive_int, default=32, help="numbers in a row")


# --- Data (replace with your own) -----------------------------------------------------------------
# >>> shared: clicks
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test best_scores")
DATA_SEED = 2026  # the hidden model and the examples are the same in every run and on every task


def make_clicks(num_ids, train_examples=500000, test_examples=20000):
    """Clicks of users on items, drawn from a hidden model (Koren et al.'s latent factors):
        user u: factors p_u;  item i: factors q_i and appeal a_i   (all standard normal)
        item i is shown with probability proportional to 1 / (i + 1)  (a power law)
        score  s = <p_u, q_i> / sqrt(8) + a_i;  a click when s + noise > 1.2, noise ~ N(0, 1)
    About one pair in four is a click. Ids: U = num_ids // 64 users 0 .. U-1, then the items.
    x: [n, 2] ids (user, item); y: 1.0 for a click. best_scores: the test pairs' s."""
    rng = np.random.default_rng(DATA_SEED)
    users = max(num_ids // 64, 1)
    items = num_ids - users
    p, q = rng.standard_normal((users, 8)), rng.standard_normal((items, 8))  # 8 hidden factors
    appeal = rng.standard_normal(items)
    popularity = np.cumsum(1.0 / np.arange(1, items + 1))

    def draw(n):
        u = rng.integers(0, users, n)
        i = np.searchsorted(popularity, rng.random(n) * popularity[-1]).clip(0, items - 1)
        score = (p[u] * q[i]).sum(axis=1) / np.sqrt(8) + appeal[i]
        clicks = (score + rng.standard_normal(n) > 1.2).astype(np.float32)
        return np.stack([u, users + i], axis=1), clicks, score.astype(np.float32)
    x_train, y_train, _ = draw(train_examples)
    x_test, y_test, best_scores = draw(test_examples)
    return Dataset(x_train, y_train, x_test, y_test, best_scores)


def training_dataset(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches: its own shard of the pairs, reshuffled."""
    ds = tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
    ds = ds.shard(num_workers, worker_index).shuffle(20000, seed=seed * 1000 + worker_index)
    return ds.repeat().batch(batch_size, drop_remainder=True).prefetch(2)
# <<< shared: clicks


# --- Model (replace with your own) ----------------------------------------------------------------
def model_params(rows, dim, seed):
    """A row per id in two tables, v (embeddings) and w (linear), which the strategy's
    variable_partitioner cuts into a slice per ps (ShardedVariables); and b (bias), whole."""
    return {"embeddings": tf.Variable(tf.random.normal([rows, dim], stddev=0.1, seed=seed),
                                      name="embeddings"),
            "linear": tf.Variable(tf.zeros([rows]), name="linear"),
            "bias": tf.Variable(0.0, name="bias")}


def rows_of(ids, rows):
    """Row of each id: a multiplicative hash, one to one on 0 .. rows-1 (the multiplier is a
    prime larger than any table), so ids numbered by popularity spread over every slice."""
    return ids * 2654435761 % rows


def model_logits(params, ids):
    """The score of each (user, item) pair: the dot product of their embeddings plus their
    linear weights and the bias. TensorFlow 2's lookup on a ShardedVariable is "div": slice p
    holds a range of rows."""
    r = rows_of(ids, int(params["linear"].shape[0]))
    v = tf.nn.embedding_lookup(params["embeddings"], r)
    w = tf.nn.embedding_lookup(params["linear"], r)
    return tf.reduce_sum(v[:, 0] * v[:, 1], axis=1) + w[:, 0] + w[:, 1] + params["bias"]


def model_loss(params, ids, clicks):
    """The clicks' mean log loss."""
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=clicks, logits=model_logits(params, ids)))


def model_metrics(params, ids, clicks):
    """The fraction of pairs on the right side of 0 (the AUC, over all pairs, comes at the end)."""
    right = tf.equal(tf.cast(model_logits(params, ids) > 0, tf.float32), clicks)
    return {"accuracy": tf.reduce_mean(tf.cast(right, tf.float32))}


# --- The algorithm --------------------------------------------------------------------------------
SparsePss = collections.namedtuple("SparsePss", "strategy coordinator params slices global_step "
                                   "steps_per_worker per_worker_batches train_steps")


def build_sparse_pss(args, cluster, data):
    """The strategy, the tables in slices over the ps, each worker's dataset, the scheduled step."""
    workers = len(cluster["worker"])
    with bounded_start(args, cluster):  # it waits for every task: here --connect_timeout at most
        strategy = tf.distribute.ParameterServerStrategy(  # it reads the cluster from TF_CONFIG
            tf.distribute.cluster_resolver.TFConfigClusterResolver(),
            variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=256 << 10, max_shards=len(cluster["ps"])))  # a slice per ps
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():  # every variable made here lives on the ps
        params = model_params(args.rows, args.dim, args.seed)
        global_step = tf.Variable(0, dtype=tf.int64, name="global_step")
        steps_per_worker = tf.Variable(tf.zeros([workers], tf.int64), name="steps_per_worker")
    slices = [v for p in params.values() for v in getattr(p, "variables", [p])]

    def dataset_fn():  # runs on each worker as it makes its dataset (again after a restart):
        # its own part of the pairs, in an order that the global step then mixes in
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        seed = (args.seed * 1000 + tf.cast(worker, tf.int64)) * 1000003 + global_step
        return training_dataset(data, args.batch_size, worker, workers, seed)
    per_worker_batches = lambda: iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_steps(iterator):  # K steps on one worker, scheduled by the coordinator
        def gradients(ids, clicks):  # on each replica of the worker: each of its GPUs, or its CPU
            with tf.GradientTape() as tape:
                loss = model_loss(params, ids, clicks)
            return loss, tape.gradient(loss, slices)  # a table's slices: tf.IndexedSlices
        loss = tf.constant(0.0)
        for _ in tf.range(args.steps_per_call):
            losses, per_replica = strategy.run(gradients, args=next(iterator))
            rate = args.learning_rate / strategy.num_replicas_in_sync  # the replicas' mean
            for v, g in zip(slices, per_replica):
                for part in strategy.experimental_local_results(g):  # one per replica
                    if v is params["bias"]:  # one number: its gradient is dense
                        v.assign_sub(rate * part)
                    else:  # a slice of a table: only its rows, on the slice's ps
                        v.scatter_sub(rows_only(v, part, rate))
            global_step.assign_add(1)  # on the ps, unordered with the other workers' steps
            loss = strategy.reduce("MEAN", losses, axis=None)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        steps_per_worker.scatter_add(tf.IndexedSlices(
            tf.constant([args.steps_per_call], tf.int64), tf.reshape(worker, [1])))
        return loss
    return SparsePss(strategy, coordinator, params, slices, global_step, steps_per_worker,
                     per_worker_batches, train_steps)


def rows_only(table_slice, gradient, rate):
    """The rows of a table slice to subtract: rate times its gradient, which must be row-sparse
    (tf.IndexedSlices, as tf.nn.embedding_lookup gives). A dense one, from a model that reads
    the table whole, would move every row of the slice each step: it fails here, loudly."""
    if not isinstance(gradient, tf.IndexedSlices):
        raise TypeError("the gradient of table slice %s is dense: read the table with "
                        "tf.nn.embedding_lookup only, so a step moves only its rows"
                        % table_slice.name)
    return tf.IndexedSlices(rate * gradient.values, gradient.indices)


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, data):
    """Schedule until --steps mini-batches, evaluating on the way; then the AUC and the summary."""
    pss = build_sparse_pss(args, cluster, data)
    run, local_steps = schedule_until_done(args, cluster, pss, lambda: [(data.x_test, data.y_test)],
                                           lambda x, y: model_metrics(pss.params, x, y))
    test_logits = model_logits(pss.params, data.x_test)
    return run.end(local_steps, lost_workers=sum(not is_listening(a) for a in cluster["worker"]),
                   steps_per_call=args.steps_per_call,
                   test_auc=float(auc(test_logits, data.y_test)),
                   best_auc=float(auc(data.best_scores, data.y_test)), rows=args.rows,
                   dim=args.dim)


# >>> shared: auc
def auc(scores, clicks):
    """Area under the ROC curve: the chance that a click scores above a non-click (from the
    ranks of the scores; 0.5 is chance, 1 a perfect ranking)."""
    ranks = tf.cast(tf.argsort(tf.argsort(scores)), tf.float64) + 1.0
    clicks = tf.cast(clicks, tf.float64)
    positives = tf.reduce_sum(clicks)
    negatives = tf.cast(tf.size(clicks), tf.float64) - positives
    return (tf.reduce_sum(ranks * clicks) - positives * (positives + 1) / 2) / (
        positives * negatives)
# <<< shared: auc


# >>> shared: coordinator
def schedule_until_done(args, cluster, pss, test_set, test_metrics):
    """The coordinator's loop: the latest checkpoint in --log_dir restored, then calls of
    pss.train_steps scheduled until --steps mini-batches, with a progress line (the test
    metrics) and a checkpoint every --log_every; returns the run and the mini-batches each
    worker's shard gave, once every scheduled call has run, and the last checkpoint saved."""
    for name, p in pss.params.items():  # where the variables live (in slices, if partitioned)
        print("[chief0] %s %s on %s" % (name, p.shape.as_list(), ", ".join(
            v.device.split("/device")[0] for v in getattr(p, "variables", [p]))), flush=True)
    checkpoints = tf.train.CheckpointManager(tf.train.Checkpoint(
        global_step=pss.global_step, steps_per_worker=pss.steps_per_worker, **pss.params),
        args.log_dir, max_to_keep=3)
    if checkpoints.restore_or_initialize():  # a rerun with the same --log_dir resumes
        print("[chief0] resuming from the checkpoint at global step %d" % pss.global_step.numpy(),
              flush=True)
    run = TrainingRun(args, cluster, pss.global_step, test_metrics, test_set)
    iterator = pss.per_worker_batches()  # each worker makes its dataset now, at this step
    calls = math.ceil((args.steps - run.start_step) / args.steps_per_call)  # none if done
    every = max(1, args.log_every // args.steps_per_call)  # calls between progress lines
    threading.Thread(target=end_when_no_worker_answers, args=(args, cluster), daemon=True).start()
    for call in range(1, max(calls, 0) + 1):
        loss = pss.coordinator.schedule(pss.train_steps, args=(iterator,))
        if call == 1:  # traced, sent and run once: the clock starts
            loss.fetch()
            run.start_clock()
        if call % every == 0:  # every call so far has run: the line's step is exact
            pss.coordinator.join()  # (a call on another worker may still be running)
            run.progress(float(loss.fetch()))
            checkpoints.save(checkpoint_number=pss.global_step)
    pss.coordinator.join()  # every scheduled call has run (again elsewhere, if a worker died)
    checkpoints.save(checkpoint_number=pss.global_step)
    return run, [int(s) for s in pss.steps_per_worker.numpy()]


def end_when_no_worker_answers(args, cluster):
    """The coordinator waits up to an hour for a lost worker to come back: with none left for
    --connect_timeout seconds, end the run in one line instead."""
    silent_since = None
    while True:
        if any(is_listening(address) for address in cluster["worker"]):
            silent_since = None
        elif silent_since is None:
            silent_since = time.time()
        elif time.time() - silent_since > args.connect_timeout:
            print("error: chief 0 stopped: no worker has answered for %.0f s" % (
                args.connect_timeout), file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(2)
        time.sleep(1)  # the pace of the checks


def run_pss_task(args, cluster, train, data):
    """This task of a ParameterServerStrategy cluster: the chief coordinates (train), a ps or a
    worker only serves until the coordinator is gone."""
    os.environ["GRPC_FAIL_FAST"] = "use_caller"  # a lost worker fails fast; its work moves on
    if args.job_name != "chief":
        return run_task(args, serve_until_gone, args, cluster, cluster["chief"][0])
    return run_task(args, train, args, cluster, data)
# <<< shared: coordinator


def main(argv=None):
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    if args.data_path:
        fail("--data_path: this example makes its own clicks; replace make_clicks with yours")
    cluster = tf2_cluster(args, JOBS)
    data = make_clicks(args.rows) if args.job_name == "chief" else None  # it sends it
    return run_pss_task(args, cluster, train, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# Each block is one text in every train.py that has it (a test checks); this file's, in order:
# flags, tasks, summary, tf2 cluster, tf2 coordinated, tf2 run.
# >>> shared: flags
def fail(message):
    """One line on stderr and exit status 2: for bad input and lost peers, never for bugs."""
    print("error: " + message, file=sys.stderr, flush=True)
    sys.exit(2)


def number_type(kind, positive):
    """A flag's type: a number of kind, more than 0 if positive, else 0 or more (NaN neither)."""
    def parse(text):
        value = kind(text)  # not a number: a ValueError, and argparse says "invalid ... value"
        if not (value > 0 if positive else value >= 0):
            raise argparse.ArgumentTypeError("must be %s, got %s"
                                             % ("positive" if positive else "0 or more", text))
        return value
    parse.__name__ = ("positive_" if positive else "non_negative_") + kind.__name__
    return parse


positive_int, positive_float = number_type(int, True), number_type(float, True)
non_negative_int, non_negative_float = number_type(int, False), number_type(float, False)


def parse_flags(argv, example_flags):
    """The flags every example shares (a cluster's, where JOBS names one), then its own."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.error = lambda message: fail(  # "--steps must be positive, got 0", or argparse's words
        message.replace("argument ", "", 1).replace(": must be", " must be")
        if ": must be" in message else message + " (see --help)")
    common = [
        ("steps", positive_int, 2000, "mini-batches to train, summed over the workers"),
        ("batch_size", positive_int, 64, "examples per mini-batch"),
        ("learning_rate", positive_float, 0.1, "the workers' learning rate"),
        ("hidden", positive_int, 128, "width of the MLP's hidden layer"),
        ("data_path", str, "", "an .npz of x_train, y_train, x_test, y_test, or a folder of "
         "TFRecord files (tools/npz_to_tfrecord.py) (default: the digits)"),
        ("log_dir", str, "", "checkpoints and summaries; one that has them resumes"),
        ("seed", non_negative_int, 0, "seed of the initial weights and the shuffling"),
        ("log_every", positive_int, 100, "a progress line (the chief's: with the test metrics) "
         "every N local steps"),
    ]
    cluster = [
        ("job_name", str, "", "ps or worker (or set TF_CONFIG)"),
        ("task_index", non_negative_int, 0, "this task's index in its job"),
        ("ps_hosts", str, "", "comma-separated host:port of the ps tasks"),
        ("worker_hosts", str, "", "comma-separated host:port of the workers"),
        ("connect_timeout", positive_float, None, "seconds to wait for the other tasks; if not "
         "given, 60, or 600 under TF_CONFIG (a cluster's pods may start minutes apart)"),
        ("watchdog", positive_float, 300.0, "a worker whose step has not returned for this many "
         "seconds exits, for its restart policy to start it again (the examples with a ps)"),
    ]
    for flag, kind, default, text in common + (cluster if JOBS else []):
        p.add_argument("--" + flag, type=kind, default=default, help=text)
    example_flags(p)
    args = p.parse_args(argv)
    if not args.log_dir:  # a new folder for every run, beside this file
        run_name = time.strftime("%Y%m%d-%H%M%S-") + str(os.getpid())
        args.log_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs", run_name)
    return args
# <<< shared: flags


# >>> shared: tasks
def check_cluster(cluster, job, index):
    """Every address is host:port, the job is one of the cluster's, the index is in range."""
    for name, hosts in cluster.items():
        for address in hosts:
            host, _, port = str(address).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                fail("%s hosts: %r is not host:port (for example localhost:2222)"
                     % (name, address))
    if job not in cluster:
        fail("unknown job name %r: use %s" % (job, " or ".join(cluster)))
    if not 0 <= index < len(cluster[job]):
        fail("task index %d is out of range: the %s job has %d task(s), 0..%d"
             % (index, job, len(cluster[job]), len(cluster[job]) - 1))


def cause(error):
    """The line of a TensorFlow error that says what went wrong (not where, nor the trace)."""
    lines = [line for line in error.message.splitlines()  # not a rule of ====, nor indented
             if any(c.isalpha() for c in line) and not line.startswith((" ", "\t", "Node: "))]
    return lines[-1] if lines else type(error).__name__


def is_listening(address):
    try:
        socket.create_connection(address.rsplit(":", 1), timeout=1).close()
    except OSError:
        return False
    return True


def wait_for(condition, seconds=float("inf"), waiting=None):
    """Whether condition() came true within seconds; waiting() says every 30 s what for."""
    started = last_line = time.time()
    while not condition():
        if time.time() > started + seconds:
            return False
        if waiting and time.time() > last_line + 30:
            print("%s (%.0f s so far)" % (waiting(), time.time() - started), flush=True)
            last_line = time.time()
        time.sleep(0.25)  # the pace of the checks
    return True
# <<< shared: tasks


# >>> shared: summary
def print_summary(role, summary):
    """The run's last line, key=value ...: what users, the tests and the benchmarks read."""
    text = lambda v: (",".join(map(str, v)) if isinstance(v, list)
                      else "%.6g" % v if isinstance(v, float) else str(v))
    print("[%s] summary %s" % (role, " ".join("%s=%s" % (k, text(v)) for k, v in summary.items())),
          flush=True)
# <<< shared: summary


# >>> shared: tf2 cluster
def tf2_cluster(args, jobs):
    """The cluster of jobs (its JOBS) from the flags, or else TF_CONFIG, written to TF_CONFIG for
    the strategies. Sets job_name, task_index, address, connect_timeout (600 s under TF_CONFIG)."""
    given = dict(chief=getattr(args, "chief_host", ""), worker=args.worker_hosts, ps=args.ps_hosts)
    job, index = args.job_name, args.task_index
    from_flags = job or any(given.values()) or "TF_CONFIG" not in os.environ
    if args.connect_timeout is None:  # a cluster's pods may start minutes apart
        args.connect_timeout = 60.0 if from_flags else 600.0
    if from_flags:
        if not all(given[name] for name in jobs):
            fail("give %s (or set TF_CONFIG)" % " and ".join("--" + (
                "chief_host" if name == "chief" else name + "_hosts") for name in jobs))
        cluster = {name: given[name].replace(" ", "").split(",") for name in jobs}
    else:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec, job = dict(config["cluster"]), config["task"]["type"]
            index = int(config["task"].get("index") or 0)
            chief = [] if "chief" in jobs else list(spec.pop("chief", []))  # then: worker 0
            spec["worker"] = chief + list(spec.get("worker", []))
            if chief and job in ("chief", "worker"):
                job, index = "worker", 0 if job == "chief" else index + len(chief)
            cluster = {name: list(spec[name]) for name in jobs}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON for %s (%s: %s)"
                 % ("/".join(jobs), type(e).__name__, e))
        if job == "evaluator":
            fail("an evaluator task is not needed here: the %s evaluates; remove it from TF_CONFIG"
                 % ("chief" if "chief" in jobs else "worker 0"))
    check_cluster(cluster, job, index)
    os.environ["TF_CONFIG"] = json.dumps(dict(cluster=cluster, task=dict(type=job, index=index)))
    args.job_name, args.task_index, args.address = job, index, cluster[job][index]
    return cluster


def run_task(args, task, *task_args):
    """Load TensorFlow (bad input has failed before its start-up), run task(*task_args), and exit
    at once (the strategy's threads would keep an exit waiting); an error that ends it: one line."""
    global tf
    if os.environ.get("VERBOSE") != "1":  # before the import: TensorFlow's C++ log reports
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"  # every peer that leaves as an error
    import tensorflow as tf
    try:
        code = task(*task_args)
    except SystemExit as stop:  # fail() has said why
        code = stop.code
    except tf.errors.OpError as e:
        why = "%s: %s" % (type(e).__name__, cause(e))
        if "Could not start gRPC server" in e.message:  # gRPC could not bind the port
            why = "port %s is already in use: by an earlier run, or another program?" % args.address
        elif isinstance(e, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
            why = "%s: a peer is gone or did not answer in time" % type(e).__name__
        print("error: %s %d stopped: %s" % (args.job_name, args.task_index, why),
              file=sys.stderr, flush=True)
        code = 2
    os._exit(code)  # (every line of ours was flushed)
# <<< shared: tf2 cluster


# >>> shared: tf2 coordinated
@contextlib.contextmanager
def bounded_start(args, cluster):
    """Around ParameterServerStrategy's start, which waits for every task of the cluster without
    a bound: with no start after --connect_timeout, one line that names the silent, and exit."""
    started = threading.Event()

    def watch():
        if not wait_for(started.is_set, args.connect_timeout):
            silent = [a for hosts in cluster.values() for a in hosts if not is_listening(a)]
            print("error: %s %d stopped: the cluster has not started within %g s; silent: %s" % (
                args.job_name, args.task_index, args.connect_timeout, ",".join(silent) or "none"),
                file=sys.stderr, flush=True)
            os._exit(2)
    threading.Thread(target=watch, daemon=True).start()
    yield
    started.set()


def serve_until_gone(args, cluster, watched):
    """A task with nothing of its own to run (a ps; a worker the coordinator drives) serves until
    the task at watched has come and gone (a server never stops; its join() ignores SIGTERM): its
    port refuses a connection, or leaves them unanswered for --connect_timeout (a host that is
    down never answers; a slow link late: at 20 Mbit/s the coordinator's start-up did)."""
    role = "%s%d" % (args.job_name, args.task_index)
    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=args.job_name,
                         task_index=args.task_index, protocol="grpc", start=True)
    print("[%s] serving at %s until %s is done" % (role, args.address, watched), flush=True)
    if not wait_for(lambda: is_listening(watched), args.connect_timeout):
        fail("%s: %s did not come up within %.0f s" % (role, watched, args.connect_timeout))
    answered = time.time()
    while time.time() < answered + args.connect_timeout:
        try:
            socket.create_connection(watched.rsplit(":", 1), timeout=1).close()
            answered = time.time()
        except ConnectionRefusedError:
            break
        except OSError:  # no answer within the second, or no route for now
            pass
        time.sleep(0.25)  # the pace of the checks
    print("[%s] %s is gone; shutting down" % (role, watched), flush=True)
    return 0
# <<< shared: tf2 coordinated


# >>> shared: tf2 run
class TrainingRun(object):
    """The progress lines, and the chief's test metrics (to TensorBoard too, with the loss) and
    summary line. train() hands it the global step (a variable), test_metrics(x, y) (means over
    a batch, by name), test_set() (the batches (x, y)) and the mini-batches a step trains."""

    def __init__(self, args, cluster, global_step, test_metrics, test_set, is_chief=True,
                 minibatches_per_step=1):
        self.cluster, self.global_step, self.is_chief = cluster, global_step, is_chief
        self.test_metrics, self.test_set = test_metrics, test_set
        self.role, self.per_step = "%s%d" % (args.job_name, args.task_index), minibatches_per_step
        self.writer = tf.summary.create_file_writer(args.log_dir) if is_chief else None
        self.start_step = int(global_step.numpy())
        self.start_clock()  # again once the first step has returned: its tracing untimed
        print("[%s] training started: log_dir=%s" % (self.role, args.log_dir), flush=True)

    def start_clock(self):
        self.clock = self.last_line = (int(self.global_step.numpy()), time.time())

    def pace(self, since):  # the global step, and the mini-batches a second since (step, time)
        step = int(self.global_step.numpy())
        return step, (step - since[0]) * self.per_step / (time.time() - since[1])

    def evaluate(self, step, loss=None):
        """The test metrics, each a mean over every test example, by name; to TensorBoard."""
        totals, examples = collections.Counter(), 0
        for x, y in self.test_set():
            totals.update({name: float(v) * len(y) for name, v in self.test_metrics(x, y).items()})
            examples += len(y)
        metrics = {"test_" + name: total / examples for name, total in totals.items()}
        with self.writer.as_default(step=step):
            for tag, v in list(metrics.items()) + ([("loss", loss)] if loss is not None else []):
                tf.summary.scalar(tag, v)
        return metrics

    def progress(self, loss):  # the global step, the loss, the chief's test metrics, the pace
        step, rate = self.pace(self.last_line)
        metrics = self.evaluate(step, loss) if self.is_chief else {}
        print("[%s] global_step=%d loss=%.4f%s steps_per_sec=%.1f" % (self.role, step, loss,
              "".join(" %s=%.4f" % metric for metric in metrics.items()), rate), flush=True)
        self.last_line = (step, time.time())

    def end(self, local_steps, lost_workers=0, **extra):
        """The chief's summary line; local_steps: each worker's mini-batches (its shard's)."""
        if self.is_chief:
            step, rate = self.pace(self.clock)
            print_summary(self.role, dict(
                example=EXAMPLE, **self.evaluate(step), global_step=step,
                workers=len(self.cluster["worker"]), ps=len(self.cluster.get("ps", [])),
                lost_workers=lost_workers, local_steps=local_steps,
                updates=step - self.start_step, steps_per_sec=rate, **extra))
            self.writer.close()
        return 0
# <<< shared: tf2 run


if __name__ == "__main__":
    sys.exit(main())
