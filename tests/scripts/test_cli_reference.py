"""docs/cli.md against the program: the page is exactly what scripts/cli_reference.py writes from
every command's `--help`, so that a changed flag or help text fails the suite until the page is
regenerated; every subcommand `ffnlab --help` lists has its section; the page is the same in any
environment and on any machine; and a bad argument is one line on stderr and exit status 2.

Usage: test_cli_reference.py FFNLAB_BINARY"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "cli_reference.py")
PAGE = os.path.join(ROOT, "docs", "cli.md")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import cli_reference  # noqa: E402

BINARY = None  # set from argv


def script(*argv, env=None, preexec_fn=None):
    return subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True,
                          env=env, preexec_fn=preexec_fn, timeout=600)


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def listed_subcommands():
    """The names of the "Subcommands:" section of `ffnlab --help`, read here on their own (not
    by the script's parser, which this checks)."""
    text = subprocess.run([BINARY, "--help"], capture_output=True, text=True, check=True).stdout
    section = re.search(r"^Subcommands:\n((?:[ \t]+\S.*\n?)+)", text, re.MULTILINE | re.IGNORECASE)
    if not section:
        return []
    return [m.group(1) for m in re.finditer(r"^  (\S+)", section.group(1), re.MULTILINE)]


class CliReference(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def test_the_page_is_what_the_help_says(self):
        run = script(BINARY, "--check", PAGE)
        self.assertEqual(run.returncode, 0, "docs/cli.md is not what the program's --help says "
                         f"(regenerate it: {cli_reference.COMMAND}):\n{run.stderr}")
        self.assertEqual(run.stderr, "")

    def test_a_stale_page_fails_the_check_at_its_first_different_line(self):
        page = script(BINARY).stdout  # what --write writes, whether docs/cli.md is current or not
        lines = page.split("\n")
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("--"))
        stale = os.path.join(self.dir.name, "cli.md")
        for changed in (lines[:at] + [lines[at] + " (an older help)"] + lines[at + 1:],
                        lines[:at]):  # a line changed; the page cut short there
            with open(stale, "w", encoding="utf-8", newline="") as f:
                f.write("\n".join(changed))
            run = script(BINARY, "--check", stale)
            self.assertEqual(run.returncode, 1, run.stderr)
            self.assertEqual(len(run.stderr.splitlines()), 1, run.stderr)
            self.assertIn(f"{stale}:{at + 1} ", run.stderr)
        # --write makes it current again
        self.assertEqual(script(BINARY, "--write", stale).returncode, 0)
        self.assertEqual(read(stale), page)
        self.assertEqual(script(BINARY, "--check", stale).returncode, 0)

    def test_every_subcommand_has_a_section_in_order(self):
        names = listed_subcommands()
        self.assertGreater(len(names), 3, "ffnlab --help lists the subcommands")
        headings = re.findall(r"^## ffnlab (\S+)$", read(PAGE), re.MULTILINE)
        self.assertEqual(headings, names, "docs/cli.md's sections are not ffnlab --help's list")
        # the script finds them too, and a section is that subcommand's --help
        self.assertEqual(cli_reference.subcommands(
            subprocess.run([BINARY, "--help"], capture_output=True, text=True).stdout), names)
        page = read(PAGE)
        for name in names:
            block = re.search(r"\n## ffnlab " + re.escape(name) + r"\n\n```text\n(.*?)\n```\n",
                              page, re.DOTALL)
            self.assertIsNotNone(block, f"the section of {name} has no text block")
            self.assertIn(f"\nUsage: ffnlab {name} [OPTIONS]\n", block.group(1),
                          f"the section of {name} is not its --help")

    def test_every_flag_a_help_names_is_one_of_its_own(self):
        """A help text that points at a flag ("(--no-normalize: keep them as scored)") names one
        the command takes, under a name or an alias of its options list."""
        for name in listed_subcommands():
            text = subprocess.run([BINARY, name, "--help"], capture_output=True, text=True,
                                  check=True).stdout
            own = set()
            for line in text.splitlines():  # "  -h,--help", "  --normalize,--no-normalize"
                m = re.match(r"^  (-\S+)", line)
                if m:
                    own.update(re.findall(r"--[a-z0-9][a-z0-9-]*", m.group(1)))
            # A negated name is shown as typed, without the value CLI11 stores for it.
            self.assertNotIn("{false}", text, f"ffnlab {name} --help")
            named = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", text))
            self.assertEqual(named - own, set(),
                             f"ffnlab {name} --help names flags it does not take")

    def test_the_page_is_the_same_in_any_environment_and_on_any_machine(self):
        base = script(BINARY)
        self.assertEqual(base.returncode, 0, base.stderr)
        env = dict(os.environ, COLUMNS="40", LINES="10", LC_ALL="C.UTF-8", OMP_NUM_THREADS="1",
                   TERM="xterm-256color")
        # One processor, where the system lets a process choose (the bound of --threads)
        one_cpu = None
        if hasattr(os, "sched_setaffinity"):
            cpu = min(os.sched_getaffinity(0))
            one_cpu = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
        for kwargs in ({}, {"env": env}, {"preexec_fn": one_cpu}):
            run = script(BINARY, **kwargs)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stdout, base.stdout, f"the page changes with {kwargs}")
        # No processor count: the --threads bound is the placeholder, and a count of any width
        # gives the same line (CLI11 pads the option to its description's column).
        self.assertNotRegex(base.stdout, r"--threads INT:\[0, \d")
        self.assertIn("--threads INT:[0, NPROC]", base.stdout)
        lines = {cli_reference.machine_independent(
            ("  --threads INT:[0, " + n + "]").ljust(30) + "OpenMP threads  ")
            for n in ("1", "2", "128", "1024")}
        self.assertEqual(lines, {"  --threads INT:[0, NPROC]    OpenMP threads"})
        # nor the program's path: it runs as plain `ffnlab`
        self.assertNotIn(os.path.dirname(os.path.abspath(BINARY)), base.stdout)

    def test_a_bad_argument_is_one_line_and_exit_status_2(self):
        missing = os.path.join(self.dir.name, "no-such-ffnlab")
        not_a_program = os.path.join(self.dir.name, "plain.txt")
        with open(not_a_program, "w") as f:
            f.write("#!/bin/sh\n")
        page = os.path.join(self.dir.name, "cli.md")
        shutil.copy(PAGE, page)
        for argv in ([], [missing], [not_a_program], [BINARY, "--no-such-flag"],
                     [BINARY, "--write", page, "--check", page],
                     [BINARY, "--check", os.path.join(self.dir.name, "absent.md")],
                     [BINARY, "--write", os.path.join(self.dir.name, "no-dir", "cli.md")],
                     ["/bin/false"]):
            run = script(*argv)
            self.assertEqual(run.returncode, 2, f"{argv}: {run.stderr}")
            self.assertEqual(len(run.stderr.splitlines()), 1, f"{argv}: {run.stderr}")
            self.assertTrue(run.stderr.startswith("cli_reference.py: "), run.stderr)
            self.assertEqual(run.stdout, "")
        self.assertEqual(read(page), read(PAGE), "a refused run leaves the page alone")


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
