"""Evolution-Strategies: shared seeds rebuild the same noise everywhere, every copy of theta stays
bit-identical, one update is the formula's, a late or lost worker is waited for a bounded time,
a worker that starts late or restarts takes the chief's copy, a resumed run goes on with Adam's
moments, a restarted chief is refused, and only seeds and fitness values cross the network."""
import threading
import time

import numpy as np
import pytest

from support.examples import load_train_module
from support.in_process import in_process_cluster, in_threads, worker_config
from support.namespaces import assert_run_left_nothing, needs_namespaces, start_tool
from support.processes import assert_nothing_left
from support.runs import Tasks, finish, kill_mid_run, summary_of

EXAMPLE = "Evolution-Strategies"
OPTIMUM = np.array([1.0, -2.0, 0.5], np.float32)  # the quadratic fitness's known maximum
START = np.array([0.3, 0.4, -0.6], np.float32)


def quadratic(params):
    """Fitness -|v - OPTIMUM|^2: the largest at OPTIMUM; what ES should climb towards."""
    import tensorflow as tf
    return -tf.reduce_sum(tf.square(params["v"] - OPTIMUM))


def start_params():
    import tensorflow as tf
    return {"v": tf.compat.v1.get_variable("v", initializer=tf.constant(START))}


def es_workers(num_workers, *flags):
    """num_workers workers of Evolution-Strategies on the quadratic, on a real in-process
    cluster (gRPC servers), set up as train() sets them up: the chief initialises, the others
    ask for its copy and take it. Returns the module, the parsed flags and (es, session) each."""
    module = load_train_module(EXAMPLE)
    cluster, servers = in_process_cluster(num_workers)
    workers = [es_worker(module, cluster, servers, k, *flags) for k in range(num_workers)]
    take_copies(module, workers, range(1, num_workers))
    return module, flags_of(module, 0, *flags), workers


def flags_of(module, k, *flags):
    return module.parse_flags(["--task_index", str(k), "--population", "4", "--sigma", "0.1",
                               "--learning_rate", "0.05"] + list(flags), module.example_flags)


