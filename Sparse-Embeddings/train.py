"""Sparse-Embeddings: a large embedding table sharded over the ps, and only the touched rows move.

What it teaches
    What parameter servers hold today: recommender and ranking models whose main parameter is an
    embedding table far larger than a mini-batch needs. A table of --rows rows of --dim numbers
    (1M x 32 = 128 MB) is cut by a partitioner into one slice per ps (sharded_over_the_ps). A
    step looks up only its rows (embedding_lookup: each slice's gather runs on its ps); their
    gradient is row-sparse (tf.IndexedSlices: ids and one row each), applied on each ps to those
    rows alone (--dense_gradients pushes the whole table instead, for comparison). Ids are hashed
    to rows, so hot ones spread over every slice; the lookup is "div" (a slice holds a range of
    rows), so a checkpoint restores into any number of ps.

The update rule (each step of worker k; asynchronous, as in ../Distributed-Setup)
    r      <- hash(ids of k's next mini-batch)       # rows of its (user, item) pairs
    v, w   <- rows r of the tables, gathered on the ps that hold them
    logit  =  <v_user, v_item> + w_user + w_item + b  # a factorization machine of order 2
    g      <- grad of the clicks' log loss: (r, one gradient row per id)
    table[r] <- table[r] - learning_rate * g         # on each ps: no other row changes

Run it
    bash run.sh                                   # 1 ps + 2 workers, a 1M x 32 table
    NUM_PS=4 bash run.sh      # a slice on each of 4 ps; by hand or TF_CONFIG: ../Distributed-Setup

Use your own data and model
    Replace the sections marked "(replace with your own)"; keep the partitioner, the lookup and an
    optimiser that updates only the rows looked up (SGD, Adagrad; Adam's moments decay them all).

References
    S. Rendle, "Factorization Machines", ICDM 2010 (the model). M. Li et al., "Scaling
    Distributed Machine Learning with the Parameter Server", OSDI 2014.
    Y. Koren et al., "Matrix Factorization Techniques for Recommender Systems", 2009 (the data).
"""
import argparse
import collections
import contextlib
import json
import os
import socket
import sys
import threading
import time

import numpy as np

tf = None  # loaded once the flags are checked: bad input fails in one line, at once
EXAMPLE = "Sparse-Embeddings"
JOBS = ("ps", "worker")  # the jobs of its cluster; deploy/ and the tests read them here


def example_flags(parser):
    parser.set_defaults(batch_size=256, steps=2000, learning_rate=5.0)  # a row's gradient: tiny
    parser.add_argument("--rows", type=positive_int, default=1000000,
                        help="rows of the embedding table: users and items, one row each")
    parser.add_argument("--dim", type=positive_int, default=32, help="numbers in a row")
    parser.add_argument("--dense_gradients", action="store_true",
                        help="for the comparison only: push dense gradients, as big as the table")


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


# >>> shared: graph batches
def training_batches(data, batch_size, worker_index, num_workers, seed):
    """The next mini-batch of training_dataset, tensors of the graph: see session_stream."""
    return session_stream(lambda session_seed: training_dataset(
        data, batch_size, worker_index, num_workers, session_seed), seed, worker_index)
# <<< shared: graph batches


# --- Model (replace with your own) ----------------------------------------------------------------
def model_params(rows, dim, seed):
    """Tables v (embeddings) and w (linear), a row per id, that sharded_over_the_ps cuts into a
    slice per ps, each slice of v seeded by its first row (else rows r, r + R/P, ... of the P
    slices start alike); and b (bias), which a partitioner leaves whole."""
    def normal(shape, dtype=tf.float32, partition_info=None):
        first_row = partition_info.single_offset(shape) if partition_info else 0
        return tf.random.stateless_normal(shape, seed=[seed, first_row], stddev=0.1, dtype=dtype)
    zeros = tf.compat.v1.zeros_initializer()
    return {"embeddings": tf.compat.v1.get_variable("embeddings", [rows, dim], initializer=normal),
            "linear": tf.compat.v1.get_variable("linear", [rows], initializer=zeros),
            "bias": tf.compat.v1.get_variable("bias", [], initializer=zeros)}


def rows_of(ids, rows):
    """Row of each id: a multiplicative hash, one to one on 0 .. rows-1 (by a prime larger than
    any table): ids numbered by popularity spread over every slice."""
    return ids * 2654435761 % rows


