"""benchmarks/: every figure in a README is what its script last wrote
(benchmarks/published_tables.py)."""
import os
import re
import sys

import pytest

from support.examples import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import published_tables  # noqa: E402  (benchmarks/ is not a package)

SCRIPTS = ("compare.py", "throughput.py", "step_anatomy.py", "stragglers.py", "bandwidth.py",
           "window_sweep.py", "scaling.py", "sparse_embeddings.py", "pipeline.py", "ps_sweep.py",
           "mnist1d_mlp.py", "decision_table.py", "compression.py", "big_data.py",
           "step_time_model.py")


def readmes_with_sections():
    found = []
    for folder, _, files in os.walk(ROOT):
        if "README.md" in files and "/." not in folder and "/logs" not in folder:
            path = os.path.join(folder, "README.md")
            with open(path) as f:
                found += [(path, name) for name in re.findall(r"<!-- (\S+): begin -->", f.read())]
    return found


def test_every_script_publishes_somewhere_and_every_section_names_a_script():
    sections = readmes_with_sections()
    assert {name.partition("#")[0] for _, name in sections} == set(SCRIPTS), sections
    assert (os.path.join(ROOT, "README.md"), "compare.py") in sections


@pytest.mark.parametrize("path,name", readmes_with_sections(),
                         ids=lambda v: os.path.relpath(v, ROOT) if "/" in str(v) else v)
def test_each_readme_section_is_what_its_script_last_wrote(path, name):
    with open(published_tables.results_path(name)) as f:
        assert published_tables.read_section(path, name) == f.read(), (
            "%s in %s differs from %s: edit no figure by hand; rerun python benchmarks/%s"
            % (name, os.path.relpath(path, ROOT),
               os.path.relpath(published_tables.results_path(name), ROOT), name))


def test_a_part_of_a_script_is_kept_in_a_file_of_its_own():
    results = published_tables.RESULTS
    assert published_tables.results_path("scaling.py") == os.path.join(results, "scaling.md")
    assert published_tables.results_path("scaling.py#Sync-SGD") == os.path.join(
        results, "scaling-Sync-SGD.md")


def test_write_section_replaces_only_the_text_between_its_own_markers(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("# T\nbefore\n<!-- x.py: begin -->\nold\n<!-- x.py: end -->\nafter\n"
                    "<!-- y.py: begin -->\nkept\n<!-- y.py: end -->\n")
    published_tables.write_section(str(page), "x.py", "| new |\n")
    assert page.read_text() == ("# T\nbefore\n<!-- x.py: begin -->\n| new |\n<!-- x.py: end -->"
                                "\nafter\n<!-- y.py: begin -->\nkept\n<!-- y.py: end -->\n")


@pytest.mark.parametrize("text", ["no markers\n", "<!-- x.py: end -->\n<!-- x.py: begin -->\n",
                                  "<!-- x.py: begin -->\n<!-- x.py: begin -->\n<!-- x.py: end -->"])
def test_a_page_without_one_well_formed_section_is_refused_and_left_alone(tmp_path, text):
    page = tmp_path / "README.md"
    page.write_text(text)
    with pytest.raises(ValueError, match="x.py"):
        published_tables.write_section(str(page), "x.py", "| new |\n")
    assert page.read_text() == text


def published_decision_runs():
    import decision_table  # noqa: E402  (benchmarks/ is on the path)
    return decision_table.load_runs(os.path.join(published_tables.RESULTS, "mnist1d",
                                                 decision_table.RUNS))


def test_the_decision_table_its_reading_and_the_model_are_drawn_from_the_published_runs(
        tmp_path):
    import decision_table
    import step_time_model
    settings, rows, runs = published_decision_runs()
    readme = published_tables.BENCHMARKS_README
    table = decision_table.write_table(str(tmp_path / "t.md"), runs, settings)
    assert published_tables.read_section(readme, "decision_table.py#mnist1d") == table + "\n"
    reading = decision_table.which_scheme(runs, rows, settings)
    assert published_tables.read_section(published_tables.ROOT_README,
                                         "decision_table.py#mnist1d-reading") == reading + "\n"
    model = step_time_model.report(step_time_model.PUBLISHED, "5mbit",
                                   step_time_model.published_held_out())
    assert published_tables.read_section(readme, "step_time_model.py#mnist1d") == model + "\n"
    # the table has what a reader needs to trust it: tuned rates, both baselines, 3 runs a cell
    assert {decision_table.ONE_SGD, decision_table.ONE_ADAMW, decision_table.LOCAL_SGD} <= {
        run["row"] for run in runs}
    assert settings["repeats"] >= 3 and "97%" in table and "of the median final test accuracy" in table


def test_which_scheme_when_says_nothing_the_cells_do_not_and_names_every_speed_ups_baseline():
    with open(published_tables.ROOT_README) as f:
        text = f.read()
    section = text.split("## Which scheme when")[1].split("\n## ")[0]
    head, generated, tail = published_tables.split(section, "decision_table.py#mnist1d-reading",
                                                   "README.md")
    for match in re.finditer(r"\d+(\.\d+)?x\b", generated):
        assert generated[match.end():].startswith(" against one process"), (
            "a speed-up without its baseline: %r" % generated[match.start():match.end() + 30])
    # the prose around the generated reading quotes no figure of the table: a figure written by
    # hand is one the next run can contradict
    hand = head + tail
    assert not re.search(r"\d+(\.\d+)?x\b|\d+(\.\d+)? s\b|\d+(\.\d+)?%", hand), hand
