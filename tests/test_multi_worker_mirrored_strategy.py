"""MultiWorkerMirroredStrategy: every worker a full copy, gradients summed by all-reduce; copies
stay identical; a lost worker stops the others in one line, and a rerun resumes."""
import json
import os
import re
import signal
import time

import pytest

from support.examples import (ACCURACY_BAR, error_lines, load_train_module,
                              run_train_noting_tensorflow)
from support.in_process import flags
from support.processes import assert_nothing_left, free_ports
from support.runs import finish, read_until, start_example, started_pid
from support.strategies import assert_one_sgd_step_of, one_strategy_step

EXAMPLE = "MultiWorkerMirroredStrategy"


def checksums(output):
    return {l.split("]")[0][1:]: l.split("checksum=")[1] for l in output.splitlines()
            if "done: parameters checksum=" in l}


@pytest.mark.rule
def test_a_step_moves_every_copy_by_n_times_the_learning_rate_times_the_mean_gradient():
    # two workers, one synchronous step, each on a mini-batch that is its whole shard: the
    # mean of their gradients is that of the whole dataset; the rate is N = 2 times the flag's
    ports = "%d,%d" % tuple(free_ports(2))
    steps = one_strategy_step(EXAMPLE, ports, processes=2)
    for step in steps:
        assert_one_sgd_step_of(step, EXAMPLE, learning_rate=2 * 0.1)


def test_the_workers_train_in_lockstep_and_hold_identical_parameters(default_runs):
    # the bar and every process's end: test_examples_end_to_end.py
    run = default_runs[EXAMPLE]
    summary = run.summary()
    assert summary["global_step"] == "1000"  # 2000 mini-batches, two in every step
    assert summary["local_steps"] == "1000,1000" and summary["ps"] == "0"
    sums = checksums(run.output)
    assert sorted(sums) == ["worker0", "worker1"] and len(set(sums.values())) == 1, sums


def test_a_killed_worker_stops_the_other_in_one_line_and_a_rerun_resumes(tmp_path):
    log_dir = str(tmp_path / "logs")
    proc = start_example(EXAMPLE, ["--log_dir", log_dir, "--steps", "40000", "--log_every",
                                   "100"])
    seen = read_until(proc, "[worker0] global_step=200 ", timeout=180)
    os.kill(started_pid(seen, "worker1"), signal.SIGKILL)
    killed_at = time.time()
    run = finish(proc, timeout=60)
    assert run.code == 1 and time.time() - killed_at < 30
    assert ("[worker0] error: worker 0 stopped: UnavailableError: a peer is gone or did not "
            "answer in time") in run.output or ("[worker0] error: worker 0 stopped: "
                                                "DeadlineExceededError") in run.output, run.output
    assert "Traceback" not in run.output
    assert_nothing_left(str(tmp_path))
    again = finish(start_example(EXAMPLE, ["--log_dir", log_dir, "--steps", "600"]), timeout=180)
    assert again.code == 0, again.output[-3000:]
    resumed = {int(l.split()[-1]) for l in again.output.splitlines()
               if "resuming from the checkpoint at global step" in l}
    assert len(resumed) == 1 and 100 <= min(resumed) <= 300, again.output[-3000:]  # both
    summary = again.summary()  # on to --steps 600: 300 steps of two mini-batches
    assert summary["global_step"] == "300"
    assert int(summary["updates"]) == 300 - min(resumed)
    assert_nothing_left(str(tmp_path))


@pytest.mark.parametrize("victim", ["worker1", "worker0"])
def test_a_sigterm_saves_a_checkpoint_at_one_step_on_every_worker_and_the_rerun_resumes_there(
        tmp_path, victim):
    """What Kubernetes sends a pod before it stops it: every worker stops after the same step,
    the chief's checkpoint is that step (not the last progress line's), both exit 42, and the
    restarted run resumes from it."""
    log_dir = str(tmp_path / "logs")
    proc = start_example(EXAMPLE, ["--log_dir", log_dir, "--steps", "40000", "--log_every",
                                   "100"])
    seen = read_until(proc, "[worker0] global_step=200 ", timeout=180)
    os.kill(started_pid(seen, victim), signal.SIGTERM)
    run = finish(proc, timeout=60)
    stopped = {l.split("]")[0][1:]: int(l.split("at global step ")[1].split(":")[0])
               for l in run.output.splitlines() if "stopped by SIGTERM at global step" in l}
    assert sorted(stopped) == ["worker0", "worker1"], run.output[-3000:]
    step = stopped["worker0"]
    assert stopped["worker1"] == step and step > 200
    assert run.code != 0 and "[run.sh] failed: worker" in run.output  # run.sh names the first
    assert re.search(r"failed: worker[01] \(exit 42\)", run.output), run.output[-3000:]
    assert os.path.basename(tf_latest_checkpoint(log_dir)) == "ckpt-%d" % step
    assert "Traceback" not in run.output
    assert_nothing_left(str(tmp_path))
    again = finish(start_example(EXAMPLE, ["--log_dir", log_dir, "--steps", str(2 * step + 200)]),
                   timeout=180)
    assert again.code == 0, again.output[-3000:]
    assert again.output.count("resuming from the checkpoint at global step %d" % step) == 2
    summary = again.summary()
    assert int(summary["updates"]) == int(summary["global_step"]) - step == 100
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR
    assert_nothing_left(str(tmp_path))


def tf_latest_checkpoint(log_dir):
    """The checkpoint the 'checkpoint' file in log_dir names as the latest."""
    with open(os.path.join(log_dir, "checkpoint")) as f:
        line = f.readline()  # model_checkpoint_path: "ckpt-N"
    return os.path.join(log_dir, line.split('"')[1])


def test_bad_input_fails_in_one_line_before_tensorflow_loads():
    code, _, stderr, tensorflow_loaded = run_train_noting_tensorflow(
        EXAMPLE, ["--job_name", "ps", "--worker_hosts", "localhost:2"])
    assert code == 2 and error_lines(stderr) == ["error: unknown job name 'ps': use worker"]
    assert not tensorflow_loaded
    code, _, stderr, tensorflow_loaded = run_train_noting_tensorflow(
        EXAMPLE, ["--job_name", "worker", "--worker_hosts", "a:1,b"])
    assert code == 2 and error_lines(stderr) == [
        "error: worker hosts: 'b' is not host:port (for example localhost:2222)"]
    assert not tensorflow_loaded


# --- TF_CONFIG as users write it for TensorFlow 2 -------------------------------------------------
def test_a_chief_in_tf_config_is_worker_0_and_the_workers_come_after_it(monkeypatch):
    train = load_train_module(EXAMPLE)
    spec = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]}
    for task, role in [({"type": "chief", "index": 0}, ("worker", 0)),
                       ({"type": "worker", "index": 1}, ("worker", 2))]:
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": task}))
        args = flags(train)
        cluster = train.tf2_cluster(args, train.JOBS)
        assert cluster == {"worker": ["c:2222", "w0:2222", "w1:2222"]}
        assert (args.job_name, args.task_index) == role
        assert json.loads(os.environ["TF_CONFIG"]) == {"cluster": cluster, "task": {
            "type": role[0], "index": role[1]}}  # what the strategy reads
        assert args.connect_timeout == 600  # under TF_CONFIG pods may start minutes apart
