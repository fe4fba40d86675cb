"""bash run.sh started in a session of its own, its output read line by line with arrival times,
finished within a bound; a task killed mid-run; the tasks of a cluster started one by one."""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from support.examples import USERS_ENVIRONMENT, environment_without_tf_config, example_dir
from support.processes import assert_nothing_left, free_ports, interruptible
import example_runs  # noqa: E402  benchmarks/ (on the path: support.processes)

scalars = example_runs.scalars  # the chief's TensorBoard scalars, read as the benchmarks read them


def summary_of(output, role=None):
    """The last summary line of the output (of one role, [worker0] or [cluster], if given) as a
    dict of strings."""
    start = "[%s] summary " % role if role else None
    lines = [l for l in output.splitlines()
             if (l.startswith(start) if start else "] summary " in l)]
    assert lines, "no %ssummary line in the output:\n%s" % (start or "", output[-3000:])
    return dict(kv.split("=", 1) for kv in lines[-1].split("] summary ", 1)[1].split())


class Run(object):
    """What run.sh printed, line by line with arrival times, and its exit code."""

    def __init__(self, code, lines, seconds):
        self.code, self.lines, self.seconds = code, lines, seconds
        self.output = "\n".join(line for _, line in lines)

    def summary(self):
        """The chief's summary line as a dict of strings."""
        return summary_of(self.output)

    def first_time(self, text):
        """When the first line containing text arrived (seconds since the epoch)."""
        for t, line in self.lines:
            if text in line:
                return t
        pytest.fail("no line containing %r in:\n%s" % (text, self.output[-3000:]))


def start_example(example, args, env=None):
    """Start the example's bash run.sh in its own session (start_run_sh)."""
    return start_run_sh(example_dir(example), args, env)


def start_run_sh(folder, args, env=None):
    """Start bash run.sh of folder (an example, or a copy of one) in its own session, so a test
    can always stop all of it. env: values to set in this process's environment for it (None:
    to remove)."""
    full_env = {k: v for k, v in dict(os.environ, **(env or {})).items() if v is not None}
    return subprocess.Popen(["bash", os.path.join(folder, "run.sh")] + list(args), cwd=folder,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=interruptible)


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


def run_example(example, folder, *args, env=None, timeout=180, log_dir=None):
    """run.sh with args to the end, its log_dir folder/logs unless given (folder: a test's own
    temp path, which no process may hold on its command line afterwards). The Run knows its
    log_dir."""
    log_dir = log_dir or os.path.join(str(folder), "logs")
    run = finish(start_example(example, ["--log_dir", log_dir] + list(args), env), timeout)
    assert_nothing_left(str(folder))
    run.log_dir = log_dir
    return run


class DefaultRuns(object):
    """Each example's run.sh with its defaults, run the first time a test asks for it and kept
    for every later test of the session: runs[example]. runs.short(example) is a short run of the same kind, for the quick tier:
    its first SHORT_STEPS mini-batches, kept apart from the whole run. Both run in the
    environment a user has (USERS_ENVIRONMENT: TensorFlow loads Keras, as it does for users).

    Under pytest-xdist every worker process has a session of its own: the first worker to ask
    for a run makes it, holding a lock on it, and leaves it on disk for the others, so that
    each run happens once however the tests are spread over the workers."""
    SHORT_STEPS = 300

    def __init__(self, tmp_path_factory):
        self.folder = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):  # basetemp/popen-gwN: one folder per worker
            self.folder = self.folder.parent
        self.runs = {}

    def __getitem__(self, example):
        return self._run(example, "defaults", [])

    def short(self, example):
        # a progress line every 100 mini-batches (Sparse-Embeddings-TF2's default is 500)
        return self._run(example, "short", ["--steps", str(self.SHORT_STEPS), "--log_every",
                                            "100"])

    def _run(self, example, kind, args):
        if (example, kind) not in self.runs:
            folder = self.folder / ("%s_%s" % (example, kind))
            with open(str(folder) + ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                saved = folder / "run.json"
                if not saved.exists():
                    shutil.rmtree(str(folder), ignore_errors=True)  # a failed try's, if any
                    folder.mkdir()
                    run = run_example(example, folder, *args, env=USERS_ENVIRONMENT,
                                      timeout=240)
                    saved.write_text(json.dumps(dict(
                        code=run.code, lines=run.lines, seconds=run.seconds,
                        log_dir=run.log_dir)))
                fields = json.loads(saved.read_text())
            run = Run(fields["code"], [tuple(l) for l in fields["lines"]], fields["seconds"])
            run.log_dir = fields["log_dir"]
            self.runs[example, kind] = run
        return self.runs[example, kind]


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


def started_pid(output, role):
    """The pid of role from run.sh's `[run.sh] started ROLE pid=N` line."""
    return int(output.split("started %s pid=" % role)[1].split()[0])


def kill_mid_run(example, tmp_path, args=(), victim="worker1", env=None, timeout=180):
    """Start run.sh, SIGKILL one worker after its first progress line, let the rest finish.

    Returns the Run, with killed_at (seconds since the epoch) set."""
    proc = start_example(example, ["--log_dir", str(tmp_path / "logs"), "--log_every", "50"]
                         + list(args), env)
    seen = read_until(proc, "[%s] local_step=" % victim, timeout=120)
    os.kill(started_pid(seen, victim), signal.SIGKILL)
    killed_at = time.time()
    run = finish(proc, timeout=timeout)
    run.killed_at = killed_at
    return run


class Tasks(object):
    """The tasks of one cluster of an example on localhost (ps tasks, 1 by default, and
    workers), started one by one as a test says (no run.sh); each task's output is collected in
    a thread (with arrival times) and all of them are stopped at the end whatever happened."""

    def __init__(self, example, tmp_path, workers, *args, ps=1):
        hosts = ["localhost:%d" % port for port in free_ports(ps + workers)]
        cluster = (["--ps_hosts", ",".join(hosts[:ps])] if ps else []) + [
            "--worker_hosts", ",".join(hosts[ps:])]
        self.common = [sys.executable, os.path.join(example_dir(example), "train.py")] + \
            cluster + ["--log_dir", str(tmp_path / "logs")] + list(args)
        self.env = environment_without_tf_config()
        self.procs, self.lines = {}, {}

    def start(self, job, index=0):
        role = "%s%d" % (job, index)
        proc = subprocess.Popen(self.common + ["--job_name", job, "--task_index", str(index)],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        self.procs[role], lines = proc, self.lines.setdefault(role, [])
        threading.Thread(target=lambda: [lines.append((time.time(), l.rstrip("\n")))
                                         for l in proc.stdout], daemon=True).start()
        return proc

    def wait_for_line(self, role, text, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(text in line for _, line in self.lines[role]):
                return
            assert self.procs[role].poll() is None or any(
                text in line for _, line in self.lines[role]), self.output(role)
            time.sleep(0.1)
        raise AssertionError("no %r from %s in %g s:\n%s" % (text, role, timeout,
                                                            self.output(role)))

    def output(self, role):
        return "\n".join(line for _, line in self.lines[role])

    def summary(self, role="worker0"):
        return summary_of(self.output(role), role)

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
