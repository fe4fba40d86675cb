"""How a benchmark's figures reach the READMEs: only through the script that measured them.

A README shows a script's table between two marker lines that only that script writes,

    <!-- compare.py: begin -->
    (the table, as the script printed it)
    <!-- compare.py: end -->

and the script keeps the same text in benchmarks/results/<script>.md. tests/test_benchmarks.py
checks that every section still equals that file, so a figure edited by hand fails the tests.
A script that writes a different text to each of several READMEs (one per example) names each
part: the section `scaling.py#DOWNPOUR` is kept in benchmarks/results/scaling-DOWNPOUR.md.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
BENCHMARKS_README = os.path.join(ROOT, "benchmarks", "README.md")
ROOT_README = os.path.join(ROOT, "README.md")


def markers(name):
    return "<!-- %s: begin -->\n" % name, "<!-- %s: end -->" % name


def split(text, name, path):
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError("%s: needs one %r line and then one %r line" % (path, begin.strip(),
                                                                         end))
    head, rest = text.split(begin)
    body, tail = rest.split(end)
    return head + begin, body, end + tail


def read_section(path, name):
    with open(path) as f:
        return split(f.read(), name, path)[1]


def write_section(path, name, body):
    with open(path) as f:
        head, _, tail = split(f.read(), name, path)
    with open(path, "w") as f:
        f.write(head + body + tail)


def results_path(name):
    """results/<script>.md for the section `script.py`; results/<script>-<part>.md for
    `script.py#part`."""
    script, _, part = name.partition("#")
    return os.path.join(RESULTS, os.path.splitext(script)[0] + ("-" + part if part else "") + ".md")


def publish(name, body, readmes):
    """Keep body as the script's latest results and show it in each of readmes."""
    body = body.rstrip("\n") + "\n"
    os.makedirs(RESULTS, exist_ok=True)
    with open(results_path(name), "w") as f:
        f.write(body)
    for readme in readmes:
        write_section(readme, name, body)
    print("wrote %s and its section in %s" % (os.path.relpath(results_path(name), ROOT),
                                              ", ".join(os.path.relpath(r, ROOT)
                                                        for r in readmes)), file=__import__(
        "sys").stderr)
