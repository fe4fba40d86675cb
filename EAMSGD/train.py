"""EAMSGD: asynchronous elastic averaging with Nesterov momentum on each worker.

What it teaches
    How a local optimizer with state fits into elastic averaging. It is AEASGD (../AEASGD), the
    same elastic exchange with the centre variable every tau mini-batches, but each worker
    trains its own parameters with Nesterov momentum. The velocity is the worker's alone: it
    lives on the worker, never crosses the network, and the exchange moves the parameters only,
    so the worker keeps its momentum through every exchange. In the paper this was the fastest
    of the methods to a given test error.

The update rule (worker k; the global step counts exchanges)
    local_params <- centre;  velocity <- 0                  # once, when the worker starts
    repeat:
        tau times:                                          # on the worker, no network
            g <- grad L(local_params + momentum * velocity; next mini-batch of k)  # look ahead
            velocity     <- momentum * velocity - learning_rate * g
            local_params <- local_params + velocity
        exchange:                                           # one round trip to the ps
            elastic <- alpha * (local_params - centre)      # centre read once
            local_params <- local_params - elastic          # on the worker; velocity untouched
            centre       <- centre + elastic                # on the ps (an add: others' adds
            global_step  <- global_step + 1                 #  in between are kept)
    alpha is the paper's eta * rho; with momentum = 0 this is AEASGD.

Run it
    bash run.sh                                    # 1 ps + 2 workers on free localhost ports
    NUM_WORKERS=4 bash run.sh --tau 16 --momentum 0.99 --learning_rate 0.005
    By hand or with TF_CONFIG: as in ../Distributed-Setup. --steps counts the mini-batches of
    all workers, as in every example: training stops once the global step reaches steps/tau.

Use your own model: edit the sections marked "(replace with your own)", Data and Model.

References
    S. Zhang, A. Choromanska, Y. LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015,
    arXiv:1412.6651, Algorithm 2 (EAMSGD; there the exchange comes before the momentum step).
    Y. Nesterov, "A method of solving a convex programming problem with convergence rate
    O(1/k^2)", 1983; I. Sutskever et al., "On the importance of initialization and momentum in
    deep learning", ICML 2013 (the look-ahead form used here).
"""
import argparse
import collections
import json
import os
import socket
import sys
import time

import numpy as np

tf = None  # TensorFlow loads once the flags are checked (run_task): bad input fails at once
EXAMPLE = "EAMSGD"


def example_flags(parser):
    parser.add_argument("--tau", type=int, default=8,
                        help="local mini-batch steps between two elastic exchanges")
    parser.add_argument("--alpha", type=float, default=0.3,
                        help="elastic moving rate (the paper's eta * rho): the fraction of the "
                        "difference that worker and centre each move at an exchange")
    parser.add_argument("--momentum", type=float, default=0.9,
                        help="Nesterov momentum of each worker's local steps (0: AEASGD)")
    parser.set_defaults(learning_rate=0.02)  # momentum 0.9 makes each step about 10 times longer


# --- Data (replace with your own) -----------------------------------------------------------------
# >>> shared: data
Dataset = collections.namedtuple("Dataset", "x_train y_train x_test y_test pixel_max")


