"""A real cluster inside the test process (gRPC servers on free ports), an example's algorithm
built and driven op by op on it, and references computed apart from the example."""
import threading

import numpy as np

from support.processes import free_ports


# --- The cluster, an algorithm's ops and sessions on it -------------------------------------------
def in_process_cluster(num_workers=1, num_ps=1):
    """num_ps ps and num_workers worker servers (real gRPC servers) in this process, on free
    ports; returns the cluster and the workers' servers."""
    import tensorflow as tf
    ports = free_ports(num_ps + num_workers)
    cluster = {"ps": ["localhost:%d" % port for port in ports[:num_ps]],
               "worker": ["localhost:%d" % port for port in ports[num_ps:]]}
    spec = tf.compat.v1.train.ClusterSpec(cluster)
    for k in range(num_ps):
        tf.compat.v1.train.Server(spec, job_name="ps", task_index=k, start=True)
    workers = [tf.compat.v1.train.Server(spec, job_name="worker", task_index=i, start=True)
               for i in range(num_workers)]
    return cluster, workers


def tiny_records(folder, features=5, examples=4):
    """A folder of TFRecord files as tools/npz_to_tfrecord.py writes them, a few zero examples in
    each part: a test set that a session on an in-process cluster streams with no Python
    function (after eager use, this process places a from_generator's PyFunc on a job it has
    not got)."""
    import json
    import os
    import tensorflow as tf
    os.makedirs(folder, exist_ok=True)
    example = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(4 * features)])),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))})).SerializeToString()
    for part in ("train", "test"):
        with tf.io.TFRecordWriter(os.path.join(folder, part + "-00000-of-00001.tfrecord")) as w:
            for _ in range(examples):
                w.write(example)
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(dict(x_shape=[features], x_dtype="float32", x_scale=1.0, num_classes=10,
                       train_examples=examples, test_examples=examples), f)
    return folder


def monitored_session_of(module, args, cluster, server, loss, update):
    """An example's Worker (args.task_index's) and the session its MonitoredSession made on
    server, as train() makes them (the chief initialises or restores, the others wait for it),
    with a TFRecord test set (tiny_records). Returns (worker, the raw session)."""
    import os
    args.job_name = "worker"
    args.connect_timeout = args.connect_timeout or 30.0
    data = module.read_records(tiny_records(os.path.join(args.log_dir, "records")))
    worker = module.Worker(args, cluster, lambda x, y: {}, data)
    return worker, worker.session(server, loss, update)._tf_sess()


def flags(module, *argv):
    """An example's parsed flags, as its main() would parse them (a small model for speed)."""
    return module.parse_flags(["--hidden", "8"] + list(argv), module.example_flags)


def fixed_batch(n=16, features=5, seed=0):
    import tensorflow as tf
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.normal(size=(n, features)).astype(np.float32)),
            tf.constant(rng.integers(0, 10, n)))


def values(session, params):
    return {name: v for name, v in zip(params, session.run(list(params.values())))}


def assert_same(a, b):
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7, err_msg=name)


def differs(a, b):
    return any(not np.allclose(a[name], b[name], rtol=1e-6, atol=1e-7) for name in a)


def worker_config(task_index):
    """A worker session's view of the cluster: the ps tasks and itself, as the examples set it."""
    import tensorflow as tf
    return tf.compat.v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % task_index])


def sync_workers(build, args_per_worker):
    """Workers of a SyncReplicasOptimizer algorithm (Sync-SGD, EASGD, DiLoCo: build, the
    module's build function) on a real in-process cluster, each on its own fixed batch, each
    session set up by the module's SyncReplicasStart, as Worker.new_session does (the chief's
    aggregation thread included). Returns (ops, sessions), one per worker."""
    import tensorflow as tf
    cluster, servers = in_process_cluster(num_workers=len(args_per_worker))
    all_ops, sessions = [], []
    for k, (server, args) in enumerate(zip(servers, args_per_worker)):
        with tf.Graph().as_default() as graph:
            ops = build(args, cluster, *fixed_batch(seed=k))
            start = build.__globals__["SyncReplicasStart"](  # its module's
                ops.optimizer, len(args_per_worker), k == 0)
            init = [tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer()]
        session = tf.compat.v1.Session(server.target, graph=graph, config=worker_config(k))
        if k == 0:
            session.run(init[0])
        session.run(init[1])
        start(session, kept_variables=False)  # a new run's start
        all_ops.append(ops)
        sessions.append(session)
    return all_ops, sessions