def model_logits(params, ids):
    """Each (user, item) pair's score: <v_user, v_item> + w_user + w_item + b."""
    r = rows_of(ids, int(params["linear"].get_shape()[0]))
    v = tf.compat.v1.nn.embedding_lookup(params["embeddings"], r, partition_strategy="div")
    w = tf.compat.v1.nn.embedding_lookup(params["linear"], r, partition_strategy="div")
    return tf.reduce_sum(v[:, 0] * v[:, 1], axis=1) + w[:, 0] + w[:, 1] + params["bias"]


def model_loss(params, ids, clicks):  # the clicks' mean log loss
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=clicks, logits=model_logits(params, ids)))


def model_metrics(params, ids, clicks):
    """The fraction of pairs on the right side of 0 (the AUC, over all pairs, comes at the end)."""
    right = tf.equal(tf.cast(model_logits(params, ids) > 0, tf.float32), clicks)
    return {"accuracy": tf.reduce_mean(tf.cast(right, tf.float32))}


# --- The algorithm --------------------------------------------------------------------------------
SparseSGD = collections.namedtuple("SparseSGD", "global_params global_step loss step push")


def build_sparse_sgd(args, cluster, ids, clicks):
    """One step of this worker on the mini-batch (ids, clicks): look the rows up, compute their
    gradient here, and push it to the slices, where only those rows change.

    replica_device_setter places the variables round-robin over the ps tasks, one
    variable op at a time: the tables are made first, so slice p of each table is on ps p.
    push: the (gradient, slice) pairs; a gradient is a tf.IndexedSlices, the rows' ids and
    values, unless --dense_gradients makes it a tensor as big as its slice.
    """
    # placement: every variable made in this scope goes to a ps task (in turn), every other op
    # to this worker
    on_the_ps = tf.compat.v1.train.replica_device_setter(
        cluster=cluster, worker_device="/job:worker/task:%d" % args.task_index)
    with tf.compat.v1.device(on_the_ps):
        with sharded_over_the_ps(cluster):  # a slice per ps: PartitionedVariables
            global_params = model_params(args.rows, args.dim, args.seed)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        loss = model_loss(global_params, ids, clicks)
        sgd = tf.compat.v1.train.GradientDescentOptimizer(args.learning_rate)
        push = sgd.compute_gradients(loss)  # one pair per slice: the gradient of its rows
        if args.dense_gradients:  # what densifying does: every row of the slice, mostly zeros
            push = [(tf.convert_to_tensor(g), part) for g, part in push]
        apply = sgd.apply_gradients(push, global_step=global_step)  # on each slice's ps
        with tf.control_dependencies([apply]):
            step = global_step.read_value()  # one update; its value: the global step after it
    return SparseSGD(global_params, global_step, loss, step, push)


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, server, data):
    ids, clicks = training_batches(data, args.batch_size, args.task_index,
                                   len(cluster["worker"]), args.seed)  # on this worker
    sgd = build_sparse_sgd(args, cluster, ids, clicks)
    worker = Worker(args, cluster, lambda x, y: model_metrics(sgd.global_params, x, y), data)
    with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):
        test_logits = model_logits(sgd.global_params, data.x_test)
        test_auc, best_auc = auc(test_logits, data.y_test), auc(data.best_scores, data.y_test)
    with worker.session(server, sgd.loss, sgd.step, last_step=args.steps, test_auc=test_auc,
                        best_auc=best_auc, rows=args.rows, dim=args.dim,
                        gradients="dense" if args.dense_gradients else "sparse") as session:
        while not session.should_stop():
            session.run(sgd.step)
    return 0


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


def main(argv=None):
    global tf
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    if args.data_path:
        fail("--data_path: this example makes its own clicks; replace make_clicks with yours")
    cluster = resolve_cluster(args)  # {"ps": [host:port, ...], "worker": [...]}, or TF_CONFIG's
    data = make_clicks(args.rows) if args.job_name == "worker" else None  # a ps needs none
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: no C++ info lines
    import tensorflow as tf  # only now: bad input has failed in one line, before its start-up
    tf.compat.v1.disable_eager_execution()  # graphs and sessions: the tf.compat.v1 runtime
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)  # no deprecation notes
    # the cluster, every task's address by job, and this task's server in it (gRPC): the ps
    # tasks' servers hold the variables, the workers' run the steps (one thread: on one machine
    # the tasks share its cores)
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), args.job_name, args.task_index,
                                  config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1))
    with errors_in_one_line(args):  # a lost peer, a timeout: one line that says so
        if args.job_name == "ps":
            return serve(args, cluster, server)  # a ps only serves, until the chief ends the run
        return train(args, cluster, server, data)


