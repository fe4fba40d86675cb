"""Helpers for tests that start real processes: every wait is bounded, nothing is left running."""
import importlib.util
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "deploy"))
import manifests  # noqa: E402  deploy/manifests.py: the one reader of a train.py's JOBS
ACCURACY_BAR = 0.95  # the test accuracy every example must reach with its defaults


def declared_jobs(example):
    """The jobs an example's train.py declares in its JOBS constant: () for one process,
    ("ps", "worker") for the classic examples, the TensorFlow 2 strategies' own otherwise."""
    jobs = manifests.declared_jobs(os.path.join(ROOT, example, "train.py"))
    assert jobs is not None, "%s/train.py declares no JOBS" % example
    return jobs


def _find_examples():
    """Every folder with a train.py and a run.sh is an example; the classic distributed ones run
    on a ps with the workers' own sessions (JOBS = ("ps", "worker"))."""
    found = sorted(d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "train.py"))
                   and os.path.isfile(os.path.join(ROOT, d, "run.sh")))
    return found, [d for d in found if declared_jobs(d) == ("ps", "worker")]


EXAMPLES, DISTRIBUTED_EXAMPLES = _find_examples()


def example_dir(example):
    return os.path.join(ROOT, example)


def load_train_module(example):
    """Import an example's train.py as a module (its main() only runs when executed), with
    TensorFlow loaded into it as main() would: the file defers the import to check flags first."""
    import tensorflow as tf
    name = "train_" + re.sub(r"\W", "_", example)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(example_dir(example),
                                                                         "train.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.tf = tf
        sys.modules[name] = module
    return sys.modules[name]


def processes_mentioning(marker):
    """PIDs of processes whose command line contains marker (a test's own temp path)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append((int(pid), cmdline))
    return found


class Run(object):
    def __init__(self, code, lines, seconds):
        self.code, self.lines, self.seconds = code, lines, seconds
        self.output = "\n".join(line for _, line in lines)

    def summary(self):
        """The chief's summary line as a dict of strings."""
        found = [l for _, l in self.lines if "] summary " in l]
        assert found, "no summary line in the output:\n" + self.output[-3000:]
        return dict(kv.split("=", 1) for kv in found[-1].split("] summary ", 1)[1].split())

    def first_time(self, text):
        """When the first line containing text arrived (seconds since the epoch)."""
        for t, line in self.lines:
            if text in line:
                return t
        pytest.fail("no line containing %r in:\n%s" % (text, self.output[-3000:]))


def interruptible():
    """In the child before it runs: SIGINT at its default, as in a terminal. A suite started in
    the background of a script inherits SIGINT ignored, and an ignored signal cannot be
    trapped, so a launcher's Ctrl-C handling could not be tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_example(example, args, env=None):
    """Start bash run.sh in its own session, so a test can always stop all of it."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.Popen(["bash", os.path.join(example_dir(example), "run.sh")] + list(args),
                            cwd=example_dir(example), env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=interruptible)


def finish(proc, timeout):
    """Collect the output lines with their arrival times until run.sh exits (at most timeout)."""
    started, lines = time.time(), []

    def read():
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(5)
        pytest.fail("run.sh did not finish within %d s; output:\n%s"
                    % (timeout, "\n".join(l for _, l in lines)[-3000:]))
    reader.join(10)
    return Run(proc.returncode, lines, time.time() - started)


@pytest.fixture
def run_example(tmp_path):
    """run_example(example, *args, env=..., timeout=...) -> Run; asserts no process is left."""
    def run(example, *args, env=None, timeout=180, log_dir=None):
        log_dir = log_dir or str(tmp_path / "logs")
        proc = start_example(example, ["--log_dir", log_dir] + list(args), env)
        return finish(proc, timeout)
    yield run
    assert_nothing_left(str(tmp_path))


def assert_nothing_left(marker, grace=5.0):
    deadline = time.time() + grace
    while processes_mentioning(marker) and time.time() < deadline:
        time.sleep(0.1)  # processes that were told to exit may take a moment to go
    left = processes_mentioning(marker)
    for pid, _ in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "processes left running: %s" % left


