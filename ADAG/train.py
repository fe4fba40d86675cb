"""ADAG (AGN): workers push their accumulated parameter change divided by the window.

What it teaches
    A fix for what goes wrong when DOWNPOUR's window grows. A worker trains its own copy of
    the parameters (local_params) for a window of mini-batches, as in DOWNPOUR, but what it
    pushes is the change it made, divided by the window: the mean of its local updates. The
    ps simply adds that to the global parameters; it has no optimizer and no learning rate.
    Without the division, every push would be window times as large, and with several workers
    pushing such large, stale updates the model diverges; with it, a push is the size of one
    SGD step, pointed along a direction averaged over window mini-batches. The price is that
    a worker's progress beyond that mean is discarded at the next pull.

    The name: dist-keras (Hermans, CERN) implements this as class ADAG; Hermans' paper and
    thesis call it Accumulated Gradient Normalization, AGN. (The thesis later uses "ADAG" for
    a different, distance-scaled method.)

The update rule (worker k; the global step counts pushes)
    local_params <- pull global_params                       # once, when the worker starts
    repeat:
        pulled_params <- local_params                        # where this window starts
        window times:                                        # on the worker, no network
            g <- grad L(local_params; next mini-batch of k)
            local_params <- local_params - learning_rate * g
        push: global_params <- global_params + (local_params - pulled_params) / window
              global_step   <- global_step + 1               # on the ps: a plain add
        pull: local_params  <- global_params

Run it
    bash run.sh                          # 1 ps + 2 workers on free localhost ports
    NUM_WORKERS=4 bash run.sh --window 20 --learning_rate 0.5
    By hand, one terminal per task, on one machine or several (the same flags but the role):
      H="--ps_hosts h0:2222 --worker_hosts h1:2222,h2:2222"
      python train.py --job_name ps --task_index 0 $H       # on h0
      python train.py --job_name worker --task_index 0 $H   # on h1: the chief
      python train.py --job_name worker --task_index 1 $H   # on h2
    Or set TF_CONFIG and give no cluster flags. --steps counts mini-batch steps of all workers
    together, as in every example; since the global step counts pushes, training stops once
    the global step reaches steps / window.

Use your own model
    Edit the two sections marked "(replace with your own)": Data and Model. build_adag only
    needs the parameters and a loss; any local optimizer works, since the push is the change
    it made (local_params - pulled_params), not its gradients.

References
    J. Hermans, G. Spanakis, R. Wiggers, "Accumulated Gradient Normalization", ACML 2017,
    arXiv:1710.02368; J. Hermans, "On Scalable Deep Learning and Parallelizing Gradient
    Descent", master thesis, Maastricht University 2017; dist-keras (github.com/cerndb/dist-keras).
    J. Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012 (DOWNPOUR, the baseline).
"""
import argparse
import collections
import json
import os
import socket
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: hide TensorFlow's C++ info
import numpy as np
import tensorflow as tf

EXAMPLE = "ADAG"


# ==================================================================================================
# Flags and cluster
# ==================================================================================================
# >>> shared: flags
class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):
        fail(message + " (see --help)")


def fail(message):
    """Stop with one line on stderr and exit status 2: for bad input, never for bugs."""
    print("error: " + message, file=sys.stderr, flush=True)
    sys.exit(2)


def common_flags(description):
    """The flags every example shares; an example adds its own to the parser this returns."""
    p = OneLineErrorParser(description=description,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=2000,
                   help="mini-batch steps to train, summed over all workers")
    p.add_argument("--batch_size", type=int, default=64, help="examples per mini-batch")
    p.add_argument("--learning_rate", type=float, default=0.1,
                   help="learning rate of the workers' optimizer")
    p.add_argument("--hidden", type=int, default=128, help="width of the MLP's hidden layer")
    p.add_argument("--dataset", default="digits", help="digits (bundled, offline) or mnist")
    p.add_argument("--data_path", default="", help="a local mnist.npz (else mnist downloads)")
    p.add_argument("--log_dir", default="",
                   help="checkpoints and TensorBoard summaries; an existing one resumes "
                        "(default: a new logs/<time> folder beside train.py)")
    p.add_argument("--seed", type=int, default=0, help="seed of initial weights and shuffling")
    p.add_argument("--metrics_file", default="", help="also write the summary here, as JSON")
    p.add_argument("--log_every", type=int, default=100, help="progress every N local steps")
    p.add_argument("--eval_every", type=int, default=200,
                   help="test accuracy every N local steps of the chief (0: at the end only)")
    return p


