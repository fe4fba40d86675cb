"""Every example folder is self-contained, so its plumbing is copied: keep the copies equal, and
keep every train.py in the reading order that puts the algorithm first."""
import ast
import collections
import difflib
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize

import pytest

from support.examples import (DISTRIBUTED_EXAMPLES, EXAMPLES, ROOT, declared_jobs, example_dir,
                              load_module, sync_shared)

pytestmark = pytest.mark.quick  # seconds, and the first thing a change to a shared block breaks

BLOCK = re.compile(r"^# >>> shared: (.+?)\n(.*?)^# <<< shared: \1$", re.S | re.M)
# what every file of a family carries below its banner, by the family's reference train.py
NEEDED_BLOCKS = {
    "Non-Distributed-Setup": {"flags", "summary", "local run"},
    "Distributed-Setup": {"flags", "ps cluster", "tasks", "summary", "ps session"},
    "ParameterServerStrategy": {"flags", "tasks", "summary"},
    "In-Graph-Replication": {"flags", "tasks", "summary"},
}
# An appendix (the banner to the end) is paid in every copy: what it may hold at most, in lines,
# by family (what each holds: ../shared/reference/lean-and-slurm.md; the ps session alone is ~270)
APPENDIX_BUDGET = {"Non-Distributed-Setup": 270, "Distributed-Setup": 630,
                   "ParameterServerStrategy": 420, "In-Graph-Replication": 420}
ALLOWED_IMPORTS = {"argparse", "atexit", "collections", "contextlib", "json", "math", "os",
                   "shutil", "signal", "socket", "sys", "tempfile", "threading", "time",
                   "numpy", "tensorflow", "sklearn", "tf_keras"}  # tf_keras: a Keras model's copy
BANNER = "# Plumbing shared by every example (what a job needs besides its algorithm)"
SECTIONS = ["# --- Data (replace with your own) ", "# --- Model (replace with your own) ",
            "# --- The algorithm ", "# --- The training loop ", "\ndef main(", BANNER]


def family(example):
    return sync_shared.family(declared_jobs(example), example)


def read(example, name):
    with open(os.path.join(example_dir(example), name)) as f:
        return f.read()


def shared_blocks(text):
    return {name: body for name, body in BLOCK.findall(text)}


def test_every_example_folder_has_train_py_run_sh_and_a_readme():
    for example in EXAMPLES:
        for name in ("train.py", "run.sh", "README.md"):
            assert os.path.isfile(os.path.join(example_dir(example), name)), (example, name)


