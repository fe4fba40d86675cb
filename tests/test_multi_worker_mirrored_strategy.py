"""MultiWorkerMirroredStrategy: every worker a full copy, gradients summed by all-reduce; copies
stay identical; a lost worker stops the others in one line, and a rerun resumes, reading its data
in an order of its own; a worker whose peers never come ends in one line."""
import glob
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from support.examples import (environment_without_tf_config, error_lines, example_dir,
                              load_train_module, run_train, run_train_noting_tensorflow)
from support.in_process import flags
from support.processes import assert_nothing_left, free_ports
from support.runs import finish, read_until, start_example, started_pid, summary_of
from support.strategies import (assert_a_resumed_run_reads_its_data_in_an_order_of_its_own,
                                assert_one_sgd_step_of, one_strategy_step)

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


@pytest.mark.rule
def test_every_pack_size_applies_the_same_mean_gradient_and_reports_the_mean_loss():
    # the default packs every gradient (and the loss) into one collective; a pack a variable
    # is the other end: both must make the same step, and return the loss of the whole dataset
    import tensorflow as tf
    module = load_train_module(EXAMPLE)
    steps = {}
    for pack in ("0", "1"):
        ports = "%d,%d" % tuple(free_ports(2))
        steps[pack] = one_strategy_step(EXAMPLE, ports, "--bytes_per_pack", pack, processes=2)
    for step in steps["0"] + steps["1"]:
        assert_one_sgd_step_of(step, EXAMPLE, learning_rate=2 * 0.1)
        names = [k[len("before_"):] for k in step if k.startswith("before_")]
        whole = module.model_loss({n: tf.constant(step["before_" + n]) for n in names},
                                  step["x"], tf.constant(step["y"]))
        np.testing.assert_allclose(step["loss"], float(whole), rtol=1e-5)
    for key in steps["0"][0]:
        np.testing.assert_allclose(steps["0"][0][key], steps["1"][0][key], rtol=1e-5, atol=1e-7,
                                   err_msg=key)


def test_a_resumed_run_reads_its_shard_in_an_order_of_its_own():
    assert_a_resumed_run_reads_its_data_in_an_order_of_its_own(EXAMPLE)


def test_a_worker_whose_chief_never_comes_ends_in_one_line_that_names_it():
    # the strategy's own start waits for every worker without a bound, and ignores SIGTERM
    missing, mine = free_ports(2)
    started = time.time()
    code, _, stderr = run_train(EXAMPLE, ["--job_name", "worker", "--task_index", "1",
                                          "--worker_hosts", "localhost:%d,localhost:%d" % (
                                              missing, mine), "--connect_timeout", "3"],
                                timeout=120)
    assert code == 2 and time.time() - started < 100, stderr
    assert error_lines(stderr) == ["error: worker 1: the chief (worker 0) at localhost:%d did not "
                                   "come up within 3 s" % missing], stderr


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


