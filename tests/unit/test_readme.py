"""The README is for users: its first screen gets them from a clone to a query, it says where everything is,
and it points at nothing they do not have."""

import re
from pathlib import Path

from rmqlake.cli import EXPLAINED

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_the_first_screen_goes_from_a_clone_to_a_query():
    first_screen = "\n".join(README.splitlines()[:40])
    for step in ("git clone", "make demo", "rmqlake query key", "rmqlake sql", "make test"):
        assert step in first_screen, step


def test_the_contents_list_every_section_in_order_and_each_link_resolves():
    contents = README.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[(.+)\]\(#([^)]+)\)$", contents, flags=re.M)
    after = README.split("## Contents\n", 1)[1]
    sections = re.findall(r"^## (.+)$", after, flags=re.M)
    assert [title for title, _ in listed] == sections
    assert all(link == anchor(title) for title, link in listed)
    anchors = {anchor(t) for t in re.findall(r"^#{2,3} (.+)$", README, flags=re.M)}
    for link in re.findall(r"\]\(#([^)]+)\)", README):
        assert link in anchors, f"a link to #{link}, which no heading has"


def test_every_subcommand_is_documented():
    for command in {path.split()[0] for path in EXPLAINED}:
        assert f"rmqlake {command}" in README, command


def test_it_points_at_nothing_users_do_not_have():
    assert "../shared" not in README
    assert not re.search(r"\bCONTRACT\b|\bspec §|§\s*\d|\bissues? #?\d+", README)