def all_at_once(sessions, fetches, timeout=60):
    """Run fetches[k] in sessions[k], all at the same time (a synchronous round)."""
    in_threads(lambda k: sessions[k].run(fetches[k]), len(sessions), timeout=timeout)


def one_worker_session(build, args, cluster, server, batch=fixed_batch):
    """Build an algorithm for worker 0 on a fixed batch, initialised as the chief would."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        ops = build(args, cluster, *batch())
        init = [tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer()]
    session = tf.compat.v1.Session(server.target, graph=graph, config=worker_config(0))
    session.run(init[0])
    session.run(init[1])  # after the globals: the local copies start from the ps
    return ops, session


# --- Several workers at once, and references computed apart ---------------------------------------
def in_threads(work, count, timeout=120):
    """Run work(k) for k in 0..count-1, each in its own thread, all at once; a failure in any
    thread fails the test, and so does one still running after timeout seconds."""
    errors = []

    def guarded(k):
        try:
            work(k)
        except Exception as e:  # reported below, in the test's own thread
            errors.append(e)
    threads = [threading.Thread(target=guarded, args=(k,), daemon=True) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
        assert not t.is_alive(), "the workers did not finish within %d s" % timeout
    assert not errors, errors


def worker_sessions(module, build, count, *argv, extra=None):
    """count workers of an asynchronous example on a real in-process cluster, each in its own
    graph and session on its own fixed batch, the chief's initialisation done. extra(ops) may
    add ops to a worker's graph; its result is kept. Returns [(ops, session, extras)]."""
    import tensorflow as tf
    cluster, servers = in_process_cluster(num_workers=count)
    workers = []
    for k in range(count):
        with tf.Graph().as_default() as graph:
            args = flags(module, "--task_index", str(k), *argv)
            ops = build(args, cluster, *fixed_batch(seed=k))
            added = extra(args, ops) if extra else None
            init = [tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer()]
        session = tf.compat.v1.Session(servers[k].target, graph=graph, config=worker_config(k))
        if k == 0:
            session.run(init[0])
        workers.append((ops, session, added, init[1]))
    for ops, session, added, local_init in workers:  # after the chief: they read the ps
        session.run(local_init)
    return [(ops, session, added) for ops, session, added, _ in workers]


def assert_ticks_are_one_each(ticks, total):
    """Every update's tick of the clock is its own: together they count 1, 2, ... total."""
    assert sorted(ticks) == list(range(1, total + 1)), "two updates read the same clock"


def sgd_step_reference(module, start, learning_rate, seed=0):
    """One plain SGD step from the parameters start on fixed_batch(seed), computed apart from
    the example (TensorFlow's own gradient descent on variables of a fresh graph)."""
    import tensorflow as tf
    with tf.Graph().as_default():
        params = {name: tf.compat.v1.Variable(value) for name, value in start.items()}
        loss = module.model_loss(params, *fixed_batch(seed=seed))
        step = tf.compat.v1.train.GradientDescentOptimizer(learning_rate).minimize(loss)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(step)
            return values(session, params)


def gradient_reference(module, params, seed=0):
    """The gradient of the example's loss at params on fixed_batch(seed), computed apart."""
    import tensorflow as tf
    with tf.Graph().as_default():
        constants = {name: tf.constant(value) for name, value in params.items()}
        loss = module.model_loss(constants, *fixed_batch(seed=seed))
        gradients = tf.gradients(loss, list(constants.values()))
        with tf.compat.v1.Session() as session:
            return dict(zip(constants, session.run(gradients)))
