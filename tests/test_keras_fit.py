"""Keras-Fit: a tf_keras model trained by model.fit under ParameterServerStrategy (a coordinator,
a ps and workers) or MultiWorkerMirroredStrategy; the model saved in Keras' format loads in a
fresh process; a worker lost mid-fit and a ps lost end as each strategy allows, and a rerun
resumes from BackupAndRestore's backup and trains to exactly --steps, reading its data in an
order of its own. Every run uses the environment a user has (Keras loaded: USERS_ENVIRONMENT),
since the example needs tf_keras."""
import os
import signal
import subprocess
import sys
import time

import pytest

from support.examples import (ACCURACY_BAR, ROOT, USERS_ENVIRONMENT, environment_without_tf_config,
                              error_lines, example_dir, run_train_noting_tensorflow)
from support.processes import assert_nothing_left, free_ports
from support.runs import finish, read_until, start_example, started_pid
from support.strategies import assert_a_resumed_run_reads_its_data_in_an_order_of_its_own

EXAMPLE = "Keras-Fit"
MIRRORED = ["--strategy", "multi_worker_mirrored"]


def users_env(**more):
    """This process's environment as a user has it (Keras loads), less TF_CONFIG, plus more."""
    env = environment_without_tf_config(dict(USERS_ENVIRONMENT, **more))
    return {k: v for k, v in env.items() if v is not None}