# ==================================================================================================
# Plumbing shared by every example (what a job needs besides its algorithm)
# ==================================================================================================
# train() hands it what it built (the step's tensors, the test metrics, the data): nothing here
# knows the model or the algorithm. Each block is the same text in every train.py that uses it (a
# test compares them); this file's, in order:
# flags, ps cluster, tasks, graph stream, graph test set, summary, sharded variables, ps session.
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


# >>> shared: ps cluster
def resolve_cluster(args):
    """The cluster from the flags, or else from TF_CONFIG as operators write it: a "chief" or
    "master" becomes worker 0, an "evaluator" has nothing to do. Sets job_name, task_index,
    address (this task's), and connect_timeout if not given: 60 s, or 600 s under TF_CONFIG."""
    job, index = args.job_name, args.task_index
    from_flags = job or args.ps_hosts or args.worker_hosts or "TF_CONFIG" not in os.environ
    if args.connect_timeout is None:
        args.connect_timeout = 60.0 if from_flags else 600.0
    if from_flags:
        if not args.ps_hosts or not args.worker_hosts:
            fail("give --ps_hosts and --worker_hosts (or set TF_CONFIG)")
        cluster = {"ps": args.ps_hosts.replace(" ", "").split(","),
                   "worker": args.worker_hosts.replace(" ", "").split(",")}
    else:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec, job = config["cluster"], config["task"]["type"]
            index = int(config["task"].get("index") or 0)
            chief = list(spec.get("chief", [])) + list(spec.get("master", []))
            cluster = {"ps": list(spec["ps"]), "worker": chief + list(spec.get("worker", []))}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON (%s: %s)" % (type(e).__name__, e))
        if job in ("chief", "master"):
            job, index = "worker", 0
        elif job == "worker":
            index += len(chief)  # the workers come after the chief
        elif job == "evaluator":
            print("[evaluator] nothing to do: the chief evaluates", flush=True)
            sys.exit(0)
    check_cluster(cluster, job, index)
    args.job_name, args.task_index, args.address = job, index, cluster[job][index]
    return cluster


@contextlib.contextmanager
def errors_in_one_line(args):
    """A TensorFlow error that ends this task (its port taken, a peer lost) as one line."""
    try:
        yield
    except tf.errors.OpError as e:
        if "Could not start gRPC server" in e.message:  # gRPC could not bind the port
            fail("%s %d: port %s is already in use: by an earlier run, or another program?"
                 % (args.job_name, args.task_index, args.address))
        fail("%s %d stopped: %s: %s" % (args.job_name, args.task_index, type(e).__name__,
                                        cause(e)))
# <<< shared: ps cluster


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


# >>> shared: graph stream
def session_stream(dataset, seed, worker_index):
    """The next element of dataset(session_seed), as tensors of the graph. Every session starts
    the stream anew (start_the_data), its seed drawn from seed, this worker and the global step
    at the session's start: no two workers share an order, and after a restart or a resume a
    worker does not replay the mini-batches it began with."""
    start_step = tf.compat.v1.placeholder_with_default(np.int64(0), [], name="data_start_step")
    iterator = tf.compat.v1.data.make_initializable_iterator(
        dataset((seed * 1000 + worker_index) * 1000003 + start_step))
    tf.compat.v1.add_to_collection("data_starts", (iterator.initializer, start_step))
    return iterator.get_next()


def start_the_data(session, global_step):
    """Start every training stream of the graph (session_stream), in a new session."""
    for initializer, start_step in tf.compat.v1.get_collection("data_starts"):
        session.run(initializer, {start_step: global_step})
# <<< shared: graph stream