def test_the_examples_are_the_folders_the_repository_tracks_each_named_in_sync_shared():
    tracked = subprocess.run(["git", "ls-files", "*/train.py", "*/run.sh"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: " + tracked.stderr.strip())
    folders = collections.Counter(path.split("/")[0] for path in tracked.stdout.split())
    assert sorted(f for f, files in folders.items() if files == 2) == sorted(
        sync_shared.EXAMPLES)


def test_a_folder_copied_inside_the_repository_keeps_its_own_model_when_the_shared_text_is_synced(
        tmp_path):
    # the repository's examples and tools in a folder of their own, and in it, beside the
    # examples, a copy of Distributed-Setup whose Model section is a user's own
    for name in sync_shared.EXAMPLES:
        (tmp_path / name).mkdir()
        shutil.copy(os.path.join(example_dir(name), "train.py"), tmp_path / name)
    for part in ("tools", "deploy"):
        shutil.copytree(os.path.join(ROOT, part), tmp_path / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    own = read("Distributed-Setup", "train.py").replace(
        "# >>> shared: model\n", "# >>> shared: model\n# the user's own model\n")
    (tmp_path / "my-job").mkdir()
    (tmp_path / "my-job" / "train.py").write_text(own)
    synced = subprocess.run([sys.executable, str(tmp_path / "tools" / "sync_shared.py")],
                            capture_output=True, text=True, timeout=120)
    assert synced.returncode == 0 and synced.stdout.strip() == "updated: nothing", synced
    assert (tmp_path / "my-job" / "train.py").read_text() == own


# what the shared data and model blocks define, and what a train() built on them calls
DATA_AND_MODEL_NAMES = {"Dataset", "training_dataset", "model_params", "model_loss",
                        "model_metrics"}


def test_each_train_py_carries_the_shared_blocks_its_family_needs():
    for example in EXAMPLES:
        below = shared_blocks(appendix(example))
        assert NEEDED_BLOCKS[family(example)] <= set(below), (
            example, NEEDED_BLOCKS[family(example)] - set(below))


def names_used_outside(tree, node):
    """The names (and attributes) used anywhere in the module tree but inside node."""
    used = set()
    for other in tree.body:
        if other is not node:
            for n in ast.walk(other):
                if isinstance(n, ast.Name):
                    used.add(n.id)
                elif isinstance(n, ast.Attribute):
                    used.add(n.attr)
    return used


def test_no_train_py_holds_a_function_or_class_it_never_calls():
    """A block a story does not use is not in its file: every function and class defined at the
    top of a train.py is named somewhere else in it (a call, a base class, a hook handed over)."""
    for example in EXAMPLES:
        tree = ast.parse(read(example, "train.py"))
        unused = [node.name for node in tree.body
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                  and node.name not in names_used_outside(tree, node)]
        assert unused == [], (example, unused)


def test_every_appendix_keeps_within_its_budget():
    # a line of the shared plumbing is read, tested and fixed in every copy; the stories have
    # no budget (STYLE.md, "Plain over short")
    sizes = {example: len(appendix(example).splitlines()) for example in EXAMPLES}
    assert {e: n for e, n in sizes.items() if n > APPENDIX_BUDGET[family(e)]} == {}


def test_the_shared_blocks_are_the_same_text_in_every_train_py():
    copies = {}
    for example in EXAMPLES:
        for name, text in shared_blocks(read(example, "train.py")).items():
            copies.setdefault(name, {})[example] = text
    for name, by_example in copies.items():
        reference = by_example.get("Distributed-Setup", next(iter(by_example.values())))
        drifted = [e for e, text in by_example.items() if text != reference]
        assert not drifted, "shared block %r differs from Distributed-Setup's in %s" % (
            name, drifted)


def test_every_train_py_tells_its_story_first_and_keeps_the_plumbing_last():
    for example in EXAMPLES:
        text = read(example, "train.py")
        positions = [text.find(section) for section in SECTIONS]
        assert -1 not in positions and positions == sorted(positions), (example, positions)
        assert text.find("def example_flags(") < positions[0], example
        # below the banner there is nothing but shared blocks (and the __main__ guard)
        plumbing = BLOCK.sub("", text[positions[-1] + len(BANNER):])
        code = [l for l in plumbing.splitlines() if l.strip() and not l.startswith("#")]
        assert code == ['if __name__ == "__main__":', "    sys.exit(main())"], (example, code)


def appendix(example):
    """Everything from the plumbing banner to the end of the file."""
    text = read(example, "train.py")
    return text[text.rindex("# ====", 0, text.index(BANNER)):]


def test_the_banner_lists_the_blocks_of_its_file_in_order():
    for example in EXAMPLES:
        text = appendix(example)
        header = text[:text.index("# >>> shared:")]
        listed = header.split("this file's, in order:\n# ", 1)[1].replace("\n# ", " ")
        assert [n.strip(" .\n") for n in listed.split(",")] == list(shared_blocks(text)), example


def test_nothing_below_the_banner_calls_the_data_the_model_or_the_algorithm():
    """The plumbing is handed what train() built: a copy whose Data and Model sections were
    replaced runs with the appendix unchanged only if no shared block below the banner names a
    function or class of the story above it."""
    for example in EXAMPLES:
        text = read(example, "train.py")
        banner = text.index(BANNER)
        story = {node.name for node in ast.parse(text[:banner]).body
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        assert {"train", "main", "load_dataset"} & story, example  # the story was read
        for name, body in shared_blocks(text[banner:]).items():
            nodes = list(ast.walk(ast.parse(body)))
            used = {node.id for node in nodes if isinstance(node, ast.Name)}
            handed = {node.arg for node in nodes if isinstance(node, ast.arg)}  # parameters
            assert not (used - handed) & story, (example, name, (used - handed) & story)


def test_the_algorithm_comes_first():
    for example in DISTRIBUTED_EXAMPLES:
        lines = read(example, "train.py").splitlines()
        algorithm = next(i for i, l in enumerate(lines, 1) if l.startswith("def build_"))
        assert algorithm <= 150, "%s: the algorithm starts at line %d" % (example, algorithm)


def test_every_distributed_run_sh_is_the_same_launcher():
    launchers = {e: read(e, "run.sh") for e in DISTRIBUTED_EXAMPLES}
    reference = launchers["Distributed-Setup"]
    assert [e for e, text in launchers.items() if text != reference] == []
    # a reader sees the processes start near the top
    starts = [i for i, l in enumerate(reference.splitlines(), 1) if l.startswith("for ((i")]
    assert len(starts) == 2 and max(starts) <= 35, starts


def test_every_run_sh_of_a_cluster_without_ps_is_the_same_launcher():
    # the examples with one client start the same worker tasks as MultiWorkerMirroredStrategy
    reference = read("MultiWorkerMirroredStrategy", "run.sh")
    one_client = [e for e in EXAMPLES if family(e) == "In-Graph-Replication"]
    assert one_client and [e for e in one_client if read(e, "run.sh") != reference] == []


def test_the_baseline_run_sh_filters_tensorflow_chatter_like_the_launcher():
    label = re.compile(r"^label\(\) \{.*?^\}$", re.S | re.M)
    assert label.search(read("Non-Distributed-Setup", "run.sh")).group(0) == label.search(
        read("Distributed-Setup", "run.sh")).group(0)


def test_train_py_imports_only_tensorflow_numpy_scikit_learn_and_the_standard_library():
    for example in EXAMPLES:
        imported = set()
        for node in ast.walk(ast.parse(read(example, "train.py"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, "%s imports relatively" % example
                imported.add(node.module.split(".")[0])
        assert imported <= ALLOWED_IMPORTS, (example, imported - ALLOWED_IMPORTS)


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_number_flag_says_whether_it_may_be_0_and_bad_values_fail_in_one_line(example,
                                                                                   capsys):
    """Every flag of every example that takes a number has one of the four explicit types (no
    plain int or float, no rule keyed on its default): its default passes; a positive_* flag
    refuses 0 and a non_negative_* flag takes it; both refuse -1, with exit status 2 and one
    line that names the flag."""
    from support.examples import load_train_module
    module = load_train_module(example)
    parser = {}

    def capture(p):  # the parser, once every flag is on it
        module.example_flags(p)
        parser["p"] = p
    parse = lambda argv: module.parse_flags(argv, capture)
    parse([])
    kinds = {a.dest: a.type for a in parser["p"]._actions if a.type not in (None, str)}
    assert kinds, example
    for flag, kind in sorted(kinds.items()):
        name = getattr(kind, "__name__", "")
        assert name in ("positive_int", "positive_float", "non_negative_int",
                        "non_negative_float"), (example, flag, name)
        refused = ["-1"] + (["0"] if name.startswith("positive") else [])
        for value in refused:
            with pytest.raises(SystemExit) as stopped:
                parse(["--" + flag, value])
            assert stopped.value.code == 2, (flag, value)
            err = capsys.readouterr().err
            assert err == "error: --%s must be %s, got %s\n" % (
                flag, "positive" if value == "0" or name.startswith("positive") else "0 or more",
                value), err
        if name.startswith("non_negative"):
            assert getattr(parse(["--" + flag, "0"]), flag) == 0, flag


def test_no_python_file_uses_a_name_it_never_defines():
    """A name used but never defined or imported fails only when its line runs, possibly deep in
    a restart: a shared block copied into a train.py that lacks one of its imports once made
    every Gradient-Compression run fail in Worker.start. pyflakes finds such names unrun."""
    import glob
    import pyflakes.checker
    import pyflakes.messages
    undefined = (pyflakes.messages.UndefinedName, pyflakes.messages.UndefinedLocal,
                 pyflakes.messages.UndefinedExport)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for pattern in ("*/train.py", "benchmarks/*.py", "deploy/*.py", "tools/*.py", "tests/*.py",
                    "tests/support/*.py"):
        for path in sorted(glob.glob(os.path.join(root, pattern))):
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            found += ["%s: %s" % (os.path.relpath(path, root), m.message % m.message_args)
                      for m in pyflakes.checker.Checker(tree, filename=path).messages
                      if isinstance(m, undefined)]
    assert found == []


# --- The lesson in view ---------------------------------------------------------------------------
PS_EXAMPLES = [e for e in EXAMPLES if declared_jobs(e) == ("ps", "worker")]
SYNC_REPAIR = ("SyncReplicasStart", "run_until_it_fails", "sync_round", "no_round_in_time")


def story(example):
    """The text a reader meets first: everything above the first banner."""
    text = read(example, "train.py")
    return text[:text.index("# " + "=" * 98)]


def story_code(example):
    """The story's lines of code: its docstrings, comments and blank lines left out."""
    text = story(example)
    docstrings = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING and token.line.strip().startswith('"""'):
            docstrings.update(range(token.start[0], token.end[0] + 1))
    code = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("  # ")[0].rstrip()
        if number not in docstrings and line.strip() and not line.lstrip().startswith("#"):
            code.append(line)
    return code


@pytest.mark.parametrize("example", PS_EXAMPLES)
def test_every_ps_example_shows_its_cluster_server_placement_and_session_in_its_story(example):
    code = "\n".join(story_code(example))
    for call in ("tf.train.ClusterSpec(", "tf.distribute.Server(", 'if args.job_name == "ps":',
                 "serve(args, cluster, server)", "with worker.session(server",
                 "import tensorflow as tf"):
        assert call in code, (example, call)
    if example != "Evolution-Strategies":  # which places its variables itself, device by device
        assert "tf.compat.v1.train.replica_device_setter(" in code, example


@pytest.mark.parametrize("example", EXAMPLES)
def test_no_story_holds_the_synchronous_round_repair(example):
    defined = re.findall(r"^(?:def|class) (\w+)", story(example), re.M)
    assert not set(defined) & set(SYNC_REPAIR), (example, set(defined) & set(SYNC_REPAIR))


def test_the_baseline_and_its_distributed_twin_differ_only_by_the_distribution():
    """Non-Distributed-Setup and Distributed-Setup, side by side: the same data, model, step
    and loop, so that their stories' code differs in at most 40 lines (added and removed
    together): the cluster, the server, the placement and the session."""
    baseline, twin = story_code("Non-Distributed-Setup"), story_code("Distributed-Setup")
    changed = [line for line in difflib.unified_diff(baseline, twin, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(changed) <= 40, "\n".join(changed)
    assert "-    params = model_params(x.shape[1:], args.hidden, args.seed, num_classes)" \
        not in changed  # the step itself is the same


@pytest.mark.parametrize("example", PS_EXAMPLES + ["Non-Distributed-Setup"])
def test_every_session_is_tensorflows_monitored_session_with_no_session_class_of_its_own(
        example):
    """TensorFlow's session machinery, not a private one: the session a loop runs in is a
    MonitoredSession (MonitoredTrainingSession in the baseline) made on SessionManager, with
    StopAtStepHook and CheckpointSaverHook; no class of a train.py wraps a session's run."""
    text = read(example, "train.py")
    needed = (["tf.compat.v1.train.MonitoredTrainingSession("] if example == "Non-Distributed-Setup"
              else ["tf.compat.v1.train.MonitoredSession(", "tf.compat.v1.train.SessionManager(",
                    "tf.compat.v1.train.CheckpointSaverHook("])
    for name in needed + ["tf.compat.v1.train.StopAtStepHook("]:
        assert name in text, (example, name)
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
            assert "run" not in methods, (example, node.name)  # a session of its own
    loop = "\n".join(story_code(example))
    assert "while not session.should_stop():" in loop or example == "Evolution-Strategies", example


def test_every_mutation_still_finds_the_one_line_it_changes():
    """tools/mutations.py moves with the code: a mutation whose text has gone from its file (or
    occurs twice) would only be noticed by a full run of the script, minutes long."""
    mutations = load_module(os.path.join(ROOT, "tools", "mutations.py"), "mutations")
    found = {m.name: read(*os.path.split(m.path)).count(m.old) for m in mutations.MUTATIONS}
    assert {name: n for name, n in found.items() if n != 1} == {}
