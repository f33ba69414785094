"""The documentation checks (check_docs.py): the repository passes them, and each check fails
on a repository that breaks its rule (so a pass means something)."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.environ.get("KVAGENT_SOURCE_DIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import check_docs  # noqa: E402

# Names of the notes that used to live outside the repository, built so that this file does
# not cite them itself.
OUTSIDE = "EVENTS" + ".md"


class RepositoryTest(unittest.TestCase):
    def test_every_reference_stays_inside_and_every_link_resolves(self):
        run = subprocess.run([sys.executable, os.path.join(HERE, "check_docs.py"), REPO],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)

    def test_the_contracts_are_in_docs(self):
        for name in ("semantics.md", "events.md", "architecture.md", "style.md", "glossary.md"):
            self.assertTrue(os.path.isfile(os.path.join(REPO, "docs", name)), name)


class CheckerTest(unittest.TestCase):
    """Small repositories, each with one defect, that the checker must refuse."""

    def repo(self, files):
        root = tempfile.mkdtemp(prefix="kvagent-check-docs.")
        self.addCleanup(subprocess.run, ["rm", "-rf", root])
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        # Not a git repository: the checker walks the folder instead.
        return root

    def problems(self, files):
        return check_docs.check(self.repo(files))

    GOOD = {
        "docs/a.md": "# A\n\n## Sockets and frames\n\nSee [b](b.md#the-agents-relay) and "
                     "[here](#sockets-and-frames), [web](https://example.com/x).\n",
        "docs/b.md": "# B\n\n## The agent's relay\n\n```\n[not a link](missing.md)\n```\n"
                     "`[nor this](missing.md)`\n",
        "src/x.h": "// the contract: docs/events.md\n",
    }

    def test_a_clean_repository_passes(self):
        self.assertEqual(self.problems(self.GOOD), [])

    def test_a_comment_citing_a_design_note_outside_fails(self):
        files = dict(self.GOOD, **{"src/y.cc": f"// see {OUTSIDE}, \"Transport\"\n"})
        found = self.problems(files)
        self.assertEqual(len(found), 1, found)
        self.assertIn("src/y.cc:1", found[0])
        self.assertIn("docs/events.md", found[0])

    def test_a_path_into_the_shared_folder_fails(self):
        files = dict(self.GOOD, **{"README.md": "Rules: `../shared/" + "design/x.md`\n"})
        self.assertEqual(len(self.problems(files)), 1)

    def test_a_research_note_fails(self):
        files = dict(self.GOOD, **{"src/z.py": "# see research/" + "kv-events.md section 4\n"})
        self.assertEqual(len(self.problems(files)), 1)

    def test_a_link_to_a_missing_file_fails(self):
        files = dict(self.GOOD, **{"docs/c.md": "# C\n\n[gone](gone.md)\n"})
        found = self.problems(files)
        self.assertEqual(len(found), 1, found)
        self.assertIn("docs/c.md:3", found[0])
        self.assertIn("does not exist", found[0])

    def test_a_link_to_a_missing_anchor_fails(self):
        files = dict(self.GOOD, **{"docs/c.md": "# C\n\n[x](a.md#transport)\n"})
        found = self.problems(files)
        self.assertEqual(len(found), 1, found)
        self.assertIn("#transport", found[0])

    def test_a_missing_anchor_in_the_same_file_fails(self):
        files = dict(self.GOOD, **{"docs/c.md": "# C\n\n[x](#nowhere)\n"})
        self.assertEqual(len(self.problems(files)), 1)

    def test_a_link_out_of_the_repository_fails(self):
        files = dict(self.GOOD, **{"docs/c.md": "# C\n\n[x](../../elsewhere.md)\n"})
        self.assertEqual(len(self.problems(files)), 1)

    def test_anchors_are_slugged_as_github_does(self):
        self.assertEqual(check_docs.slug("3. Agent ↔ master"), "3-agent--master")
        self.assertEqual(check_docs.slug("Monitoring: `kvctl stat`"), "monitoring-kvctl-stat")
        self.assertEqual(check_docs.slug("The agent's relay"), "the-agents-relay")
        self.assertEqual(check_docs.anchors("# X\n## Y\n## Y\n"), {"x", "y", "y-1"})


if __name__ == "__main__":
    unittest.main()