@pytest.fixture
def google_cloud_metadata():
    """A metadata server that answers like Google Cloud's (any path: 200, Metadata-Flavor:
    Google): its address, for GCE_METADATA_IP. TensorFlow 2.21's PreemptionCheckpointHandler
    then takes the machine for a Google Cloud CPU VM, where by itself it watches no signal."""
    class Metadata(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Metadata-Flavor", "Google")
            self.end_headers()
            self.wfile.write(b"NONE")

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("victim", ["worker1", "worker0"])
def test_a_sigterm_saves_a_checkpoint_at_one_step_on_every_worker_and_the_rerun_resumes_there(
        tmp_path, victim, google_cloud_metadata):
    """What Kubernetes sends a pod before it stops it: every worker stops after the same step,
    the chief's checkpoint is that step (not the last progress line's), every worker exits 42,
    and the restarted run resumes from it. There worker 1's --log_dir is a folder of its own
    (a pod's emptyDir), without the checkpoint: it takes the chief's step, and a SIGTERM stops
    both at one step again (every worker counts its steps alike). All of it on what TensorFlow
    takes for a Google Cloud CPU VM, where by itself it would watch no signal."""
    log_dir = str(tmp_path / "logs")
    (tmp_path / "tmp").mkdir()
    env = {"TMPDIR": str(tmp_path / "tmp"), "GCE_METADATA_IP": google_cloud_metadata}
    proc = start_example(EXAMPLE, ["--log_dir", log_dir, "--steps", "40000", "--log_every",
                                   "100"], env)
    seen = read_until(proc, "[worker0] global_step=200 ", timeout=180)
    os.kill(started_pid(seen, victim), signal.SIGTERM)
    run = finish(proc, timeout=60)
    step = stopped_at_one_step(run.output, log_dir, env)
    assert step > 200
    assert run.code == 42 and "[run.sh] failed" not in run.output, run.output[-3000:]
    assert ("[run.sh] preempted: the workers saved one step's checkpoint and exited 42; resume "
            "with: NUM_WORKERS=2 bash ") in run.output, run.output[-3000:]
    assert_nothing_left(str(tmp_path))
    next_progress = (step // 100 + 1) * 100
    codes, outputs = run_workers([log_dir, str(tmp_path / "worker1")], "--steps", "40000",
                                 "--log_every", "100", env=env,
                                 sigterm=(victim, "[worker0] global_step=%d " % next_progress))
    assert codes == [42, 42], outputs
    assert "[worker0] resuming from the checkpoint at global step %d" % step in outputs[0]
    assert ("[worker1] resuming at the chief's global step %d, with its weights (this worker's "
            "--log_dir gave step 0)" % step) in outputs[1], outputs[1]
    assert stopped_at_one_step("\n".join(outputs), log_dir, env) > next_progress
    assert_nothing_left(str(tmp_path))


def stopped_at_one_step(output, log_dir, env):
    """The step at which every worker stopped after a SIGTERM, checked: the same on both, the
    chief's latest checkpoint, one line each and no scratch checkpoints left (in env's TMPDIR)."""
    stopped = {l.split("]")[0][1:]: int(l.split("at global step ")[1].split(":")[0])
               for l in output.splitlines() if "stopped by SIGTERM at global step" in l}
    assert sorted(stopped) == ["worker0", "worker1"], output[-3000:]
    assert stopped["worker1"] == stopped["worker0"], output[-3000:]
    assert os.path.basename(tf_latest_checkpoint(log_dir)) == "ckpt-%d" % stopped["worker0"]
    assert "Traceback" not in output and "set no SIGTERM handler" not in output, output[-3000:]
    assert not glob.glob(os.path.join(env["TMPDIR"], "checkpoint-scratch-*"))
    return stopped["worker0"]


def test_a_worker_whose_log_dir_lacks_the_chiefs_checkpoint_takes_its_step_and_weights(
        tmp_path, default_runs):
    # worker 1 with a --log_dir of its own (a pod's emptyDir), empty; the chief's holds the
    # default run's checkpoint, at global step 1000
    chiefs = str(tmp_path / "chief")
    shutil.copytree(default_runs[EXAMPLE].log_dir, chiefs)
    codes, outputs = run_workers([chiefs, str(tmp_path / "worker1")], "--steps", "2200",
                                 "--log_every", "100")
    assert codes == [0, 0], outputs
    assert ("[worker1] resuming at the chief's global step 1000, with its weights (this "
            "worker's --log_dir gave step 0)") in outputs[1], outputs[1]
    assert summary_of(outputs[0], "worker0")["updates"] == "100"
    sums = checksums(outputs[0] + outputs[1])
    assert sorted(sums) == ["worker0", "worker1"] and len(set(sums.values())) == 1, sums
    assert_nothing_left(str(tmp_path))


def run_workers(log_dirs, *args, env=None, sigterm=None, timeout=180):
    """Worker i of a cluster on localhost with --log_dir log_dirs[i], each train.py started by
    hand (run.sh gives every worker the same flags), run to its end: their exit codes and
    outputs. sigterm: (role, text), a SIGTERM to role once worker 0 has printed text."""
    hosts = ",".join("localhost:%d" % port for port in free_ports(len(log_dirs)))
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(example_dir(EXAMPLE), "train.py"), "--job_name", "worker",
         "--task_index", str(i), "--worker_hosts", hosts, "--log_dir", log_dir] + list(args),
        env=environment_without_tf_config(env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i, log_dir in enumerate(log_dirs)]
    lines = [[] for _ in procs]
    readers = [threading.Thread(target=lambda p=proc, l=lines[i]: l.extend(p.stdout), daemon=True)
               for i, proc in enumerate(procs)]
    for reader in readers:
        reader.start()
    deadline = time.time() + timeout
    try:
        if sigterm:
            role, text = sigterm
            while not any(text in line for line in list(lines[0])):
                assert time.time() < deadline and procs[0].poll() is None, "".join(lines[0])
                time.sleep(0.1)  # the pace of the checks
            os.kill(procs[int(role[len("worker"):])].pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=max(1, deadline - time.time()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for reader in readers:
            reader.join(10)
    return [proc.returncode for proc in procs], ["".join(l) for l in lines]


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


def test_the_handler_is_kept_from_google_cloud_by_its_platform_check_not_by_the_environment(
        google_cloud_metadata, monkeypatch):
    # the fake metadata server answers like Google Cloud's: TensorFlow's own check says so, but
    # not while the handler starts; the environment is the same throughout (other threads run)
    from tensorflow.python.distribute.failure_handling import failure_handling_util as platform
    module = load_train_module(EXAMPLE)
    monkeypatch.setenv("GCE_METADATA_IP", google_cloud_metadata)
    assert platform.detect_platform() == platform.PlatformDevice.GCE_CPU
    environment = dict(os.environ)
    with module.google_cloud_unseen():
        assert dict(os.environ) == environment
        assert platform.detect_platform() == platform.PlatformDevice.INTERNAL_CPU
    assert platform.detect_platform() == platform.PlatformDevice.GCE_CPU
    assert dict(os.environ) == environment