def check_common_flags(args):
    """Reject bad values before any server starts, so every task fails alike and at once."""
    for name in ("steps", "batch_size", "learning_rate", "hidden", "log_every"):
        if getattr(args, name) <= 0:
            fail("--%s must be positive, got %s" % (name, getattr(args, name)))
    if args.eval_every < 0:
        fail("--eval_every must be 0 (only at the end) or positive, got %d" % args.eval_every)
    if args.dataset not in ("digits", "mnist"):
        fail("unknown dataset %r: use digits or mnist" % args.dataset)
# <<< shared: flags


def adag_flags(parser):
    # A push moves the ps by the mean of the window's local updates, about one SGD step for
    # window mini-batches: a larger local learning rate than plain SGD's 0.1 makes up for it.
    parser.set_defaults(learning_rate=0.5)
    parser.add_argument("--window", type=int, default=5,
                        help="local mini-batch steps between two pushes; each push is divided "
                             "by it")
    parser.epilog = ("--steps counts mini-batch steps of all workers together; the global "
                     "step counts pushes, so training stops once it reaches steps / window.")


def check_adag_flags(args):
    if args.window <= 0:
        fail("--window must be positive, got %d" % args.window)


# >>> shared: cluster
def cluster_flags(parser):
    parser.add_argument("--job_name", default="", help="ps or worker (or set TF_CONFIG)")
    parser.add_argument("--task_index", type=int, default=0, help="this task's index in its job")
    parser.add_argument("--ps_hosts", default="", help="comma-separated host:port of ps tasks")
    parser.add_argument("--worker_hosts", default="", help="comma-separated host:port of workers")
    parser.add_argument("--connect_timeout", type=float, default=60,
                        help="seconds to wait for the other tasks of the cluster")


def parse_hosts(flag, text):
    hosts = [h.strip() for h in text.split(",")]
    for h in hosts:
        host, _, port = h.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            fail("%s: %r is not host:port (for example localhost:2222)" % (flag, h))
    return hosts


def resolve_cluster(args):
    """Return (cluster, job name, task index) from the flags or else from TF_CONFIG.

    TF_CONFIG is the JSON that Kubernetes operators (Kubeflow's TFJob) give every task:
    {"cluster": {"ps": [...], "worker": [...]}, "task": {"type": "worker", "index": 0}}.
    A "chief" task, if there is one, becomes worker 0 and the workers follow it.
    """
    if args.job_name or args.ps_hosts or args.worker_hosts or "TF_CONFIG" not in os.environ:
        if not args.ps_hosts or not args.worker_hosts:
            fail("give --ps_hosts and --worker_hosts (or set TF_CONFIG)")
        cluster = {"ps": parse_hosts("--ps_hosts", args.ps_hosts),
                   "worker": parse_hosts("--worker_hosts", args.worker_hosts)}
        job, index = args.job_name, args.task_index
    else:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec, task = config["cluster"], config["task"]
            job, index = task["type"], int(task.get("index", 0))
            chief = list(spec.get("chief", []))
            cluster = {"ps": list(spec["ps"]), "worker": chief + list(spec.get("worker", []))}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON (%s: %s)" % (type(e).__name__, e))
        if job == "chief":
            job, index = "worker", 0
        elif job == "worker":
            index += len(chief)
        for name in ("ps", "worker"):
            parse_hosts("TF_CONFIG cluster." + name, ",".join(cluster[name]))
    if job not in ("ps", "worker"):
        fail("unknown job name %r: use ps or worker" % job)
    if not 0 <= index < len(cluster[job]):
        fail("task index %d is out of range: the %s job has %d task(s), 0..%d"
             % (index, job, len(cluster[job]), len(cluster[job]) - 1))
    return cluster, job, index