def accuracy_of_the_saved_model_in_a_fresh_process(path):
    """tf_keras.models.load_model(path) in a process of its own: its accuracy on the digits'
    test set (the class of the largest logit)."""
    script = (
        "import numpy as np, tf_keras\n"
        "from sklearn.datasets import load_digits\n"
        "from sklearn.model_selection import train_test_split\n"
        "x, y = load_digits(return_X_y=True)\n"
        "_, x_test, _, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)\n"
        "model = tf_keras.models.load_model(%r)\n"
        "logits = model.predict((x_test / 16).astype(np.float32), verbose=0)\n"
        "print('accuracy=%%.6f' %% np.mean(logits.argmax(axis=1) == y_test))\n" % path)
    proc = subprocess.run([sys.executable, "-c", script], env=users_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(proc.stdout.split("accuracy=")[1].split()[0])


def test_bad_flags_fail_in_one_line_before_tensorflow_loads():
    code, _, stderr, loaded = run_train_noting_tensorflow(EXAMPLE, ["--strategy", "horovod"])
    assert code == 2 and not loaded
    (line,) = error_lines(stderr)
    assert line.startswith("error: argument --strategy: invalid choice: 'horovod'"), stderr
    assert "multi_worker_mirrored" in line and "parameter_server" in line, line
    code, _, stderr, loaded = run_train_noting_tensorflow(
        EXAMPLE, MIRRORED + ["--job_name", "ps", "--worker_hosts", "localhost:2"])
    assert code == 2 and not loaded
    assert error_lines(stderr) == ["error: unknown job name 'ps': use worker"]
    code, _, stderr, loaded = run_train_noting_tensorflow(
        EXAMPLE, ["--job_name", "chief", "--worker_hosts", "localhost:2", "--ps_hosts",
                  "localhost:3", "--chief_host", "localhost:4", "--data_path", "missing.npz"])
    assert code == 2 and not loaded and len(error_lines(stderr)) == 1
    assert error_lines(stderr)[0].startswith("error: cannot load missing.npz"), stderr


def test_the_parameter_server_run_saves_a_model_that_loads_in_a_fresh_process_with_its_accuracy(
        default_runs):
    # the bar, the progress lines and every process's end: test_examples_end_to_end.py
    run = default_runs[EXAMPLE]
    summary = run.summary()
    assert summary["strategy"] == "parameter_server" and summary["ps"] == "1", summary
    assert summary["global_step"] == "2000", summary  # mini-batches: one a step, on a worker
    assert summary["mini_batches"] == "2000", summary  # what the benchmarks count bytes per
    # local_steps: the mini-batches each worker's shard gave (the coordinator picks the worker)
    local_steps = [int(s) for s in summary["local_steps"].split(",")]
    assert len(local_steps) == 2 and sum(local_steps) == 2000 and min(local_steps) > 0, summary
    assert os.path.isfile(os.path.join(run.log_dir, "train", os.listdir(
        os.path.join(run.log_dir, "train"))[0]))  # TensorBoard's callback wrote its curves
    saved = os.path.join(run.log_dir, "model.keras")
    assert accuracy_of_the_saved_model_in_a_fresh_process(saved) == pytest.approx(
        float(summary["test_accuracy"]), abs=1e-5)


def test_under_multi_worker_mirrored_the_workers_fit_in_lockstep_to_the_bar_and_save_the_model(
        run_example):
    run = run_example(EXAMPLE, *MIRRORED, env=USERS_ENVIRONMENT, timeout=240)
    assert run.code == 0, run.output[-3000:]
    summary = run.summary()
    assert summary["global_step"] == "1000" and summary["local_steps"] == "1000,1000", summary
    assert summary["mini_batches"] == "2000", summary  # N a step
    assert summary["ps"] == "0" and summary["learning_rate_eff"] == "0.2", summary
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR, summary
    # both workers saw the same loss at every epoch's end: one model, in step
    losses = {}
    for line in run.output.splitlines():
        if " global_step=" in line and " loss=" in line:
            role, step = line.split("]")[0][1:], line.split("global_step=")[1].split()[0]
            losses.setdefault(step, {})[role] = line.split("loss=")[1].split()[0]
    assert losses and all(len(set(by_role.values())) == 1 and len(by_role) == 2
                          for by_role in losses.values()), losses
    saved = os.path.join(run.log_dir, "model.keras")
    assert accuracy_of_the_saved_model_in_a_fresh_process(saved) == pytest.approx(
        float(summary["test_accuracy"]), abs=1e-5)
    assert not [n for n in os.listdir(run.log_dir) if n.startswith("workertemp")]


def test_a_worker_killed_mid_fit_and_restarted_gets_a_dataset_again_and_fit_completes(tmp_path):
    """ParameterServerStrategy: SIGKILL worker 1 mid-fit and start it again on its address. The
    coordinator runs the lost worker's calls on worker 0 meanwhile, makes the restarted worker
    its dataset again (the worker prints its shard as it makes it) and fit completes. A call in
    flight on the killed worker is run again from its start, and the steps of it that had
    reached the ps stay applied: at most K - 1 mini-batches beyond --steps."""
    # long enough to be running still once worker 1 is back, also on a machine so loaded that
    # its restart (TensorFlow's import) takes half a minute
    steps, k = 8000, 10
    proc = start_example(EXAMPLE, ["--log_dir", str(tmp_path / "logs"), "--steps", str(steps)],
                         env=USERS_ENVIRONMENT)
    seen = read_until(proc, "[chief0] global_step=", timeout=180)
    pid = started_pid(seen, "worker1")
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        command = [a.decode() for a in f.read().split(b"\0") if a]
    os.kill(pid, signal.SIGKILL)
    restarted = subprocess.Popen(command, env=users_env(PYTHONUNBUFFERED="1"),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run = finish(proc, timeout=300)
        output, _ = restarted.communicate(timeout=90)
    finally:
        if restarted.poll() is None:
            restarted.kill()
        restarted.wait()
    summary = run.summary()
    assert steps <= int(summary["global_step"]) < steps + k, summary
    assert float(summary["test_accuracy"]) >= ACCURACY_BAR, summary
    assert summary["lost_workers"] == "0", summary  # back by the end
    assert "[worker1] training on shard 1 of 2" in output, output[-3000:]
    assert restarted.returncode == 0 and "is gone; shutting down" in output, output[-3000:]
    assert run.code == 1 and "[run.sh] failed: worker1 (exit 137)" in run.output, \
        run.output[-3000:]
    assert_nothing_left(str(tmp_path))


def test_a_run_stopped_at_its_steps_mid_epoch_resumes_and_ends_at_exactly_the_new_steps(tmp_path):
    """ParameterServerStrategy, an epoch of --backup_every 200 steps: --steps 300 stops fit
    mid-epoch (BackupAndRestore backs up as that epoch ends, at 300); the same --log_dir with
    --steps 600 resumes there and trains 300 more, not on to the end of the epoch after the one
    backed up (500); and once more with --steps 600 it trains nothing."""
    flags = ["--log_dir", str(tmp_path / "logs"), "--backup_every", "200"]
    runs = [finish(start_example(EXAMPLE, flags + ["--steps", steps], env=USERS_ENVIRONMENT),
                   timeout=240) for steps in ("300", "600", "600")]
    for run in runs:
        assert run.code == 0, run.output[-3000:]
    assert [(run.summary()["global_step"], run.summary()["updates"]) for run in runs] == [
        ("300", "300"), ("600", "300"), ("600", "0")], [run.summary() for run in runs]
    for run, step in zip(runs[1:], (300, 600)):
        assert "[chief0] resuming from the backup at global step %d" % step in run.output
    assert_nothing_left(str(tmp_path))


def test_a_resumed_fit_reads_its_shard_in_an_order_of_its_own():
    # the dataset function mixes in the global step (the optimizer's iterations), restored
    # before fit makes the datasets
    assert_a_resumed_run_reads_its_data_in_an_order_of_its_own(EXAMPLE)


def test_a_killed_mirrored_worker_stops_the_run_and_a_rerun_resumes_from_the_backup_at_the_step_it_reached(
        tmp_path):
    """MultiWorkerMirroredStrategy: SIGKILL worker 1 after global step 200; worker 0 stops in
    one line. The same command with the same --log_dir then resumes where BackupAndRestore
    last backed up (every --backup_every 70 steps here, an epoch's end), not from 0, and trains
    on to exactly --steps."""
    log_dir = str(tmp_path / "logs")
    flags = MIRRORED + ["--log_dir", log_dir, "--log_every", "100", "--backup_every", "70"]
    proc = start_example(EXAMPLE, flags + ["--steps", "40000"], env=USERS_ENVIRONMENT)
    seen = read_until(proc, "[worker0] global_step=200 ", timeout=180)
    os.kill(started_pid(seen, "worker1"), signal.SIGKILL)
    killed_at = time.time()
    run = finish(proc, timeout=90)
    assert run.code == 1 and time.time() - killed_at < 60, run.output[-3000:]
    assert "[worker0] error: worker 0 stopped: " in run.output, run.output[-3000:]
    assert "Traceback" not in run.output, run.output[-3000:]
    assert_nothing_left(str(tmp_path))
    again = finish(start_example(EXAMPLE, flags + ["--steps", "1400"], env=USERS_ENVIRONMENT),
                   timeout=240)
    assert again.code == 0, again.output[-3000:]
    resumed = {l.split("]")[0][1:]: int(l.split()[-1]) for l in again.output.splitlines()
               if "resuming from the backup at global step" in l}
    assert sorted(resumed) == ["worker0", "worker1"], again.output[-3000:]
    step = resumed["worker0"]
    assert resumed["worker1"] == step and step >= 140 and step % 70 == 0, resumed
    summary = again.summary()  # on to --steps 1400: 700 steps of two mini-batches
    assert summary["global_step"] == "700" and int(summary["updates"]) == 700 - step, summary
    assert_nothing_left(str(tmp_path))


def test_a_lost_ps_ends_the_run_in_one_line_that_says_so_and_how_to_resume(tmp_path):
    """ParameterServerStrategy, each task started by hand (no launcher to stop the others):
    SIGKILL the ps mid-fit; the coordinator ends in one line naming the lost ps, and the
    workers end once it has gone."""
    ports = free_ports(4)
    hosts = ["--ps_hosts", "localhost:%d" % ports[0], "--worker_hosts",
             "localhost:%d,localhost:%d" % (ports[1], ports[2]), "--chief_host",
             "localhost:%d" % ports[3], "--log_dir", str(tmp_path / "logs"), "--steps", "200000",
             "--connect_timeout", "60"]
    env = users_env(PYTHONUNBUFFERED="1")
    procs = {}
    try:
        for job, index in (("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0)):
            procs["%s%d" % (job, index)] = subprocess.Popen(
                [sys.executable, os.path.join(example_dir(EXAMPLE), "train.py"), "--job_name", job,
                 "--task_index", str(index)] + hosts, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
        chief = procs["chief0"]
        read_until(chief, "global_step=", timeout=180)
        procs["ps0"].kill()
        killed_at = time.time()
        _, stderr = chief.communicate(timeout=90)
        assert time.time() - killed_at < 60
        assert chief.returncode == 2, stderr[-3000:]
        assert error_lines(stderr) == [
            "error: chief 0 stopped: ps 0 is gone, and the variables on it (TensorFlow cannot "
            "recover a lost ps); start the run again with --log_dir %s to resume from its last "
            "backup" % (tmp_path / "logs")], stderr[-3000:]
        for role in ("worker0", "worker1"):
            assert procs[role].wait(timeout=60) == 0, role
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert_nothing_left(str(tmp_path))


def test_tfrecord_files_of_images_and_three_classes_train_with_no_code_changed(tmp_path):
    """--data_path a folder of TFRecord files (tools/npz_to_tfrecord.py): 8x8 images without a
    channel axis, three classes; each worker reads its own files; the Model section's
    Flatten and the last layer's width follow the data."""
    import numpy as np
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    keep = y < 3
    x, y = (x[keep].reshape(-1, 8, 8) * 16).astype(np.uint8), y[keep]  # pixels 0-255
    np.savez(tmp_path / "three.npz", x_train=x[::2], y_train=y[::2], x_test=x[1::2],
             y_test=y[1::2])
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "npz_to_tfrecord.py"),
                    str(tmp_path / "three.npz"), str(tmp_path / "records"), "--shards", "4"],
                   check=True, capture_output=True, timeout=120, env=users_env())
    run = finish(start_example(EXAMPLE, ["--log_dir", str(tmp_path / "logs"), "--data_path",
                                         str(tmp_path / "records"), "--steps", "600"],
                               env=USERS_ENVIRONMENT), timeout=240)
    assert run.code == 0, run.output[-3000:]
    assert float(run.summary()["test_accuracy"]) >= 0.9, run.summary()
    for worker in (0, 1):
        assert "[worker%d] training on shard %d of 2" % (worker, worker) in run.output
    assert_nothing_left(str(tmp_path))
