"""The READMEs' links: every relative link names a file that exists, and every #anchor a
heading of that file (as GitHub spells anchors: lower case, punctuation dropped, spaces to
hyphens). A renamed folder or heading otherwise leaves a dead link that no run notices."""
import functools
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")
READMES = sorted(p for p in glob.glob(os.path.join(ROOT, "**", "*.md"), recursive=True)
                 if "/results/logs/" not in p and "/.pytest_cache/" not in p)


def anchor(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)  # a README links to the same file many times
def anchors_of(path):
    with open(path) as f:
        return {anchor(line.lstrip("#")) for line in f if re.match(r"#{1,6} ", line)}


def test_anchor_spelling():
    assert anchor(" The window: DOWNPOUR against ADAG") == "the-window-downpour-against-adag"
    assert anchor("Try it on one machine") == "try-it-on-one-machine"


@pytest.mark.parametrize("readme", READMES, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_reach_a_file_and_a_heading(readme):
    with open(readme) as f:
        text = f.read()
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...: not ours to check offline
            continue
        path, _, fragment = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(readme), path)) if path else readme
        if not os.path.exists(full):
            dead.append(target)
        elif fragment and full.endswith(".md") and fragment not in anchors_of(full):
            dead.append(target)
    assert not dead, "dead links in %s: %s" % (os.path.relpath(readme, ROOT), dead)