def start_server(cluster, job, index):
    """Start this task's gRPC server; one clear line if its port is taken."""
    port = int(cluster[job][index].rpartition(":")[2])
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("", port))
    except OSError:
        fail("port %d (%s %d) is already in use: is an earlier run still going?" % (port, job, index))
    finally:
        probe.close()
    # one thread per op is plenty for this model and leaves the cores to the other processes
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
    try:
        return tf.compat.v1.train.Server(tf.compat.v1.train.ClusterSpec(cluster), job_name=job,
                                         task_index=index, config=config, start=True)
    except tf.errors.UnknownError:
        fail("could not start a server on port %d (%s %d): is it in use?" % (port, job, index))


def is_listening(address):
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def wait_until_listening(addresses, what, timeout):
    """Wait for servers to accept connections, or fail with a line naming the missing one."""
    deadline = time.time() + timeout
    for i, address in enumerate(addresses):
        while not is_listening(address):
            if time.time() > deadline:
                fail("cannot reach %s %d at %s after %.0f s: is it running? (check the host list)"
                     % (what, i, address, timeout))
            time.sleep(0.2)  # back-off between connection attempts
# <<< shared: cluster


# >>> shared: sessions
def session_config(task_index):
    """The config of every worker session: it sees only the ps tasks and this worker.

    Without the filter a worker's session waits for every task in the cluster, including
    workers that have already finished and left.
    """
    return tf.compat.v1.ConfigProto(
        device_filters=["/job:ps", "/job:worker/task:%d" % task_index],
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)


class FastWorkerSessionCreator(tf.compat.v1.train.SessionCreator):
    """What MonitoredTrainingSession does on non-chief workers, but polling every 0.25 s.

    The stock creator checks whether the chief has initialised the model only every 30 s, so
    in a short run the other workers would join long after the chief started training.
    """

    def __init__(self, master, config, max_wait_secs):
        self.master, self.config, self.max_wait_secs = master, config, max_wait_secs
        self.scaffold = tf.compat.v1.train.Scaffold()

    def create_session(self):
        self.scaffold.finalize()
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self.scaffold.local_init_op, ready_op=self.scaffold.ready_op,
            ready_for_local_init_op=self.scaffold.ready_for_local_init_op,
            graph=tf.compat.v1.get_default_graph(), recovery_wait_secs=0.25)
        try:
            return manager.wait_for_session(self.master, config=self.config,
                                            max_wait_secs=self.max_wait_secs)
        except tf.errors.DeadlineExceededError:
            fail("the chief (worker 0) did not initialise the model within %.0f s"
                 % self.max_wait_secs)


def training_session(args, server, is_chief, hooks, chief_only_hooks=()):
    """A MonitoredSession; on the chief it also initialises or restores, saves and summarises."""
    config = session_config(args.task_index)
    if is_chief:
        return tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=True, checkpoint_dir=args.log_dir, hooks=hooks,
            chief_only_hooks=list(chief_only_hooks), save_checkpoint_secs=30,
            save_summaries_steps=args.log_every, log_step_count_steps=args.log_every,
            config=config, stop_grace_period_secs=5)
    creator = FastWorkerSessionCreator(server.target, config, args.connect_timeout)
    return tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=hooks,
                                               stop_grace_period_secs=5)
# <<< shared: sessions


# ==================================================================================================
# Data (replace with your own)
# ==================================================================================================
# >>> shared: data
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test pixel_max")