# >>> shared: graph test set
def test_metrics_of(test_metrics, data):
    """The test set, 1000 examples a batch, x in float32 as in training: a start op, each batch's
    (size, test_metrics(x, y)) and its feeds. TFRecord files stream (they may not fit in memory;
    feeds None: to the end); arrays are fed (no graph constant, and no stream to start: fast)."""
    if hasattr(data, "test_batches"):  # Records
        iterator = tf.compat.v1.data.make_initializable_iterator(data.test_batches(1000))
        x, y = iterator.get_next()
        return iterator.initializer, (tf.shape(x)[0], test_metrics(x, y)), None
    xs, y = (tf.compat.v1.placeholder(a.dtype, (None,) + a.shape[1:])
             for a in (data.x_test, data.y_test))
    scale = getattr(data, "x_scale", None)  # a Dataset's (integer pixels), none for other ids
    x = tf.cast(xs, tf.float32) / scale if scale and data.x_test.dtype.kind in "biu" else xs
    feeds = [{xs: data.x_test[i:i + 1000], y: data.y_test[i:i + 1000]}
             for i in range(0, len(data.x_test), 1000)]
    return None, (tf.shape(x)[0], test_metrics(x, y)), feeds


def mean_over_the_test_set(session, start, batch, feeds):
    """Each test metric, a mean over a batch, averaged over every example of the test set."""
    if start is not None:
        session.run(start)
    totals, examples = collections.Counter(), 0
    for feed in iter(dict, None) if feeds is None else feeds:  # (the stream's: {} until it ends)
        try:
            size, metrics = session.run(batch, feed)
        except tf.errors.OutOfRangeError:
            break
        totals.update({name: value * size for name, value in metrics.items()})
        examples += size
    return {name: float(totals[name] / examples) for name in metrics}
# <<< shared: graph test set


# >>> shared: summary
def print_summary(role, summary):
    """The run's last line, key=value ...: what users, the tests and the benchmarks read."""
    text = lambda v: (",".join(map(str, v)) if isinstance(v, list)
                      else "%.6g" % v if isinstance(v, float) else str(v))
    print("[%s] summary %s" % (role, " ".join("%s=%s" % (k, text(v)) for k, v in summary.items())),
          flush=True)
# <<< shared: summary


# >>> shared: sharded variables
def sharded_over_the_ps(cluster, shard=True):
    """A variable scope in which each variable made is cut along its first axis into a slice per
    ps task, so that every ps holds, and every ps link carries, an equal share (replica_device_
    setter places whole variables, and one large matrix then loads one ps); shard=False: no cut."""
    partitioner = tf.compat.v1.fixed_size_partitioner(len(cluster["ps"])) if shard else None
    return tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), partitioner=partitioner)
# <<< shared: sharded variables


# >>> shared: ps session
def run_over_flag(ps_index):
    """A flag on each ps that the chief raises when the run is over: each ps reads its own."""
    with tf.compat.v1.device("/job:ps/task:%d" % ps_index):
        return tf.compat.v1.Variable(False, collections=[], name="run_over_%d" % ps_index)


def serve(args, cluster, server):
    """A ps serves until the chief says the run is over (a TensorFlow server never ends by
    itself). One whose flag no chief has set up within --connect_timeout, while the chief's port
    stays closed, served no one: an error (a chief that listens may be building a large graph).
    The flag has the same name in every task's graph, so the ps reads what the chief writes."""
    index, chief = args.task_index, cluster["worker"][0]
    with tf.Graph().as_default():
        run_over = run_over_flag(index)
        set_up = tf.compat.v1.is_variable_initialized(run_over)
        session = tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(
            device_filters=["/job:ps/task:%d" % index]))  # this ps alone: nothing else to wait for
    print("[ps%d] serving %d worker(s) at %s" % (index, len(cluster["worker"]), args.address),
          flush=True)
    while not wait_for(lambda: session.run(set_up), args.connect_timeout, waiting=lambda: (
            "[ps%d] waiting for the chief (worker0) at %s" % (index, chief))):
        if not is_listening(chief):
            fail("ps%d: no chief at %s within %g s: this ps served no one"
                 % (index, chief, args.connect_timeout))
    wait_for(lambda: session.run(run_over))
    print("[ps%d] the run is over; shutting down" % index, flush=True)
    return 0


class Hook(object):
    """A SessionRunHook that does nothing but the methods given, as Hook(end=f) (TensorFlow
    loads after the flags are checked, so no class here derives from its own)."""
    begin = after_create_session = before_run = after_run = end = lambda *args: None

    def __init__(self, **methods):
        self.__dict__.update(methods)