def load_dataset(name, data_path=""):
    """Handwritten digits as integer pixels and labels, with a fixed train/test split.

    digits: scikit-learn's bundled 8x8 images (1797), offline; a fixed 20% is the test set.
    mnist:  28x28 images (70000) from a local .npz (x_train, y_train, x_test, y_test), or
            downloaded once by tf.keras.datasets into ~/.keras/datasets.
    """
    if name == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        digits = load_digits()
        x_train, x_test, y_train, y_test = train_test_split(
            digits.data.astype(np.uint8), digits.target.astype(np.int64),
            test_size=0.2, random_state=0, stratify=digits.target)
        return Dataset(x_train, y_train, x_test, y_test, pixel_max=16)
    try:
        if data_path:
            with np.load(data_path) as f:
                (x_train, y_train), (x_test, y_test) = ((f["x_train"], f["y_train"]),
                                                        (f["x_test"], f["y_test"]))
        else:
            (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
    except Exception as e:  # a missing file or no network: say which, in one line
        fail("could not load MNIST (%s: %s); pass --data_path to a local mnist.npz"
             % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
    flat = lambda x: x.reshape(len(x), -1).astype(np.uint8)
    return Dataset(flat(x_train), y_train.astype(np.int64), flat(x_test), y_test.astype(np.int64),
                   pixel_max=255)


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


# --- Model (replace with your own) ----------------------------------------------------------------
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


# --- The algorithm --------------------------------------------------------------------------------
Eamsgd = collections.namedtuple("Eamsgd", "centre local_params velocity global_step loss "
                                "local_step exchange")


def build_eamsgd(args, cluster, x, y):
    """EAMSGD's ops for this worker, on the mini-batch stream (x, y).

    local_step  one Nesterov momentum step on local_params and velocity with the next
                mini-batch. Runs on this worker.
    exchange    the elastic exchange: local_params and centre each move alpha times their
                difference towards the other; velocity stays. Counted in global_step (its
                value).
    """
    worker = "/job:worker/task:%d" % args.task_index
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            cluster=tf.compat.v1.train.ClusterSpec(cluster), worker_device=worker)):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        centre = model_params(int(x.shape[1]), args.hidden, args.seed)
    with tf.compat.v1.device(worker):
        # every worker starts from the centre, once the chief has initialised it (the session
        # manager's ready_for_local_init_op); after that it never copies the centre again
        local_params = worker_variables("local", centre, lambda c: c.read_value())
        velocity = worker_variables("velocity", centre, lambda c: tf.zeros(c.shape))
        # Nesterov: the gradient is taken where the velocity is about to carry the parameters
        ahead = collections.OrderedDict((name, p.read_value() + args.momentum * v.read_value())
                                        for (name, p), v in zip(local_params.items(),
                                                                velocity.values()))
        loss = model_loss_and_accuracy(ahead, x, y)[0]
        gradients = tf.gradients(loss, list(ahead.values()))
        steps = [args.momentum * v.read_value() - args.learning_rate * g
                 for v, g in zip(velocity.values(), gradients)]
        moves = [v.assign(s, read_value=False) for v, s in zip(velocity.values(), steps)]
        moves += [p.assign_add(s, read_value=False) for p, s in zip(local_params.values(), steps)]
        with tf.control_dependencies(moves):
            local_step = tf.identity(loss, name="local_step")
        # one read of the centre per exchange; both sides then move by the same amount
        elastic = [args.alpha * (p.read_value() - c.read_value())
                   for p, c in zip(local_params.values(), centre.values())]

    # equal and opposite: what the worker gives up, the centre gains (an add on the ps, so
    # exchanges of other workers that land in between are kept)
    moves = ([c.assign_add(e, read_value=False) for c, e in zip(centre.values(), elastic)] +
             [p.assign_sub(e, read_value=False) for p, e in zip(local_params.values(), elastic)])
    with tf.control_dependencies(moves):
        exchange = global_step.assign_add(1)
    return Eamsgd(centre, local_params, velocity, global_step, loss, local_step,
                  exchange)


# >>> shared: worker variables
def worker_variables(prefix, like, initial_value):
    """One variable on this worker per parameter in like, named prefix_<name>. LOCAL_VARIABLES:
    each worker initialises its own, and checkpoints leave them out."""
    return collections.OrderedDict(
        (name, tf.compat.v1.Variable(initial_value(param), trainable=False,
                                     name="%s_%s" % (prefix, name),
                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES]))
        for name, param in like.items())
# <<< shared: worker variables