def load_dataset(name, data_path=""):
    """Handwritten digits as integer pixels and labels, with a fixed train/test split.

    digits: scikit-learn's bundled 8x8 images (1797), offline; a fixed 20% is the test set.
    mnist:  28x28 images (70000) from a local .npz (keys x_train, y_train, x_test, y_test),
            or downloaded once by tf.keras.datasets into ~/.keras/datasets.
    """
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        digits = load_digits()
        x_train, x_test, y_train, y_test = train_test_split(
            digits.data.astype(np.uint8), digits.target.astype(np.int64),
            test_size=0.2, random_state=0, stratify=digits.target)
        return Dataset(x_train, y_train, x_test, y_test, pixel_max=16)
    if name == "mnist":
        try:
            if data_path:
                with np.load(data_path) as f:
                    x_train, y_train, x_test, y_test = (
                        f["x_train"], f["y_train"], f["x_test"], f["y_test"])
            else:
                (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
        except Exception as e:  # a missing file or no network: say which, in one line
            fail("could not load MNIST (%s: %s); pass --data_path to a local mnist.npz"
                 % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
        flat = lambda x: x.reshape(len(x), -1).astype(np.uint8)
        return Dataset(flat(x_train), y_train.astype(np.int64), flat(x_test),
                       y_test.astype(np.int64), pixel_max=255)
    fail("unknown dataset %r: use digits or mnist" % name)


def scale(pixels, pixel_max):
    return tf.cast(pixels, tf.float32) / float(pixel_max)


def training_batches(data, batch_size, worker_index, num_workers, seed):
    """This worker's endless stream of mini-batches, built in the graph (no feed_dict).

    Each worker takes its own shard of the training set, so no two workers train on the same
    example, and reshuffles it every epoch, so every step sees a new batch.
    """
    ds = tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
    ds = ds.shard(num_workers, worker_index)
    ds = ds.shuffle(len(data.x_train) // num_workers + 1, seed=seed * 1000 + worker_index,
                    reshuffle_each_iteration=True)
    ds = ds.repeat().batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda x, y: (scale(x, data.pixel_max), y)).prefetch(2)
    return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
# <<< shared: data


# ==================================================================================================
# Model (replace with your own)
# ==================================================================================================
# >>> shared: model
def model_params(num_features, hidden, seed, num_classes=10):
    """The MLP's variables, created under the current device scope (the ps, in the examples)."""
    glorot = lambda i: tf.compat.v1.glorot_uniform_initializer(seed=seed * 10 + i)
    zeros = tf.compat.v1.zeros_initializer()
    return collections.OrderedDict([
        ("w1", tf.compat.v1.get_variable("w1", [num_features, hidden], initializer=glorot(1))),
        ("b1", tf.compat.v1.get_variable("b1", [hidden], initializer=zeros)),
        ("w2", tf.compat.v1.get_variable("w2", [hidden, num_classes], initializer=glorot(2))),
        ("b2", tf.compat.v1.get_variable("b2", [num_classes], initializer=zeros)),
    ])


def model_loss_and_accuracy(params, x, y):
    hidden = tf.nn.relu(tf.matmul(x, params["w1"]) + params["b1"])
    logits = tf.matmul(hidden, params["w2"]) + params["b2"]
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    return loss, accuracy
# <<< shared: model


# ==================================================================================================
# The algorithm
# ==================================================================================================
Adag = collections.namedtuple("Adag", "global_params local_params pulled_params global_step "
                              "loss local_step push pull push_and_pull staleness_sum")


def build_adag(args, cluster, x, y):
    """ADAG's ops for this worker, on the mini-batch stream (x, y).

    local_step     one SGD step on local_params with the next mini-batch. Runs on this worker.
    push           global_params += (local_params - pulled_params) / window on the ps, and the
                   push is counted in global_step.
    pull           local_params <- global_params and pulled_params <- global_params.
    push_and_pull  both, in that order, in one session run; its value is the global step.
    Only local_step reads (x, y), so only local_step consumes mini-batches.
    """
    worker = "/job:worker/task:%d" % args.task_index
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            cluster=tf.compat.v1.train.ClusterSpec(cluster), worker_device=worker)):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        global_params = model_params(int(x.shape[1]), args.hidden, args.seed)
    with tf.compat.v1.device(worker):
        # The initial values are read from the ps. Each worker's session initialises its local
        # variables only once the chief has initialised the global ones (the session manager's
        # ready_for_local_init_op): a real barrier, so every worker starts from the ps.
        # One read serves both, so that the first window starts with local = pulled even if
        # another worker pushes while this one initialises.
        start = collections.OrderedDict((n, p.read_value()) for n, p in global_params.items())
        local_params = worker_variables("local", start, lambda value: value)
        pulled_params = worker_variables("pulled", start, lambda value: value)
        loss = model_loss_and_accuracy(local_params, x, y)[0]
        gradients = tf.gradients(loss, list(local_params.values()))
        with tf.control_dependencies([p.assign_sub(args.learning_rate * g, read_value=False)
                                      for p, g in zip(local_params.values(), gradients)]):
            local_step = tf.identity(loss, name="local_step")
        # accumulated gradient normalisation: the mean of the window's local updates
        normalised_change = [(local.read_value() - pulled.read_value()) / float(args.window)
                             for local, pulled in zip(local_params.values(),
                                                      pulled_params.values())]

    # the ps adds the change as it comes: no optimizer, no learning rate, no lock beyond the
    # variable's own (assign_add is atomic per variable)
    add_on_ps = [theta.assign_add(change, read_value=False)
                 for theta, change in zip(global_params.values(), normalised_change)]
    with tf.control_dependencies(add_on_ps):
        count = global_step.assign_add(1, read_value=False)
    with tf.control_dependencies([count]):
        push = global_step.read_value()

    def copy_global_to_local():  # one read per parameter, so local and pulled are the same
        copies = []
        for name, theta in global_params.items():
            value = theta.read_value()
            copies += [local_params[name].assign(value, read_value=False),
                       pulled_params[name].assign(value, read_value=False)]
        return tf.group(*copies)
    pull = copy_global_to_local()
    with tf.control_dependencies([push]):
        pulled = copy_global_to_local()
    # Staleness of a push: how many pushes of other workers landed on the ps between this
    # worker's last pull and this push. One scalar a window; the sum lives beside global_step.
    with tf.compat.v1.device(worker):
        step_at_pull = tf.compat.v1.Variable(
            global_step.read_value(), trainable=False, name="step_at_pull",
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
    with tf.compat.v1.device(global_step.device):
        staleness_sum = tf.compat.v1.get_variable(
            "staleness_sum", [], tf.int64, tf.compat.v1.zeros_initializer(), trainable=False)
    with tf.control_dependencies([pulled]):
        counted = staleness_sum.assign_add(push - step_at_pull.read_value() - 1,
                                           read_value=False)
    with tf.control_dependencies([counted]):
        push_and_pull = tf.identity(step_at_pull.assign(push))
    return Adag(global_params, local_params, pulled_params, global_step, loss, local_step, push,
                pull, push_and_pull, staleness_sum)


def worker_variables(prefix, like, initial_value):
    """One variable on this worker per parameter in like, named prefix_<name>.

    They go in LOCAL_VARIABLES, not in the global ones: each worker's session initialises its
    own (after the chief has initialised the globals), and checkpoints leave them out.
    """
    return collections.OrderedDict(
        (name, tf.compat.v1.Variable(initial_value(param), trainable=False,
                                     name="%s_%s" % (prefix, name),
                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES]))
        for name, param in like.items())


