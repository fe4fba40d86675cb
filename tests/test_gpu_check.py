"""benchmarks/gpu_check.sh: without a GPU it says so in one line and exits 3 having run nothing;
its dry run goes through every check on the CPU and writes its table; each row says what failed;
on a machine with an NVIDIA GPU (marker gpu, skipped elsewhere) towers go to logical GPUs and
every check passes."""
import os
import shutil
import signal
import subprocess
import sys

import pytest

from support.examples import ROOT
from support.processes import assert_nothing_left

SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.sh")
HELPER = os.path.join(ROOT, "benchmarks", "gpu_check.py")
CHECKS = ["In-Graph-Replication: 2 towers on 2 logical", "Distributed-Setup: 2 workers on the",
          "Sync-SGD: 2 workers on the", "MultiWorkerMirroredStrategy: 2 workers sharing the",
          "Model-Parallel-Pipeline: 2 stages on 2 logical", "Non-Distributed-Setup --hidden 4096"]


def run(argv, timeout, env=None):
    """(exit status, stdout, stderr) of argv in a session of its own, all of it stopped after
    timeout."""
    proc = subprocess.Popen(argv, env=dict(os.environ, PYTHON=sys.executable, **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail("%s did not finish within %d s:\n%s" % (argv[1], timeout, (out + err)[-3000:]))
    return proc.returncode, out, err


def rows(table):
    """{check: result} of the table's rows."""
    cells = [line.strip("|").split(" | ") for line in table.splitlines()
             if line.startswith("| ") and not line.startswith("| check ")]
    return {c[0].strip(): c[1].strip() for c in cells}


def a_gpu_or_skip():
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi: this machine has no NVIDIA GPU")
    code, out, _ = run([sys.executable, "-c", "import tensorflow as tf; "
                        "print(len(tf.config.list_physical_devices('GPU')))"], timeout=120)
    if code != 0 or out.strip().splitlines()[-1:] == ["0"]:
        pytest.skip("TensorFlow sees no GPU (pip install -r deploy/requirements-gpu.txt)")


# --- Without a GPU --------------------------------------------------------------------------------
def test_without_a_gpu_it_says_so_in_one_line_and_exits_3_having_run_nothing(tmp_path):
    table = tmp_path / "gpu_check.md"
    code, out, err = run(["bash", SCRIPT, "--out", str(table)], timeout=30,
                         env={"CUDA_VISIBLE_DEVICES": ""})  # hidden, where there is one
    assert code == 3 and out == ""
    assert err.splitlines() == ["gpu_check: no NVIDIA GPU here (nvidia-smi lists none, or "
                                "CUDA_VISIBLE_DEVICES hides it): nothing was run; --dry-run "
                                "runs the same checks on the CPU"]
    assert os.listdir(tmp_path) == []  # no table, no logs


def test_a_flag_it_does_not_know_fails_in_one_line():
    code, out, err = run(["bash", SCRIPT, "--gpus", "2"], timeout=30)
    assert code == 2 and err == "gpu_check: error: unknown flag --gpus (see --help)\n"


def test_a_row_says_what_failed_a_timed_out_run_and_losses_that_differ(tmp_path):
    (tmp_path / "one.rc").write_text("0\n")
    (tmp_path / "two.rc").write_text("124\n")
    (tmp_path / "one.log").write_text("[local] global_step=20 loss=1.5000 test_accuracy=0.5\n")
    (tmp_path / "two.log").write_text(
        "[local] the model on 2 device(s): /device:CPU:0 /device:CPU:1\n"
        "[local] global_step=20 loss=1.5100 test_accuracy=0.5\n")
    code, out, _ = run([sys.executable, HELPER, "row", "towers", str(tmp_path)], timeout=30,
                       env={"GPU_CHECK_ON": "cpu"})
    assert code == 1
    result = rows(out)["In-Graph-Replication: 2 towers on 2 logical CPUs against 1 tower"]
    assert result == "FAILED: two exit 124 (timed out); losses differ by 0.01 (more than 0.002)"


@pytest.mark.benchmark  # about 2 minutes on 2 busy cores
@pytest.mark.timeout(660)
def test_the_dry_run_runs_every_check_on_the_cpu_and_writes_its_table(tmp_path):
    table = tmp_path / "gpu_check.md"
    code, out, err = run(["bash", SCRIPT, "--dry-run", "--out", str(table)], timeout=600)
    assert code == 0, out + err[-3000:]
    assert table.read_text() == out  # the file holds what stdout showed
    results = rows(out)
    assert results["GPU"] == "skipped" and results["TensorFlow"] == "ok"
    assert results["pip install -r deploy/requirements-gpu.txt"] == "skipped: a dry run"
    checks = list(results)[3:]  # after the GPU, the install and TensorFlow: one row a check
    assert len(checks) == len(CHECKS), out
    assert all(name.startswith(check) for name, check in zip(checks, CHECKS)), checks
    assert all(results[name] == "ok" for name in checks), out
    assert "0 check(s) failed" in out
    assert_nothing_left(str(tmp_path))


# --- On a GPU (skipped without one) ---------------------------------------------------------------
@pytest.mark.gpu
def test_on_a_gpu_two_logical_gpus_carry_a_tower_each(tmp_path):
    a_gpu_or_skip()
    code, out, err = run([sys.executable, HELPER, "towers", "In-Graph-Replication", "--devices",
                          "2", "--steps", "20", "--log_dir", str(tmp_path)], timeout=180)
    assert code == 0, err[-3000:]
    assert "[local] the model on 2 device(s): /device:GPU:0 /device:GPU:1" in out
    assert_nothing_left(str(tmp_path))


@pytest.mark.gpu
@pytest.mark.benchmark  # the whole check: under 10 minutes
@pytest.mark.timeout(660)
def test_on_a_gpu_every_check_passes(tmp_path):
    a_gpu_or_skip()
    table = tmp_path / "gpu_check.md"
    code, out, err = run(["bash", SCRIPT, "--no-install", "--out", str(table)], timeout=600)
    assert code == 0, out + err[-3000:]
    assert not [r for r, result in rows(out).items() if result.startswith("FAILED")], out
    assert_nothing_left(str(tmp_path))