def es_worker(module, cluster, servers, k, *flags):
    """Worker k's graph and session, its variables initialised as Worker.start does: the chief
    its global and local ones, another only its local ones (its copy is still to take)."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        es = module.build_evolution_strategies(flags_of(module, k, *flags), cluster,
                                               start_params, quadratic)
        init = [tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer()]
    session = tf.compat.v1.Session(servers[k].target, graph=graph, config=worker_config(k))
    if k == 0:
        session.run(init[0])
    session.run(init[1])
    if k == 0:
        session.run(es.table.initializer)  # as set_up_session does
    return es, session


def take_copies(module, workers, taking, generation=None):
    """The workers in taking ask for the chief's copy and take it (take_the_chiefs_copy, each in
    a thread), while the chief hears their asks as it does when it closes a generation (hear),
    at the given generation (default: the global step). Returns the generation each took."""
    es0, chief = workers[0]
    generation = int(chief.run(es0.global_step)) if generation is None else generation
    taken, args = {}, flags_of(module, 0, "--connect_timeout", "30")

    def work(i):
        if i == 0:  # the chief: one ask from each
            for _ in taking:
                arrived = chief.run(es0.next_arrival, options=timeout(30))
                assert arrived[0] == module.ASKS, arrived
                assert module.hear(chief, es0, arrived, generation) == {int(arrived[1])}
        else:
            es, session = workers[taking[i - 1]]
            taken[taking[i - 1]] = module.take_the_chiefs_copy(session, es, args,
                                                               "worker%d" % taking[i - 1])
    in_threads(work, 1 + len(taking), timeout=60)
    return taken


def timeout(seconds):
    import tensorflow as tf
    return tf.compat.v1.RunOptions(timeout_in_ms=int(seconds * 1000))


def one_generation(module, args, workers, publishing=None, fetch_estimate=False, expected=None):
    """Publish (the workers in publishing, default all), let the chief wait for the others'
    pairs (those in expected, default all) and make the list as train() does, then every other
    worker applies it. Returns the chief's (expected next, missing) and every worker's update
    values (the others' with their gradient estimate if asked)."""
    publishing = range(len(workers)) if publishing is None else publishing
    expected = set(range(1, len(workers))) if expected is None else expected
    for k in publishing:
        workers[k][1].run(workers[k][0].publish)
    es0, chief = workers[0]
    update, expected, missing = module.close_generation(
        chief, es0, args, int(chief.run(es0.global_step)), expected)
    fetches = [(es.update, es.gradient_estimate) if fetch_estimate else es.update
               for es, _ in workers[1:]]
    return (expected, missing), [update] + [session.run(f, options=timeout(30))
                                            for (_, session), f in zip(workers[1:], fetches)]


def values(update):
    """(next generation, pairs used, lists waiting) as plain ints."""
    return tuple(int(v) for v in update)


def theta_of(es, session):
    return session.run(es.theta["v"])


def noise_on(module, es, session, generation, j):
    """eps_j of a generation as this worker's own device draws it."""
    import tensorflow as tf
    with session.graph.as_default(), tf.compat.v1.device(es.theta["v"].device):
        op = module.noise(tf.constant(generation, tf.int64), tf.constant(j, tf.int64), es.theta)
    return session.run(op)


@pytest.mark.rule
def test_the_noise_of_a_seed_is_the_same_bits_on_every_worker_and_so_is_theta():
    module, args, workers = es_workers(2)
    (es0, chief), (es1, other) = workers
    # the one-time start: every copy begins as the chief's
    assert theta_of(es0, chief).tobytes() == theta_of(es1, other).tobytes() == START.tobytes()
    (expected, missing), updates = one_generation(module, args, workers)
    assert missing == set() and expected == {1}
    # generation 1 next, from 4 pairs: 2 of each worker
    assert [values(u)[:2] for u in updates] == [(1, 4), (1, 4)]
    for j in range(4):  # worker 0 drew pairs 0, 1 and worker 1 pairs 2, 3: each rebuilds all
        drawn, rebuilt = noise_on(module, es0, chief, 0, j), noise_on(module, es1, other, 0, j)
        assert drawn.dtype == np.float32 and drawn.shape == (3,)
        assert drawn.tobytes() == rebuilt.tobytes(), j
    seeds = [(0, 0), (1, 0), (0, 1)]  # another generation or another pair: other noise
    assert len({noise_on(module, es0, chief, g, j).tobytes() for g, j in seeds}) == 3
    # the fitness published is that of theta +- sigma * the rebuilt noise: the drawing worker
    # used the very noise the others rebuild
    table = chief.run(es0.table)
    for j in range(4):
        eps = noise_on(module, es1, other, 0, j)
        expected_fitness = [-np.sum((START + s * 0.1 * eps - OPTIMUM) ** 2) for s in (1, -1)]
        assert table[j][:2].tolist() == [0, j]
        np.testing.assert_allclose(table[j][2:], expected_fitness, rtol=1e-5)
    first = theta_of(es0, chief)
    assert not np.array_equal(first, START)
    assert first.tobytes() == theta_of(es1, other).tobytes()
    for _ in range(50):
        one_generation(module, args, workers)
    assert theta_of(es0, chief).tobytes() == theta_of(es1, other).tobytes()
    # and the copies climbed towards the known optimum
    assert np.linalg.norm(theta_of(es0, chief) - OPTIMUM) < 0.5 * np.linalg.norm(START - OPTIMUM)


def centred_ranks(values):
    ranks = np.argsort(np.argsort(values.ravel(), kind="stable"), kind="stable")
    return (ranks / (values.size - 1) - 0.5).reshape(values.shape)


@pytest.mark.rule
def test_one_update_moves_theta_by_exactly_the_formulas_amount():
    module, args, workers = es_workers(2)
    (es0, chief), (es1, other) = workers
    before = theta_of(es0, chief)
    for es, session in workers:
        session.run(es.publish)
    table = chief.run(es0.table)  # the pairs of generation 0, as the list will hold them
    _, updates = one_generation(module, args, workers, publishing=[], fetch_estimate=True)
    (step, used, waiting), estimate = updates[1]
    assert values((step, used, waiting)) == (1, 4, 0)

    # the formula, computed here from the published fitness and the rebuilt noise
    n, sigma, lr = 4, 0.1, 0.05
    fitness = table[:, 2:]
    u = centred_ranks(fitness)
    eps = np.stack([noise_on(module, es1, other, 0, j) for j in range(n)])
    g_hat = ((u[:, 0] - u[:, 1])[:, None] * eps).sum(0) / (2 * n * sigma)
    np.testing.assert_allclose(estimate["v"], g_hat, rtol=1e-5, atol=1e-7)
    # and Adam's first step along it (tf.compat.v1.train.AdamOptimizer: beta1 0.9, beta2 0.999,
    # epsilon 1e-8), climbing: the gradient handed to Adam is -g_hat
    m, v = 0.1 * -g_hat, 0.001 * g_hat ** 2
    rate = lr * np.sqrt(1 - 0.999) / (1 - 0.9)
    np.testing.assert_allclose(theta_of(es1, other) - before, -rate * m / (np.sqrt(v) + 1e-8),
                               rtol=1e-4, atol=1e-7)
    assert theta_of(es0, chief).tobytes() == theta_of(es1, other).tobytes()
    # ranks, not raw fitness: the order of the published values is all that counts
    assert sorted(u.ravel().tolist()) == pytest.approx(np.linspace(-0.5, 0.5, 2 * n).tolist())


def test_a_late_worker_is_waited_for_a_bounded_time_and_every_copy_leaves_its_pairs_out():
    module, args, workers = es_workers(2, "--generation_timeout", "1")
    (es0, chief), (es1, other) = workers
    started = time.time()
    (expected, missing), updates = one_generation(module, args, workers, publishing=[0])
    assert 1.0 <= time.time() - started < 10  # the chief waited --generation_timeout, no longer
    assert missing == {1} and expected == set()  # not waited for until it is heard from
    assert [values(u)[1] for u in updates] == [2, 2]  # the chief's 2 pairs only, on both workers
    assert theta_of(es0, chief).tobytes() == theta_of(es1, other).tobytes()

    # it is back: not waited for, but its pairs count when they are in before the list is made,
    # and the chief, having heard from it, waits for it again from the next generation on
    started = time.time()
    (expected, missing), updates = one_generation(module, args, workers, expected=expected)
    assert time.time() - started < 1.0
    assert [values(u)[1] for u in updates] == [4, 4] and expected == {1} and missing == set()
    assert theta_of(es0, chief).tobytes() == theta_of(es1, other).tobytes()


def test_a_worker_behind_sees_lists_waiting_and_applies_them_in_order():
    module, args, workers = es_workers(2, "--generation_timeout", "0.2")
    (es0, chief), (es1, other) = workers
    for _ in range(3):  # worker 1 stalls: the chief closes three generations without it
        chief.run(es0.publish)
        chief.run(es0.update)  # makes the list with the chief's pairs alone
    steps = [values(other.run(es1.update, options=timeout(30))) for _ in range(3)]
    assert steps == [(1, 2, 2), (2, 2, 1), (3, 2, 0)]  # in order: 2, then 1, then 0 waiting
    assert theta_of(es0, chief).tobytes() == theta_of(es1, other).tobytes()


def chief_alone(module, args, workers, generations):
    """The chief closes generations without the others (nobody expected): their lists wait."""
    es0, chief = workers[0]
    for _ in range(generations):
        chief.run(es0.publish)
        module.close_generation(chief, es0, args, int(chief.run(es0.global_step)), set())


def test_a_worker_that_starts_late_takes_the_chiefs_copy_of_now_and_no_older_list():
    # the chief closed three generations alone: lists 0, 1 and 2 wait in worker 1's queue. Its
    # session starts only now: it takes the chief's copy at generation 3, its pairs are of 3,
    # and the lists made before its copy are gone from its queue
    module = load_train_module(EXAMPLE)
    cluster, servers = in_process_cluster(2)
    flags = ("--generation_timeout", "30")
    workers = [es_worker(module, cluster, servers, 0, *flags)]
    chief_alone(module, flags_of(module, 0, *flags), workers, 3)
    workers.append(es_worker(module, cluster, servers, 1, *flags))
    (es0, chief), (es1, late) = workers
    assert late.run(es1.generation) == 3  # its own start: the global step, as Worker.start does
    assert theta_of(es1, late).tobytes() == START.tobytes()  # and its initial theta
    assert take_copies(module, workers, [1]) == {1: 3}
    assert theta_of(es0, chief).tobytes() == theta_of(es1, late).tobytes()
    (expected, missing), updates = one_generation(module, flags_of(module, 0, *flags), workers,
                                                  expected={1})
    assert missing == set() and expected == {1}  # waited for, and on time
    assert [values(u) for u in updates] == [(4, 4, 0), (4, 4, 0)]  # list 3, nothing older
    assert list(chief.run(es0.table)[2:, 0]) == [3, 3]  # its rows: generation 3
    assert theta_of(es0, chief).tobytes() == theta_of(es1, late).tobytes()


def copy_of(es, session):
    """A worker's copy, theta and Adam's state, as bytes by name."""
    return {name: value.tobytes() for name, value in session.run(es.copy).items()}


def lost_step(servers, n, generation):
    """The step of a process of worker 1 that was lost while it waited for its list, as the ps
    still holds it: its arrival of pairs of a generation, then the wait for its next list. Its
    arrival is read by the caller (then its wait has begun). Returns the thread and a list that
    gets the generation of the list it took."""
    import tensorflow as tf
    graph, took = tf.Graph(), []
    with graph.as_default(), tf.compat.v1.device("/job:ps/task:0"):
        arrivals = tf.queue.FIFOQueue(-1, [tf.int64], [[3]], shared_name="arrivals")
        its_lists = tf.queue.FIFOQueue(-1, [tf.int64, tf.float32], [[], [n, 4]],
                                       shared_name="list1")
        with tf.control_dependencies([arrivals.enqueue(
                tf.constant([generation, 1, 0], tf.int64))]):
            listed_g, _ = its_lists.dequeue()
    session = tf.compat.v1.Session(servers[1].target, graph=graph, config=worker_config(1))
    thread = threading.Thread(target=lambda: took.append(
        int(session.run(listed_g, options=timeout(60)))), daemon=True)
    thread.start()
    return thread, took


@pytest.mark.rule
def test_a_restarted_worker_takes_the_chiefs_copy_past_what_its_lost_processes_left():
    # what a restarted worker 1 finds: a copy handed to a process of it that asked and was lost
    # before it took it (an older generation's), and a step of a lost process that still waits
    # on the ps for its next list. It takes its own copy, the later list is its, and every copy
    # stays the chief's, bit for bit, theta and Adam's state alike
    module = load_train_module(EXAMPLE)
    cluster, servers = in_process_cluster(2)
    workers = [es_worker(module, cluster, servers, k) for k in range(2)]
    take_copies(module, workers, [1])
    args = flags_of(module, 0)
    for _ in range(2):
        one_generation(module, args, workers)
    es0, chief = workers[0]
    # a process of worker 1 asks at generation 2 and is lost: its copy stays on the ps
    lost = es_worker(module, cluster, servers, 1)
    lost[1].run(lost[0].ask, {lost[0].ticket: 1})
    module.hear(chief, es0, chief.run(es0.next_arrival, options=timeout(30)), 2)
    chief_alone(module, args, workers, 1)  # list 2, in worker 1's queue
    # a process of worker 1 takes list 2 and is lost; another, at 3, is lost waiting for list 3
    thread, took = lost_step(servers, 4, 2)
    assert tuple(chief.run(es0.next_arrival, options=timeout(30))) == (2, 1, 0)
    thread.join(30)
    assert took == [2], took
    thread, took = lost_step(servers, 4, 3)
    assert tuple(chief.run(es0.next_arrival, options=timeout(30))) == (3, 1, 0)
    # worker 1 restarts: a theta of its own until it takes the chief's copy of generation 3
    workers[1] = es_worker(module, cluster, servers, 1)
    assert take_copies(module, workers, [1]) == {1: 3}
    thread.join(30)
    assert took == [-1], took  # the spare list handed over with the copy, not list 3
    for _ in range(3):
        (_, missing), updates = one_generation(module, args, workers)
        assert missing == set() and [values(u)[1:] for u in updates] == [(4, 0), (4, 0)]
    assert copy_of(*workers[0]) == copy_of(*workers[1])
    assert int(chief.run(es0.global_step)) == 6


@pytest.mark.rule
def test_a_resumed_run_goes_on_with_adams_moments_bit_for_bit(tmp_path):
    # the chief checkpoints Adam's moments with theta: a run resumed from its checkpoint makes
    # the very update that the run would have made, on every worker
    import tensorflow as tf
    module, args, workers = es_workers(2)
    for _ in range(3):
        one_generation(module, args, workers)
    es0, chief = workers[0]
    with chief.graph.as_default():
        checkpoint = tf.compat.v1.train.Saver().save(chief, str(tmp_path / "model.ckpt"))
    one_generation(module, args, workers)
    went_on = copy_of(es0, chief)
    assert went_on == copy_of(*workers[1])

    cluster, servers = in_process_cluster(2)  # the whole run again, from the checkpoint
    workers = [es_worker(module, cluster, servers, k) for k in range(2)]
    es0, chief = workers[0]
    with chief.graph.as_default():
        tf.compat.v1.train.Saver().restore(chief, checkpoint)
    chief.run(es0.generation.initializer)  # after the restore, as Worker.new_session does
    assert int(chief.run(es0.global_step)) == 3
    moments = [name for name in es0.copy if "Adam" in name]
    assert moments and all(np.any(chief.run(es0.copy[name]) != 0) for name in moments)
    assert take_copies(module, workers, [1]) == {1: 3}
    one_generation(module, args, workers)
    assert copy_of(es0, chief) == went_on == copy_of(*workers[1])


def test_a_worker_generations_behind_is_not_waited_for_until_its_pairs_are_current():
    # worker 1 stalls while the chief closes three generations; then it publishes pairs of
    # generation 0, and has lists 0, 1 and 2 to apply before it publishes again. The chief
    # hears it, but does not wait for it in the next generation (--generation_timeout 30)
    module, args, workers = es_workers(2, "--generation_timeout", "30")
    (es0, chief), (es1, other) = workers
    chief_alone(module, args, workers, 3)
    other.run(es1.publish)  # pairs of generation 0
    started = time.time()
    chief.run(es0.publish)
    _, expected, missing = module.close_generation(chief, es0, args, 3, set())
    assert expected == set() and missing == set()
    chief.run(es0.publish)
    _, expected, missing = module.close_generation(chief, es0, args, 4, expected)
    assert time.time() - started < 10  # no wait for it (30 s)
    # it catches up: lists 0 to 4, the last with none waiting; its next pairs are current,
    # and then it is waited for again
    steps = [values(other.run(es1.update, options=timeout(30))) for _ in range(5)]
    assert [step[0] for step in steps] == [1, 2, 3, 4, 5] and steps[-1][2] == 0, steps
    other.run(es1.publish)  # pairs of generation 5
    chief.run(es0.publish)
    update, expected, missing = module.close_generation(chief, es0, args, 5, set())
    assert expected == {1} and values(update)[1] == 4
    assert values(other.run(es1.update, options=timeout(30))) == (6, 4, 0)
    assert theta_of(es0, chief).tobytes() == theta_of(es1, other).tobytes()


def test_a_killed_worker_costs_one_bounded_wait_and_the_chief_trains_on(tmp_path):
    run = kill_mid_run(EXAMPLE, tmp_path)
    assert run.code == 1, run.output[-3000:]
    summary = run.summary()
    # every generation was closed, and the chief waited for the lost worker once or so
    assert summary["lost_workers"] == "1" and summary["global_step"] == "1000", summary
    assert 1 <= int(summary["short_generations"]) <= 3, summary
    assert "[worker0] 1 worker(s) failed, were lost or never started" in run.output
    assert "[run.sh] failed: worker1 (exit 137)" in run.output  # run.sh names the lost worker
    assert_nothing_left(str(tmp_path))


def test_a_restarted_chief_is_refused_in_one_line(tmp_path):
    # the chief's copy lived in its process, and the one in its checkpoint is older than the
    # workers': a chief that comes back says so in one line, before it changes anything
    tasks = Tasks(EXAMPLE, tmp_path, 2, "--steps", "1000000", "--log_every", "50")
    try:
        for job, index in (("ps", 0), ("worker", 0), ("worker", 1)):
            tasks.start(job, index)
        tasks.wait_for_line("worker0", "[worker0] local_step=", timeout=120)
        tasks.procs["worker0"].kill()
        tasks.procs["worker0"].wait(30)
        again = tasks.start("worker", 0)
        assert again.wait(120) == 2, tasks.output("worker0")[-3000:]
        tasks.wait_for_line("worker0", "error:", timeout=10)
    finally:
        tasks.stop_all()
    assert [line for _, line in tasks.lines["worker0"] if line.startswith("error:")] == [
        "error: worker0: Evolution-Strategies cannot take a restarted worker back into a run "
        "in progress; start the whole run again"], tasks.output("worker0")[-3000:]
    assert_nothing_left(str(tmp_path))


@pytest.mark.cluster
@needs_namespaces
@pytest.mark.timeout(150)
def test_a_restarted_worker_takes_the_chiefs_copy_and_ends_with_the_same_theta(tmp_path):
    # benchmarks/cluster.py kills worker 1 once the run is at generation 50 and starts it again
    # at once. The chief waits for its pairs (--generation_timeout 60, longer than a start-up),
    # the new process asks for the chief's copy, and every generation has both workers' pairs
    proc = start_tool([EXAMPLE, "--restart", "worker1@step50", "--timeout", "120", "--log_dir",
                       str(tmp_path / "logs"), "--", "--steps", "400", "--log_every", "25",
                       "--generation_timeout", "60"])
    try:
        run = finish(proc, timeout=140)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 0, run.output[-3000:]
    assert "[cluster] restart worker1 at global step 50 (+" in run.output, run.output[-3000:]
    summary = summary_of(run.output, "worker0")
    assert summary["global_step"] == "200" and summary["lost_workers"] == "0", summary
    assert summary["short_generations"] == "0", summary
    local_steps = [int(n) for n in summary["local_steps"].split(",")]
    # its new process's: the generations after the one it was stopped in (at most 200 - 50)
    assert local_steps[0] == 200 and 0 < local_steps[1] <= 150, local_steps
    sums = checksums(run)
    assert sorted(sums) == ["[worker0]", "[worker1]"] and len(set(sums.values())) == 1, sums


def checksums(run):
    return {line.split("]")[0] + "]": line.split("theta checksum=")[1].split()[0]
            for _, line in run.lines if "theta checksum=" in line}


def test_the_digits_train_with_identical_copies_in_generations_of_both_workers(default_runs):
    # the bar and every process's end: test_examples_end_to_end.py
    run = default_runs[EXAMPLE]
    summary = run.summary()
    # --steps 2000 mini-batches, one per worker and generation: 1000 generations, all of them
    # with both workers' pairs
    assert summary["global_step"] == "1000" and summary["local_steps"] == "1000,1000", summary
    assert summary["short_generations"] == "0"
    sums = checksums(run)
    assert sorted(sums) == ["[worker0]", "[worker1]"] and len(set(sums.values())) == 1, sums
    # under a minute of training on this machine: 2000 mini-batches at 34 a second or more
    assert float(summary["steps_per_sec"]) * 60 >= 2000, summary


def test_a_rerun_resumes_from_the_chiefs_checkpoint_with_every_copy_alike(run_example, tmp_path):
    log_dir = str(tmp_path / "resume")
    first = run_example(EXAMPLE, "--steps", "200", log_dir=log_dir)
    assert first.code == 0 and first.summary()["global_step"] == "100", first.output[-3000:]
    # theta itself comes back, not only the step: a rerun with no generation left scores
    # exactly what the first run scored (Adam's moments come back too: the rule test above)
    again = run_example(EXAMPLE, "--steps", "200", log_dir=log_dir)
    assert again.code == 0, again.output[-3000:]
    assert "resuming from the checkpoint at global step 100" in again.output
    assert again.summary()["test_accuracy"] == first.summary()["test_accuracy"], (
        again.summary(), first.summary())
    # and worker 1, which asked for a copy when no generation was left, took the one the chief
    # left at its end
    assert len(set(checksums(again).values())) == 1 and len(checksums(again)) == 2, again.output
    second = run_example(EXAMPLE, "--steps", "400", log_dir=log_dir)
    assert second.code == 0, second.output[-3000:]
    assert "resuming from the checkpoint at global step 100" in second.output
    summary = second.summary()
    assert summary["global_step"] == "200" and summary["local_steps"] == "100,100", summary
    # the chief's restored copy reached the other worker: the copies end alike
    assert len(set(checksums(second).values())) == 1, checksums(second)
    assert float(summary["test_accuracy"]) > float(first.summary()["test_accuracy"]) - 0.05


def test_an_odd_population_or_a_zero_sigma_is_refused_in_one_line():
    from support.examples import error_lines, run_train
    for flag, value in (("--population", "7"), ("--sigma", "0")):
        code, _, stderr = run_train(EXAMPLE, ["--job_name", "worker", flag, value, "--ps_hosts",
                                              "localhost:1", "--worker_hosts", "localhost:2"])
        assert code == 2
        assert error_lines(stderr) == [
            "error: --population must be even (antithetic pairs), got 7" if flag == "--population"
            else "error: --sigma must be positive, got 0"], stderr


# ==================================================================================================
# Bytes on the wire, every task a host of its own (benchmarks/cluster.py: root, ip and tc)
# ==================================================================================================
def cluster_bytes(tmp_path, hidden, population, steps):
    """Total bytes every host sent in a run of --steps mini-batches (steps/2 generations)."""
    tag = "h%d-p%d-s%d" % (hidden, population, steps)
    proc = start_tool([EXAMPLE, "--timeout", "300", "--log_dir", str(tmp_path / tag), "--",
                       "--steps", str(steps), "--hidden", str(hidden), "--population",
                       str(population), "--log_every", "1000"])
    try:
        run = finish(proc, timeout=360)
    finally:
        assert_run_left_nothing(proc, tmp_path)
    assert run.code == 0, run.output[-3000:]
    report = summary_of(run.output, "cluster")
    assert report["mini_batches"] == str(steps), report
    return float(report["total_bytes"])


def bytes_per_generation(tmp_path, hidden, population):
    """(bytes per worker and generation, bytes of the one-time start): two runs of 20 and 60
    generations, so that the start, the same in both, drops out of their difference."""
    short, long = (cluster_bytes(tmp_path, hidden, population, steps) for steps in (40, 120))
    per_generation = (long - short) / (2 * 40)
    return per_generation, short - 2 * 20 * per_generation


@pytest.mark.benchmark  # a measurement: the ps's port checks add bytes by the second, not by
@pytest.mark.cluster     # the generation, and one run in the full suite read 0.55 of the other
@pytest.mark.timeout(900)  # six runs
def test_the_bytes_of_a_generation_do_not_grow_with_the_model(tmp_path):
    from support.namespaces import missing_for_namespaces
    if missing_for_namespaces():
        pytest.skip(missing_for_namespaces())
    default, _ = bytes_per_generation(tmp_path, 128, 50)
    assert default < 10e3, default  # a few kilobytes per worker and generation, by default
    # with a model 32 times bigger (1.2 MB), the same. (One pair per worker keeps the pace of a
    # generation close at both sizes: the ps checks the workers' ports a few times a second, a
    # few hundred bytes each time, which a slower generation would otherwise count as its own.)
    small, small_start = bytes_per_generation(tmp_path, 128, 2)
    large, large_start = bytes_per_generation(tmp_path, 4096, 2)
    assert abs(large / small - 1) < 0.1, (small, large)
    # what grows is the one-time start: the chief's theta to the ps, and on to worker 1
    model_bytes = 4 * (64 * 4096 + 4096 + 4096 * 10 + 10)
    assert large_start - small_start > 1.5 * model_bytes, (small_start, large_start)
    print("bytes per worker and generation: %.0f (hidden 128, population 50); %.0f and %.0f "
          "(hidden 128 and 4096, population 2); one-time start %.0f and %.0f"
          % (default, small, large, small_start, large_start))