# ==================================================================================================
# Training loop
# ==================================================================================================
def train(args, cluster, server):
    task, role = args.task_index, "worker%d" % args.task_index
    is_chief, num_workers = task == 0, len(cluster["worker"])
    data = load_dataset(args.dataset, args.data_path)
    with tf.compat.v1.device("/job:worker/task:%d" % task):
        x, y = training_batches(data, args.batch_size, task, num_workers, args.seed)
    adag = build_adag(args, cluster, x, y)
    with tf.compat.v1.device("/job:worker/task:%d" % task):
        test_accuracy = model_loss_and_accuracy(
            adag.global_params, scale(data.x_test, data.pixel_max), data.y_test)[1]
    shutdown = Shutdown(cluster, task)
    wait_until_listening(cluster["ps"], "ps", args.connect_timeout)

    start_step, history = 0, []
    if is_chief:
        if tf.train.latest_checkpoint(args.log_dir):
            start_step = int(tf.train.load_variable(args.log_dir, "global_step"))
            print("[%s] resuming from the checkpoint at global step %d" % (role, start_step))
        print("[%s] chief: log_dir=%s" % (role, args.log_dir), flush=True)
        writer = tf.compat.v1.summary.FileWriterCache.get(args.log_dir)

    def summarise(tag, value, step):
        writer.add_summary(tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(
            tag=tag, simple_value=value)]), step)

    def record_test_accuracy(session, step, elapsed):
        accuracy = float(session.run(test_accuracy))
        history.append([round(elapsed, 3), int(step), accuracy])
        summarise("test_accuracy", accuracy, step)
        return accuracy

    def window_of_local_steps(step_context):
        # The raw session, without the hooks: they would read the global step from the ps at
        # every local step, the very traffic the window is there to save.
        for _ in range(args.window):
            loss_value = step_context.session.run(adag.local_step)
        return loss_value

    def crossed(every):  # did the last window pass a multiple of every local steps?
        return every and local_step // every > (local_step - args.window) // every

    # the global step counts pushes: --steps mini-batches of all workers are steps/window pushes
    last_push = -(-args.steps // args.window)
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=last_push)]
    peers = WaitForOtherWorkersHook(shutdown, cluster, args.connect_timeout)
    local_step, ok, started = 0, False, time.time()
    try:
        with training_session(args, server, is_chief, hooks, [peers]) as sess:
            print("[%s] training started" % role, flush=True)
            # the first window also sets the graph up on every server: untimed
            sess.run_step_fn(window_of_local_steps)
            sess.run(adag.push_and_pull)
            local_step = logged_step = args.window
            train_started = last_time = time.time()
            while not sess.should_stop():
                loss_value = sess.run_step_fn(window_of_local_steps)
                step = sess.run(adag.push_and_pull)
                local_step += args.window
                if crossed(args.log_every):
                    now = time.time()
                    progress(role, local_step, step, loss_value,
                             (local_step - logged_step) / (now - last_time))
                    logged_step, last_time = local_step, now
                    if is_chief:
                        summarise("local_loss", loss_value, step)
                if is_chief and crossed(args.eval_every):
                    sess.run_step_fn(lambda step_context: record_test_accuracy(
                        step_context.session, step, time.time() - started))  # no hooks
            train_seconds = time.time() - train_started
        ok = True
    finally:
        shutdown.leave(server, local_step if ok else FAILED)
    if not is_chief:
        print("[%s] done: local_steps=%d" % (role, local_step), flush=True)
        return 0

    # The other workers have left (the hook waited for them): evaluate the final parameters.
    with tf.compat.v1.Session(server.target, config=session_config(task)) as session:
        final_step, staleness_sum = map(int, session.run([adag.global_step,
                                                          adag.staleness_sum]))
        final_accuracy = record_test_accuracy(session, final_step, time.time() - started)
    writer.flush()
    # the timed mini-batch steps of all workers: every push but the chief's first is a window
    steps_done = (final_step - start_step - 1) * args.window
    lost = [w for w, steps in peers.local_steps.items() if steps == FAILED]
    report(role, args.metrics_file, collections.OrderedDict([
        ("example", EXAMPLE), ("test_accuracy", final_accuracy), ("global_step", final_step),
        ("workers", num_workers), ("ps", len(cluster["ps"])),
        ("local_steps", [local_step] + [peers.local_steps[w] for w in range(1, num_workers)]),
        ("lost_workers", len(lost)),
        ("mean_staleness", staleness_sum / max(final_step, 1)),
        ("wall_seconds", time.time() - started),
        ("steps_per_sec", steps_done / train_seconds),
        ("examples_per_sec", steps_done * args.batch_size / train_seconds),
        ("batch_size", args.batch_size), ("log_dir", args.log_dir),
        ("window", args.window), ("pushes", final_step - start_step),
        ("history", history)]))
    shutdown.release_parameter_servers(server)
    if lost:
        fail("worker(s) %s were lost during training" % ",".join(map(str, lost)))
    return 0