def free_ports(count):
    """count distinct free ports, below the kernel's range of ephemeral ports: a port picked
    there could be handed to another socket (a notebook kernel's, a gRPC client's) between our
    choosing it and the server's binding it. Every probe stays bound until all are chosen."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_from = int(f.read().split()[0])
    candidates = random.Random().sample(range(10000, ephemeral_from), 200)
    probes = []
    for port in candidates:
        probe = socket.socket()
        try:
            probe.bind(("localhost", port))
        except OSError:  # in use
            probe.close()
            continue
        probes.append(probe)
        if len(probes) == count:
            break
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    assert len(ports) == count, "no %d free ports below %d" % (count, ephemeral_from)
    return ports


def free_port():
    return free_ports(1)[0]


def run_train(example, args, env=None, timeout=60):
    """Run one train.py directly; returns (exit code, stdout, stderr)."""
    full_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, os.path.join(example_dir(example), "train.py")]
                          + list(args), env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def error_lines(stderr):
    """The lines our code wrote to stderr (TensorFlow's own start-up lines are not ours)."""
    return [l for l in stderr.splitlines() if l.startswith("error: ")]


def read_until(proc, text, timeout):
    """Read run.sh's output until a line contains text; return what was read."""
    deadline, seen = time.time() + timeout, []
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return "".join(seen)
        if time.time() > deadline:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("no line with %r within %d s:\n%s" % (text, timeout, "".join(seen)[-3000:]))


def kill_mid_run(example, tmp_path, args=(), victim="worker1", env=None, timeout=180):
    """Start run.sh, SIGKILL one worker after its first progress line, let the rest finish.

    Returns the Run, with killed_at (seconds since the epoch) set."""
    proc = start_example(example, ["--log_dir", str(tmp_path / "logs"), "--log_every", "50"]
                         + list(args), env)
    seen = read_until(proc, "[%s] local_step=" % victim, timeout=120)
    os.kill(int(seen.split("started %s pid=" % victim)[1].split()[0]), signal.SIGKILL)
    killed_at = time.time()
    run = finish(proc, timeout=timeout)
    run.killed_at = killed_at
    return run


def assert_a_killed_worker_does_not_hang_the_others(example, tmp_path, min_global_step):
    """SIGKILL worker1 mid-run: the chief trains on to the end and reports it lost by name, the
    ps ends by itself, run.sh exits 1 naming it, and nothing is left. Returns the chief's summary."""
    run = kill_mid_run(example, tmp_path, ["--steps", "3000"])
    assert run.code == 1, run.output[-3000:]
    summary = run.summary()
    assert summary["lost_workers"] == "1" and int(summary["global_step"]) >= min_global_step
    assert "[worker0] worker(s) 1 failed or were lost" in run.output
    assert "[run.sh] failed: worker1 (exit 137)" in run.output
    assert_nothing_left(str(tmp_path))
    return summary


def assert_every_worker_in_every_round(run, rounds, steps_per_round):
    """EASGD and DiLoCo with their defaults: the bar, and rounds of steps_per_round local steps
    of every worker. Returns the chief's summary."""
    assert run.code == 0, run.output[-3000:]
    summary = run.summary()
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR
    assert int(summary["global_step"]) == rounds
    for steps in summary["local_steps"].split(","):  # every worker was in every round
        assert abs(int(steps) - rounds * steps_per_round) <= steps_per_round, summary
    assert "[run.sh] all processes finished" in run.output
    return summary


def assert_a_lost_worker_stops_the_rounds(example, tmp_path, round_name, steps="200000"):
    """Synchronous examples without backup workers: SIGKILL worker1; the chief fails in one
    line once --step_timeout (5 s) passes with no round, and nothing is left."""
    run = kill_mid_run(example, tmp_path, ["--steps", steps, "--step_timeout", "5"], timeout=60)
    assert run.code == 1
    assert "[worker0] error: worker0: no %s completed within 5 s" % round_name in run.output
    assert "Traceback" not in run.output
    assert time.time() - run.killed_at < 40
    assert_nothing_left(str(tmp_path))


def assert_a_backup_worker_covers_a_lost_one(example, tmp_path, global_step, args=()):
    """Synchronous examples with 3 workers and --backup_workers 1: SIGKILL worker2; training
    completes and reaches the bar, the chief reports it lost, run.sh exits 1 naming it."""
    run = kill_mid_run(example, tmp_path, ["--steps", "2000", "--backup_workers", "1"]
                       + list(args), victim="worker2", env={"NUM_WORKERS": "3"})
    summary = run.summary()  # training completed and reported its accuracy
    assert summary["global_step"] == str(global_step) and summary["lost_workers"] == "1"
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR
    assert run.code == 1 and "worker2 (exit 137)" in run.output
    assert_nothing_left(str(tmp_path))


def in_process_cluster(num_workers=1):
    """One ps and num_workers worker servers (real gRPC servers) in this process, on free ports."""
    import tensorflow as tf
    ps_port, *worker_ports = free_ports(1 + num_workers)
    cluster = {"ps": ["localhost:%d" % ps_port],
               "worker": ["localhost:%d" % port for port in worker_ports]}
    spec = tf.compat.v1.train.ClusterSpec(cluster)
    tf.compat.v1.train.Server(spec, job_name="ps", task_index=0, start=True)
    workers = [tf.compat.v1.train.Server(spec, job_name="worker", task_index=i, start=True)
               for i in range(num_workers)]
    return cluster, workers


def run_with_defaults(example, tmp_path_factory, timeout=180):
    """One run of an example with its defaults, for a module-scoped fixture to share."""
    tmp = tmp_path_factory.mktemp(example + "_defaults")
    run = finish(start_example(example, ["--log_dir", str(tmp / "logs")]), timeout=timeout)
    assert_nothing_left(str(tmp))
    return run


def assert_trained_to_the_bar(run, workers):
    """A clean run: exit 0, the accuracy bar, no lost worker, the ps and run.sh ended by themselves."""
    assert run.code == 0, run.output[-3000:]
    summary = run.summary()
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR, summary
    assert summary["workers"] == str(workers) and summary["lost_workers"] == "0"
    assert "[ps0] the run is over; shutting down" in run.output
    assert "[run.sh] all processes finished" in run.output


def assert_one_push_per_window(run, window, steps):
    """DOWNPOUR, ADAG, DynSGD, AEASGD and EAMSGD (whose push is the elastic exchange): each
    worker pushes once per whole window of local steps."""
    summary = run.summary()
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert int(summary["window"]) == window, summary
    assert all(s > 0 and s % window == 0 for s in local_steps), local_steps
    assert int(summary["global_step"]) == sum(local_steps) // window
    # --steps counts mini-batches of all workers, so steps / window pushes, and a little more:
    # a worker stops at its first push that returns a global step at the end or past it, so
    # each worker makes at most one push from the end on: at most N - 1 beyond the last needed.
    extra = int(summary["workers"]) - 1
    assert steps // window <= int(summary["global_step"]) <= steps // window + extra


# --- A real cluster inside the test process, driven op by op -------------------------------------
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
    """Workers of a SyncReplicasOptimizer algorithm (EASGD, DiLoCo) on a real in-process
    cluster, each on its own fixed batch, set up as their monitored sessions would be (the
    chief's aggregation thread included). Returns (ops, sessions), one per worker."""
    import tensorflow as tf
    cluster, servers = in_process_cluster(num_workers=len(args_per_worker))
    all_ops, sessions = [], []
    for k, (server, args) in enumerate(zip(servers, args_per_worker)):
        with tf.Graph().as_default() as graph:
            ops = build(args, cluster, *fixed_batch(seed=k))
            init = [tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer()]
        session = tf.compat.v1.Session(server.target, graph=graph, config=worker_config(k))
        if k == 0:
            session.run(init[0])
        session.run(init[1])
        ops.hook.after_create_session(session, tf.compat.v1.train.Coordinator())
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


def assert_the_chief_evaluated_what_it_checkpointed(run, example):
    """The chief's reported test accuracy is that of the parameters in its last checkpoint: the
    ps's (the global parameters, or the centre variable), not a worker's own copy."""
    import tensorflow as tf
    module = load_train_module(example)
    log_dir = [l for _, l in run.lines if "[worker0] chief: log_dir=" in l][0].split("=", 1)[1]
    reader = tf.train.load_checkpoint(log_dir)
    data = module.load_dataset("")
    with tf.Graph().as_default():
        params = {name: tf.constant(reader.get_tensor(name)) for name in ("w1", "b1", "w2", "b2")}
        accuracy = module.model_metrics(params, data.x_test, data.y_test)["accuracy"]
        with tf.compat.v1.Session() as session:
            checkpointed = float(session.run(accuracy))
    assert float(run.summary()["test_accuracy"]) == pytest.approx(checkpointed, abs=1e-5), (
        "the chief reported an accuracy its checkpointed parameters do not have")
    return checkpointed


def one_strategy_step(example, *argv, processes=1, timeout=180):
    """Run tests/strategy_step.py for a TensorFlow 2 example (in processes processes, task k
    getting k as its argument after argv) and return what it wrote: the dataset, the parameters
    before and after one update."""
    import tempfile
    out = tempfile.mkdtemp(prefix="strategy_step_")
    script = os.path.join(ROOT, "tests", "strategy_step.py")
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    runs = [subprocess.Popen([sys.executable, script, example, os.path.join(out, "%d.npz" % k)]
                             + ([str(k)] if processes > 1 else []) + list(argv), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for k in range(processes)]
    try:
        outputs = [run.communicate(timeout=timeout)[0] for run in runs]
    finally:
        for run in runs:
            run.kill()
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-3000:]
    assert_nothing_left(out)
    return [dict(np.load(os.path.join(out, "%d.npz" % k))) for k in range(processes)]


def assert_one_sgd_step_of(step, example, learning_rate):
    """step (one_strategy_step's result) moved the parameters by -learning_rate times the
    gradient of the mean loss over the whole dataset, computed apart."""
    import tensorflow as tf
    module = load_train_module(example)
    names = [k[len("before_"):] for k in step if k.startswith("before_")]
    with tf.Graph().as_default():
        params = {n: tf.constant(step["before_" + n]) for n in names}
        loss = module.model_loss(params, step["x"], tf.constant(step["y"]))
        with tf.compat.v1.Session() as session:
            gradients = dict(zip(names, session.run(tf.gradients(loss, list(params.values())))))
    for n in names:
        assert np.abs(gradients[n]).max() > 1e-4, n
        np.testing.assert_allclose(step["after_" + n], step["before_" + n]
                                   - learning_rate * gradients[n], rtol=1e-4, atol=1e-6,
                                   err_msg=n)


def run_train_noting_tensorflow(example, args, env=None, timeout=60):
    """run_train, also telling whether the process had imported TensorFlow when it exited:
    (exit code, stdout, stderr, loaded)."""
    script = os.path.join(example_dir(example), "train.py")
    wrapper = ("import atexit, runpy, sys\n"
               "atexit.register(lambda: print('tensorflow loaded:', 'tensorflow' in sys.modules))\n"
               "sys.argv = [%r] + %r\n"
               "runpy.run_path(%r, run_name='__main__')\n" % (script, list(args), script))
    full_env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", wrapper], env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    loaded = [l for l in proc.stdout.splitlines() if l.startswith("tensorflow loaded: ")]
    assert loaded, "the process did not report its modules:\n" + proc.stdout[-2000:]
    return proc.returncode, proc.stdout, proc.stderr, loaded[-1].endswith("True")