# --- The training loop ----------------------------------------------------------------------------
def train(args, cluster, server):
    data = load_dataset(args.dataset, args.data_path)
    x, y = training_batches(data, args.batch_size, args.task_index, len(cluster["worker"]),
                            args.seed)  # no device given: the pipeline runs on this worker
    eamsgd = build_eamsgd(args, cluster, x, y)
    log = TrainingLog(args, cluster, eamsgd.centre, data, steps_per_update=args.tau)
    last_exchange = -(-args.steps // args.tau)  # the global step counts exchanges
    with log.training_session(server, last_step=last_exchange) as session:
        for log_now in log.updates(session):
            # tau steps without the session's hooks: they would read the global step from the
            # ps at every local step, the very traffic the period is there to save
            loss = run_without_hooks(session, eamsgd.local_step, repeat=args.tau)
            step = session.run(eamsgd.exchange)
            if log_now:
                log.progress(session, loss, step)
        return log.end(session, minibatches_per_update=args.tau, tau=args.tau, alpha=args.alpha,
                       momentum=args.momentum)


def main(argv=None):
    args = parse_flags(argv, example_flags)  # bad input fails here, before TensorFlow loads
    return run_task(args, resolve_cluster(args), train)


# ==================================================================================================
# Plumbing shared by every example (identical text; you need not read below)
# ==================================================================================================
# >>> shared: flags
def fail(message):
    """One line on stderr and exit status 2: for bad input and lost peers, never for bugs."""
    print("error: " + message, file=sys.stderr, flush=True)
    sys.exit(2)


def parse_flags(argv, example_flags, distributed=True):
    """The flags every example shares, then the example's own; bad values fail here."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.error = lambda message: fail(message + " (see --help)")
    for flag, kind, default, text in [
            ("steps", int, 2000, "mini-batches to train, summed over the workers"),
            ("batch_size", int, 64, "examples per mini-batch"),
            ("learning_rate", float, 0.1, "the workers' learning rate"),
            ("hidden", int, 128, "width of the MLP's hidden layer"),
            ("data_path", str, "", "a local mnist.npz for --dataset mnist (else it downloads)"),
            ("log_dir", str, "", "checkpoints and summaries; an existing one resumes (default: a "
             "new logs/<time> beside train.py)"),
            ("seed", int, 0, "seed of the initial weights and the shuffling"),
            ("metrics_file", str, "", "also write the summary here, as JSON"),
            ("log_every", int, 100, "progress (the chief: test accuracy) every N local steps"),
    ] + [("job_name", str, "", "ps or worker (or set TF_CONFIG)"),
         ("task_index", int, 0, "this task's index in its job"),
         ("ps_hosts", str, "", "comma-separated host:port of the ps tasks"),
         ("worker_hosts", str, "", "comma-separated host:port of the workers"),
         ("connect_timeout", float, 60, "seconds to wait for the other tasks")] * distributed:
        p.add_argument("--" + flag, type=kind, default=default, help=text)
    p.add_argument("--dataset", default="digits", choices=("digits", "mnist"), help="data set")
    example_flags(p)
    args = p.parse_args(argv)
    for flag, value in vars(args).items():  # no number is negative; a count, a size or a time
        if type(value) in (int, float) and (value < 0 or value == 0 and p.get_default(flag) >= 1):
            fail("--%s must be %s, got %s" % (  # is not 0 either (rates and factors may be)
                flag, "positive" if p.get_default(flag) >= 1 else "0 or more", value))
    args.log_dir = args.log_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "logs",
                                                time.strftime("%Y%m%d-%H%M%S-") + str(os.getpid()))
    return args
# <<< shared: flags


# >>> shared: cluster
def resolve_cluster(args):
    """The cluster from the flags, or else from TF_CONFIG (as TFJob, Vertex AI or SageMaker give
    it): a "chief" or "master" task becomes worker 0 and the workers follow; an "evaluator" has
    nothing to do (the chief evaluates). Sets args.job_name and args.task_index."""
    job, index = args.job_name, args.task_index
    if job or args.ps_hosts or args.worker_hosts or "TF_CONFIG" not in os.environ:
        if not args.ps_hosts or not args.worker_hosts:
            fail("give --ps_hosts and --worker_hosts (or set TF_CONFIG)")
        cluster = {"ps": args.ps_hosts.replace(" ", "").split(","),
                   "worker": args.worker_hosts.replace(" ", "").split(",")}
    else:
        try:
            config = json.loads(os.environ["TF_CONFIG"])
            spec, job, index = config["cluster"], config["task"]["type"], config["task"].get(
                "index")
            chief = list(spec.get("chief", [])) + list(spec.get("master", []))
            cluster = {"ps": list(spec["ps"]), "worker": chief + list(spec.get("worker", []))}
            job, index = ("worker", 0) if job in ("chief", "master") else (
                job, int(index or 0) + len(chief) * (job == "worker"))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail("TF_CONFIG is not valid cluster JSON (%s: %s)" % (type(e).__name__, e))
        if job == "evaluator":
            sys.exit(print("[evaluator] nothing to do: the chief evaluates", flush=True))
    for name, hosts in cluster.items():
        for host, port in (str(h).rpartition(":")[::2] for h in hosts):
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                fail("%s hosts: %r is not host:port (for example localhost:2222)"
                     % (name, host + ":" * bool(host) + port))
    if job not in ("ps", "worker"):
        fail("unknown job name %r: use ps or worker" % job)
    if not 0 <= index < len(cluster[job]):
        fail("task index %d is out of range: the %s job has %d task(s), 0..%d"
             % (index, job, len(cluster[job]), len(cluster[job]) - 1))
    args.job_name, args.task_index = job, index
    return cluster


def run_task(args, cluster, train):
    """Load TensorFlow, start this task's server, then serve (a ps) or train (a worker, once
    every ps answers). A lost peer or a timeout ends the task in one line, not a traceback."""
    global tf
    job, index, address = args.job_name, args.task_index, cluster[args.job_name][args.task_index]
    with socket.socket() as probe:
        try:
            probe.bind(("", int(address.rpartition(":")[2])))
        except OSError:
            fail("%s %d: port %s is already in use: is an earlier run still going?"
                 % (job, index, address))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the import: no C++ info lines
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    server = tf.compat.v1.train.Server(  # one thread per op leaves the cores to the others
        tf.compat.v1.train.ClusterSpec(cluster), job_name=job, task_index=index,
        config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1), start=True)
    try:
        if job == "ps":
            return serve(args, cluster, server)
        deadline = time.time() + args.connect_timeout
        while not all(is_listening(address) for address in cluster["ps"]):
            if time.time() > deadline:
                fail("cannot reach the ps at %s after %.0f s: is it running? (check the hosts)"
                     % (",".join(cluster["ps"]), args.connect_timeout))
            time.sleep(0.2)  # back-off between connection attempts
        return train(args, cluster, server)
    except tf.errors.OpError as e:
        fail("%s %d stopped: %s: %s" % (job, index, type(e).__name__, e.message.splitlines()[0]))


def is_listening(address):
    try:
        socket.create_connection(address.rsplit(":", 1), timeout=1).close()
        return True
    except OSError:
        return False
# <<< shared: cluster


# >>> shared: shutdown
# TensorFlow servers never stop by themselves, so every process watches the others' ports. Each
# ps keeps a record with an entry per worker: NOT_ARRIVED, then TRAINING once its session is up,
# then its local step count once it left cleanly. A ps serves until every worker has come and
# gone, and so does the chief before its final checkpoint; gone without an entry is lost.
NOT_ARRIVED, TRAINING = -1, -2


def departure_record(cluster, ps_index):  # made and initialised by the ps; never checkpointed
    with tf.compat.v1.device("/job:ps/task:%d" % ps_index):
        return tf.compat.v1.Variable(tf.fill([len(cluster["worker"])], np.int64(NOT_ARRIVED)),
                                     collections=[], name="departures_ps%d" % ps_index)


def wait_until_gone(read_record, addresses, deadline, ports_too=True):
    """Until every worker in addresses (index: host:port) has left: its entry says so (and, with
    ports_too, its port has closed), or it has stopped answering (lost), or it has not arrived by
    the deadline. Returns the record then: local steps per worker, below 0 for the lost."""
    while True:
        record = read_record()
        if not [w for w, address in addresses.items() if (record[w] < 0 or ports_too) and (
                is_listening(address)) or record[w] == NOT_ARRIVED and time.time() < deadline]:
            return read_record()  # once more: a worker may have written, then closed its port
        time.sleep(0.25)  # the pace of the port checks


def serve(args, cluster, server):
    """A parameter server: serve the variables until every worker has come and gone."""
    index, workers = args.task_index, cluster["worker"]
    record = departure_record(cluster, index)
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps/task:%d" % index])
    with tf.compat.v1.Session(server.target, config=config) as session:
        session.run(record.initializer)
        print("[ps%d] serving %d worker(s) at %s" % (index, len(workers), cluster["ps"][index]),
              flush=True)
        left = wait_until_gone(lambda: session.run(record), dict(enumerate(workers)),
                               time.time() + args.connect_timeout)
    lost = [w for w, steps in enumerate(left) if steps < 0]
    if lost:
        fail("worker(s) %s failed or were lost; the ps shuts down" % ",".join(map(str, lost)))
    print("[ps%d] all %d worker(s) done; shutting down" % (index, len(workers)), flush=True)
    return 0
# <<< shared: shutdown


# >>> shared: training log
class TrainingLog(object):
    """A worker's bookkeeping around its loop: its session, progress lines, the chief's test
    accuracy and summaries, timing, and the end of training (see end)."""

    def __init__(self, args, cluster, params, data, steps_per_update=1):
        self.args, self.cluster, self.steps_per_update = args, cluster, steps_per_update
        self.role, self.is_chief = "worker%d" % args.task_index, args.task_index == 0
        with tf.compat.v1.device("/job:worker/task:%d" % args.task_index):  # ops built now: the
            self.test_accuracy = model_loss_and_accuracy(  # session finalizes the graph
                params, scale(data.x_test, data.pixel_max), data.y_test)[1]
        self.records = [departure_record(cluster, i) for i in range(len(cluster["ps"]))]
        self.steps_done = tf.compat.v1.placeholder(tf.int64, [1])
        self.depart = [r.scatter_update(tf.IndexedSlices(self.steps_done, [args.task_index]))
                       for r in self.records]
        self.global_step, self.staleness_sum = tf.compat.v1.train.get_or_create_global_step(), None
        self.local_steps, self.start_step, self.history, self.started = 0, 0, [], time.time()
        self.clock = self.last_log = (0, self.started, 0)  # local steps, time, global step

    def training_session(self, server, last_step, hooks=()):
        """The chief initialises or restores, and saves checkpoints and summaries; the others
        wait here until it has (the stock session would look only every 30 s), then join."""
        args = self.args
        config = tf.compat.v1.ConfigProto(  # sees only the ps and this worker, or it waits for all
            device_filters=["/job:ps", "/job:worker/task:%d" % args.task_index],
            intra_op_parallelism_threads=1)
        if self.is_chief:
            print("[worker0] chief: log_dir=%s" % args.log_dir, flush=True)
            if tf.train.latest_checkpoint(args.log_dir):
                self.start_step = int(tf.train.load_variable(args.log_dir, "global_step"))
                print("[worker0] resuming from the checkpoint at global step %d" % self.start_step)
        else:
            uninitialised = tf.compat.v1.report_uninitialized_variables(  # the chief's part:
                tf.compat.v1.global_variables())  # local variables are each worker's own
            with tf.compat.v1.Session(server.target, config=config) as session:
                deadline = time.time() + args.connect_timeout
                while len(session.run(uninitialised)) and time.time() < deadline:
                    time.sleep(0.25)  # the pace of the checks
        return tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=self.is_chief, checkpoint_dir=args.log_dir,
            hooks=[tf.compat.v1.train.StopAtStepHook(last_step=last_step)] + list(hooks),
            save_checkpoint_secs=30, save_summaries_steps=args.log_every, config=config,
            log_step_count_steps=args.log_every, stop_grace_period_secs=1,  # for queue threads
            max_wait_secs=args.connect_timeout)

    def updates(self, session):
        """Yield once per update until the session stops: True when it is to log progress. The
        clock starts after the first update, which sets the graph up on every server."""
        run_without_hooks(session, self.depart, {self.steps_done: [TRAINING]})
        print("[%s] training started" % self.role, flush=True)
        while not session.should_stop():
            done, self.local_steps = self.local_steps, self.local_steps + self.steps_per_update
            yield done // self.args.log_every < self.local_steps // self.args.log_every
            if done == 0:
                self.clock = self.last_log = (self.local_steps, time.time(),
                                              run_without_hooks(session, self.global_step))
        self.seconds = time.time() - self.clock[1]

    def progress(self, session, loss, global_step):
        """A progress line; the chief adds the test accuracy, and writes both to TensorBoard."""
        line = "[%s] local_step=%d global_step=%d loss=%.4f" % (
            self.role, self.local_steps, global_step, loss)
        if self.is_chief:
            line += " test_accuracy=%.4f" % self.evaluate(session, global_step, loss=loss)
        print(line + " steps_per_sec=%.1f" % ((self.local_steps - self.last_log[0]) / (
            time.time() - self.last_log[1])), flush=True)
        self.last_log = self.local_steps, time.time()

    def evaluate(self, session, global_step, **summaries):
        accuracy = float(run_without_hooks(session, self.test_accuracy))
        self.history.append([round(time.time() - self.started, 3), int(global_step), accuracy])
        tf.compat.v1.summary.FileWriterCache.get(self.args.log_dir).add_summary(
            tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                                        for tag, value in dict(summaries, test_accuracy=accuracy)
                                        .items()]), global_step)
        return accuracy

    def end(self, session, minibatches_per_update=1, **extra):
        """The last call in the session. The chief waits for the others to leave, evaluates the
        final parameters and prints the summary (extra: values, or functions of the summary);
        then every worker records its local steps on each ps. The final checkpoint follows."""
        if self.is_chief:
            left = wait_until_gone(lambda: run_without_hooks(session, self.records[0]), dict(list(
                enumerate(self.cluster["worker"]))[1:]), self.started + self.args.connect_timeout,
                ports_too=False)
            step, seconds = int(run_without_hooks(session, self.global_step)), self.seconds
            minibatches = (step - self.clock[2]) * minibatches_per_update
            summary = dict(
                example=EXAMPLE, test_accuracy=self.evaluate(session, step), global_step=step,
                workers=len(left), ps=len(self.records), lost_workers=int(sum(left[1:] < 0)),
                local_steps=[self.local_steps] + [int(s) for s in left[1:]],
                updates=step - self.start_step, batch_size=self.args.batch_size,
                wall_seconds=time.time() - self.started, steps_per_sec=minibatches / seconds,
                examples_per_sec=minibatches * self.args.batch_size / seconds)
            if self.staleness_sum is not None:  # see count_staleness
                summary["mean_staleness"] = run_without_hooks(session, self.staleness_sum) / max(
                    step, 1)
            summary.update((k, v(summary) if callable(v) else v) for k, v in extra.items())
            print("[worker0] summary " + " ".join("%s=%s" % (k, ",".join(map(str, v)) if isinstance(
                v, list) else "%.6g" % v if isinstance(v, float) else v)
                for k, v in summary.items()), flush=True)
            if self.args.metrics_file:
                with open(self.args.metrics_file, "w") as f:
                    json.dump(dict(summary, history=self.history), f, indent=1)
        try:
            run_without_hooks(session, self.depart, {self.steps_done: [self.local_steps]})
        except tf.errors.OpError:
            pass  # a ps is gone: it no longer needs to know
        print("[%s] done: local_steps=%d" % (self.role, self.local_steps), flush=True)
        return 0


def run_without_hooks(session, fetches, feed_dict=None, repeat=1):
    """Run fetches (repeat times) on the raw session, so that no hook adds to the traffic."""
    def run(step_context):
        for _ in range(repeat):
            value = step_context.session.run(fetches, feed_dict)
        return value
    return session.run_step_fn(run)
# <<< shared: training log


if __name__ == "__main__":
    sys.exit(main())