# >>> shared: reporting
def default_log_dir():
    stamp = time.strftime("%Y%m%d-%H%M%S") + "-%d" % os.getpid()
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs", stamp)


def progress(role, local_step, global_step, loss, steps_per_sec):
    print("[%s] local_step=%d global_step=%d loss=%.4f steps_per_sec=%.1f"
          % (role, local_step, global_step, loss, steps_per_sec), flush=True)


def report(role, metrics_file, metrics):
    """The one summary line, in stable key=value pairs, and the same as JSON if asked."""
    def text(value):
        if isinstance(value, float):
            return "%.6g" % value
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)
    print("[%s] summary %s" % (role, " ".join(
        "%s=%s" % (k, text(v)) for k, v in metrics.items() if k != "history")), flush=True)
    if metrics_file:
        with open(metrics_file, "w") as f:
            json.dump(metrics, f, indent=1)
# <<< shared: reporting


# ==================================================================================================
# Shutdown
# ==================================================================================================
# >>> shared: shutdown
# TensorFlow servers never stop by themselves (server.join() never returns). So each ps task
# holds a "done" queue: every worker puts one token in it when it leaves, and the ps exits once
# it has a token from each worker. Non-chief workers also put their local step count in a
# "finished" queue that the chief empties before its final checkpoint and evaluation. A worker
# that dies without a token is noticed when its server stops answering.
FAILED = -1