class Worker(Hook):
    """This worker's part of the run besides its algorithm, handed test_metrics(x, y) and the
    data. session() is TensorFlow's MonitoredSession with this object its session creator and a
    hook (progress, the chief's test metrics, the watchdog, the end). The run's status lives on
    ps 0, never checkpointed: for each worker NOT_STARTED, TRAINING, or its local steps once
    finished (the chief's last read written back if ps 0 restarts)."""
    NOT_STARTED, TRAINING = -2, -1

    def __init__(self, args, cluster, test_metrics, data, steps_per_update=1):
        self.args, self.cluster, self.steps_per_update = args, cluster, steps_per_update
        self.role, self.is_chief = "worker%d" % args.task_index, args.task_index == 0
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        workers = len(cluster["worker"])
        with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):
            self.test_set = test_metrics_of(test_metrics, data)
            self.seen = tf.compat.v1.placeholder_with_default(
                np.full(workers, self.NOT_STARTED, np.int64), [workers])
            self.mine = tf.compat.v1.placeholder(tf.int64, [1])
        with tf.compat.v1.device("/job:ps/task:0"):
            self.status = tf.compat.v1.Variable(self.seen, collections=[], name="run_status")
        self.set_mine = tf.compat.v1.scatter_update(self.status, [args.task_index], self.mine)
        self.run_over = [run_over_flag(k) for k in range(len(cluster["ps"]))]
        self.end_run = tf.group([flag.assign(True) for flag in self.run_over])
        self.local_steps, self.sessions, self.status_seen, self.start_step = 0, 0, None, None
        self.watching = self.ps_lost = self.kept_variables = False

    def session(self, server, loss, update, last_step=None, hooks=(), minibatches_per_update=1,
                **summary):
        """The session on server, with TensorFlow's StopAtStepHook at last_step (None: the
        example stops itself), the example's hooks, and the chief's CheckpointSaverHook (as a
        session starts, every 30 s, at the end). update: a step's tensor, its value the global
        step after it; loss: the step's, or a placeholder it feeds; summary: the example's fields
        of the summary line (values, tensors or functions)."""
        self.server, self.loss, self.update, self.last_step = server, loss, update, last_step
        self.minibatches_per_update, self.summary = minibatches_per_update, summary
        self.saver = tf.compat.v1.train.Saver()  # every global variable; the save runs here
        variables = tf.compat.v1.global_variables()  # by ps: what a restarted one lacks
        self.by_ps = [(ps[5:].replace("/task:", ""), tf.compat.v1.report_uninitialized_variables(
            mine), tf.compat.v1.train.Saver(mine), tf.compat.v1.variables_initializer(mine))
            for ps in sorted({v.device for v in variables})
            for mine in [[v for v in variables if v.device == ps]]]
        self.set_up = [(tf.compat.v1.is_variable_initialized(v), v.initializer)
                       for v in [self.status] + self.run_over]
        everything = variables + tf.compat.v1.local_variables() + [self.status] + self.run_over
        self.scaffold = tf.compat.v1.train.Scaffold(
            saver=self.saver, ready_op=tf.compat.v1.report_uninitialized_variables(everything))
        hooks = ([tf.compat.v1.train.StopAtStepHook(last_step=last_step)] if last_step else []
                 ) + list(hooks) + [Hook(end=self.wait_for_the_others)]
        if self.is_chief:
            print("[worker0] chief: log_dir=%s" % self.args.log_dir, flush=True)
            self.writer = tf.compat.v1.summary.FileWriterCache.get(self.args.log_dir)
            hooks.append(tf.compat.v1.train.CheckpointSaverHook(
                self.args.log_dir, save_secs=30, saver=self.saver))
        return tf.compat.v1.train.MonitoredSession(session_creator=self, hooks=hooks + [self])

    def create_session(self):
        """SessionManager's start-up, as TensorFlow's ChiefSessionCreator and WorkerSessionCreator
        make it, with two defaults corrected: the chief's prepare_session gets no checkpoint_dir
        (it would restore whenever a checkpoint exists, even over a ps that kept the run) but
        init_fn=restore_where_lost; the others' wait_for_session checks every second, not every
        30 s, for at most --connect_timeout. MonitoredSession calls it again after a step lost
        to a restarted task (Aborted, Unavailable)."""
        args, role = self.args, self.role
        self.watching = False  # waiting for the ps, or the chief, is no stuck step
        if self.sessions:
            print("[%s] lost a step to a restart: a new session" % role, flush=True)
        silent = lambda: [ps for ps in self.cluster["ps"] if not is_listening(ps)]
        if not wait_for(lambda: not silent(), args.connect_timeout, waiting=lambda: (
                "[%s] waiting for the ps at %s" % (role, ",".join(silent())))):
            fail("%s: cannot reach the ps at %s: is it running?" % (role, ",".join(silent())))
        self.scaffold.finalize()  # the graph is whole: a loop that adds ops would grow forever
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self.scaffold.local_init_op, ready_op=self.scaffold.ready_op,
            ready_for_local_init_op=self.scaffold.ready_for_local_init_op, recovery_wait_secs=1)
        # filter devices, or the session waits for every worker to answer, even those that left
        config = tf.compat.v1.ConfigProto(device_filters=[
            "/job:ps", "/job:worker/task:%d" % args.task_index], intra_op_parallelism_threads=1)
        if self.is_chief:
            session = manager.prepare_session(self.server.target, config=config,
                                              init_fn=self.restore_where_lost)
        else:
            try:
                session = manager.wait_for_session(self.server.target, config=config,
                                                   max_wait_secs=args.connect_timeout)
            except tf.errors.DeadlineExceededError:
                fail("%s: the chief has not set the variables up after %g s"
                     % (role, args.connect_timeout))
        self.step = int(session.run(self.global_step))  # this session's start
        start_the_data(session, self.step)  # an order of this session's
        self.rejoining = self.sessions > 0 or (  # in the run before: a restarted task
            session.run(self.status)[args.task_index] != self.NOT_STARTED)
        session.run(self.set_mine, {self.mine: [self.TRAINING]})
        self.sessions += 1
        return session

    def restore_where_lost(self, session):
        """The chief's init_fn: the status and run-over flags set up where missing; each ps that
        lacks its variables (a new run, a ps restarted) gets the latest checkpoint's, or with
        none their initial values; a ps that kept them goes on (a restarted chief too)."""
        for is_set_up, initializer in self.set_up:
            if not session.run(is_set_up):
                session.run(initializer, {} if self.status_seen is None else {
                    self.seen: self.status_seen})
        lost = [(ps, saver, init) for ps, missing, saver, init in self.by_ps
                if len(session.run(missing))]
        checkpoint, self.kept_variables = tf.train.latest_checkpoint(self.args.log_dir), not lost
        for ps, saver, init in lost:
            saver.restore(session, checkpoint) if checkpoint else session.run(init)
        lost_ps = ",".join(ps for ps, _, _ in lost) if len(lost) < len(self.by_ps) else ""
        if lost_ps and not checkpoint:
            print("[worker0] %s lost its variables, and %s holds no checkpoint: they start "
                  "again from their initial values" % (lost_ps, self.args.log_dir), flush=True)
        elif lost and checkpoint:
            print("[worker0] resuming from the checkpoint at global step %d%s" % (session.run(
                self.global_step), " on " + lost_ps if lost_ps else ""), flush=True)
        elif not lost and not self.sessions:
            print("[worker0] resuming at global step %d: the ps kept the variables"
                  % session.run(self.global_step), flush=True)

    def after_create_session(self, session, coord):
        """The clock starts with the first session that came up; one that finds the run over
        stops."""
        if self.start_step is None:
            self.start_step = self.timed_from = self.step
            self.clock = time.time()
            print("[%s] training started" % self.role, flush=True)
            threading.Thread(target=self.watch, daemon=True).start()
        self.over = bool(self.last_step) and self.step >= self.last_step
        if self.over:
            coord.request_stop()  # (StopAtStepHook looks only after a step)

    def before_run(self, run_context):
        """A run of the update fetches its value (the global step after it) and the loss. A
        run that MonitoredSession retries in a new session that found the run over ends it
        instead: run again, it would land past last_step."""
        if self.over:
            raise tf.errors.OutOfRangeError(None, None, "the run is over")  # a clean end
        fetches = run_context.original_args.fetches
        self.updating = fetches is self.update or any(
            fetch is self.update for fetch in tf.nest.flatten(fetches))
        if self.updating:
            return tf.compat.v1.train.SessionRunArgs((self.update, self.loss))

    def after_run(self, run_context, run_values):
        """Count the update; stop at last_step as it returns (StopAtStepHook's own read of the
        global step may be an older one); a progress line every --log_every local steps."""
        if not self.updating:
            return
        self.last_run, self.watching, self.ps_lost = time.time(), True, False
        before, self.local_steps = self.local_steps, self.local_steps + self.steps_per_update
        self.step, loss = int(run_values.results[0]), float(run_values.results[1])
        if self.last_step and self.step >= self.last_step:
            run_context.request_stop()
        if before == 0:  # the clock starts as the first update returns
            self.clock, self.timed_from = time.time(), self.step
            self.progress = (before, self.clock)
        if before // self.args.log_every == self.local_steps // self.args.log_every:
            return
        rate = (self.local_steps - self.progress[0]) / (time.time() - self.progress[1])
        line = "[%s] local_step=%d global_step=%d loss=%.4f" % (
            self.role, self.local_steps, self.step, loss)
        if self.is_chief:
            for name, value in self.evaluate(run_context.session, loss).items():
                line += " test_%s=%.4f" % (name, value)
            self.status_seen = run_context.session.run(self.status)  # written back if ps 0 restarts
        print(line + " steps_per_sec=%.1f" % rate, flush=True)
        self.progress = (self.local_steps, time.time())

    def evaluate(self, session, loss=None):
        """The test metrics over the test set, to TensorBoard too (with the loss, if given)."""
        metrics = mean_over_the_test_set(session, *self.test_set)
        values = [("test_" + name, value) for name, value in metrics.items()]
        self.writer.add_summary(tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=tag, simple_value=value) for tag, value in
            values + ([("loss", loss)] if loss is not None else [])]), self.step)
        return metrics

    def watch(self):
        """The watchdog: a worker whose step has not returned for --watchdog seconds ends its
        process, for a restart policy to start it again (a step that a peer's restart left
        waiting may never return). Once a ps is lost, the wait for it to come back (in the
        step, in gRPC's back-off, in a new session's start-up) has --connect_timeout."""
        while True:
            time.sleep(1)
            if not all(is_listening(ps) for ps in self.cluster["ps"]):
                self.ps_lost = True  # until the next step returns (after_run)
            flag = "--connect_timeout: a ps was lost" if self.ps_lost else "--watchdog"
            limit = self.args.connect_timeout if self.ps_lost else self.args.watchdog
            if self.watching and time.time() > self.last_run + limit:
                print("error: %s completed no step for %g s (%s): exiting, so that it can be "
                      "restarted" % (self.role, limit, flag), file=sys.stderr, flush=True)
                os._exit(2)  # sys.exit would wait for the stuck step

    def wait_for_the_others(self, session):
        """Before the chief's last checkpoint: this worker's local steps into the run's status;
        the chief then waits until every other worker has finished, has closed its port while
        TRAINING (lost), or, NOT_STARTED, has not started within --connect_timeout."""
        self.watching = False
        session.run(self.set_mine, {self.mine: [self.local_steps]})
        workers, my_end = self.cluster["worker"], time.time()

        def still_to_come():
            late = time.time() > my_end + self.args.connect_timeout
            self.status_seen = session.run(self.status)
            return [k for k, s in enumerate(self.status_seen) if s == self.TRAINING and
                    is_listening(workers[k]) or s == self.NOT_STARTED and not late]
        if self.is_chief:
            wait_for(lambda: not still_to_come(), waiting=lambda: "[worker0] waiting for "
                     "worker(s) %s to finish" % ",".join(map(str, still_to_come())))

    def end(self, session):
        """The chief's summary line, with the example's fields, once the others have finished and
        CheckpointSaverHook has saved; then the run is over: every ps's flag raised."""
        if self.is_chief:
            seconds = time.time() - self.clock  # the training's: not the last evaluation
            self.step, status = int(session.run(self.global_step)), self.status_seen
            summary = dict(example=EXAMPLE)
            summary.update(("test_" + n, v) for n, v in self.evaluate(session).items())
            lost = sum(s < 0 for s in status)  # TRAINING or NOT_STARTED
            if lost:
                print("[worker0] %d worker(s) failed, were lost or never started" % lost)
            summary.update(global_step=self.step, workers=len(status), ps=len(self.cluster["ps"]),
                           lost_workers=lost, local_steps=[max(int(s), -1) for s in status],
                           updates=self.step - self.start_step, steps_per_sec=(
                               self.step - self.timed_from) * self.minibatches_per_update / seconds)
            for key, value in self.summary.items():  # a value, a tensor, or a function
                value = value() if callable(value) else value
                summary[key] = float(session.run(value)) if tf.is_tensor(value) else value
            print_summary(self.role, summary)
            self.writer.flush()
            session.run(self.end_run)  # the ps tasks end now
        print("[%s] done: local_steps=%d" % (self.role, self.local_steps), flush=True)
# <<< shared: ps session


if __name__ == "__main__":
    sys.exit(main())