def done_queue(cluster, ps_index):
    """The queue on one ps task where each worker leaves a token as it goes."""
    with tf.compat.v1.device("/job:ps/task:%d" % ps_index):
        return tf.compat.v1.FIFOQueue(len(cluster["worker"]), [tf.int64, tf.int64], [[], []],
                                      shared_name="done_ps%d" % ps_index)


def finished_queue(cluster):
    """The queue on ps 0 where each non-chief worker leaves its local step count."""
    with tf.compat.v1.device("/job:ps/task:0"):
        return tf.compat.v1.FIFOQueue(len(cluster["worker"]), [tf.int64, tf.int64], [[], []],
                                      shared_name="finished_workers")


class Shutdown(object):
    """A worker's side of the queues, created by name on the ps tasks so every process finds them."""

    def __init__(self, cluster, task_index):
        self.task_index, self.ps_addresses = task_index, cluster["ps"]
        self.done = [done_queue(cluster, i) for i in range(len(cluster["ps"]))]
        self.finished = finished_queue(cluster)
        # ops are built now: the training session finalizes the graph
        self.steps = tf.compat.v1.placeholder(tf.int64, [])
        self.report_finished = self.finished.enqueue([task_index, self.steps])
        self.signal_done = [q.enqueue([task_index, self.steps]) for q in self.done]

    def leave(self, server, local_steps):
        """A non-chief worker (or a failed chief) reports its local steps and tells each ps."""
        if self.task_index == 0 and local_steps != FAILED:
            return  # the chief leaves last, after its evaluation
        if not all(is_listening(a) for a in self.ps_addresses):
            return  # a ps is gone: there is nobody left to tell
        ops = self.signal_done if self.task_index == 0 else [self.report_finished] + self.signal_done
        with tf.compat.v1.Session(server.target, config=session_config(self.task_index)) as s:
            s.run(ops, {self.steps: local_steps},
                  options=tf.compat.v1.RunOptions(timeout_in_ms=10000))

    def release_parameter_servers(self, server):
        with tf.compat.v1.Session(server.target, config=session_config(0)) as s:
            s.run(self.signal_done, {self.steps: 0},
                  options=tf.compat.v1.RunOptions(timeout_in_ms=10000))


def token_ops(queue):
    return queue.dequeue(), queue.size()


def collect_tokens(session, ops, worker_addresses, workers, grace_secs):
    """Take one (worker, value) token from each of the given workers; return {worker: value}.

    ops is token_ops(queue). A worker whose server stopped answering and whose token is not in
    the queue gets FAILED. A worker not yet seen alive is waited for up to grace_secs, or until
    every other worker has sent its token. Every wait is bounded.
    """
    dequeue, size = ops
    tokens, seen_alive, gone = {}, set(), set()
    deadline, poll = time.time() + grace_secs, tf.compat.v1.RunOptions(timeout_in_ms=1000)
    while set(workers) - set(tokens):
        try:
            worker, value = session.run(dequeue, options=poll)
            tokens[int(worker)] = int(value)
            continue
        except tf.errors.DeadlineExceededError:
            pass
        if session.run(size, options=tf.compat.v1.RunOptions(timeout_in_ms=60000)) > 0:
            continue  # a token is waiting (on a busy machine): take it before judging anyone
        pending = set(workers) - set(tokens)
        for w in pending:
            if is_listening(worker_addresses[w]):
                seen_alive.add(w)
            elif w in gone:  # silent on two checks in a row, with a dequeue between: lost
                tokens[w] = FAILED
            elif w in seen_alive or time.time() > deadline or pending == {w}:
                gone.add(w)
    return tokens


class WaitForOtherWorkersHook(tf.compat.v1.train.SessionRunHook):
    """Chief only: at the end of training, wait for the other workers' local step counts.

    It runs before the checkpoint hook's end, so the last checkpoint holds the final parameters.
    """

    def __init__(self, shutdown, cluster, grace_secs):
        self.shutdown, self.cluster, self.grace_secs = shutdown, cluster, grace_secs
        self.local_steps = {}

    def begin(self):
        self.ops = token_ops(self.shutdown.finished)  # built now: the graph is then finalized

    def end(self, session):
        others = range(1, len(self.cluster["worker"]))
        self.local_steps = collect_tokens(session, self.ops, self.cluster["worker"],
                                          others, grace_secs=0)


def serve(cluster, server, index, grace_secs):
    """A parameter server: serve the variables until every worker has left, then return."""
    num_workers = len(cluster["worker"])
    ops = token_ops(done_queue(cluster, index))  # only this task's: the session sees only it
    print("[ps%d] serving %d worker(s) at %s" % (index, num_workers, cluster["ps"][index]),
          flush=True)
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps/task:%d" % index])
    with tf.compat.v1.Session(server.target, config=config) as session:
        tokens = collect_tokens(session, ops, cluster["worker"], range(num_workers),
                                grace_secs)
    failed = sorted(w for w, v in tokens.items() if v == FAILED)
    if failed:
        fail("worker(s) %s failed or were lost; the ps shuts down" % ",".join(map(str, failed)))
    print("[ps%d] all %d worker(s) done; shutting down" % (index, num_workers), flush=True)
    return 0
# <<< shared: shutdown


# ==================================================================================================
# main: a parameter server serves until its workers are done; a worker trains
# ==================================================================================================
def main(argv=None):
    parser = common_flags(__doc__.splitlines()[0])
    cluster_flags(parser)
    adag_flags(parser)
    args = parser.parse_args(argv)
    check_common_flags(args)
    check_adag_flags(args)
    cluster, job, index = resolve_cluster(args)
    args.job_name, args.task_index = job, index
    args.log_dir = args.log_dir or default_log_dir()
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    server = start_server(cluster, job, index)
    try:
        if job == "ps":
            return serve(cluster, server, index, args.connect_timeout)
        return train(args, cluster, server)
    except tf.errors.OpError as e:  # a lost peer or a timeout: one line, not a traceback wall
        fail("%s %d stopped: %s: %s" % (job, index, type(e).__name__, e.message.splitlines()[0]))


if __name__ == "__main__":
    sys.exit(main())
