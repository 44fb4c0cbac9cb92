"""The documentation against the code: every relative link in README.md, CONTRIBUTING.md and
docs/ resolves, and every `ffnlab` command in a fenced sh block names a subcommand and flags that
its `--help` lists, so that a renamed flag or a moved page fails the suite.

Usage: test_docs.py FFNLAB_BINARY"""
import os
import re
import shlex
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = None  # set from argv


def pages():
    out = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CONTRIBUTING.md")]
    docs = os.path.join(ROOT, "docs")
    out += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return out


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(text):
    """The targets of the page's Markdown links that point into the repository."""
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or an anchor in the page itself
            yield target.split("#", 1)[0]


def commands(block):
    """The ffnlab invocations of a block: (subcommand, [flags]) each."""
    text = "\n".join(block).replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, w in enumerate(words):
            if os.path.basename(w) == "ffnlab" and i + 1 < len(words):
                sub = words[i + 1]
                if sub.startswith("-") or not re.match(r"^[a-z]+$", sub):
                    break
                # (a synopsis writes optional flags in brackets: "[--out DIR]")
                words_after = [x.lstrip("[").rstrip("]") for x in words[i + 2:]]
                flags = [x.split("=", 1)[0] for x in words_after if x.startswith("--")]
                yield sub, flags
                break


_help = {}


def help_text(sub):
    if sub not in _help:
        run = subprocess.run([BINARY, sub, "--help"], capture_output=True, text=True)
        _help[sub] = run.stdout if run.returncode == 0 else None
    return _help[sub]


class Docs(unittest.TestCase):
    def test_relative_links_resolve(self):
        missing = []
        for page in pages():
            with open(page, encoding="utf-8") as f:
                text = f.read()
            for target in relative_links(text):
                path = os.path.normpath(os.path.join(os.path.dirname(page), target))
                if not os.path.exists(path):
                    missing.append(f"{os.path.relpath(page, ROOT)}: {target}")
        self.assertEqual(missing, [], "links to files that do not exist")

    def test_every_command_in_an_sh_block_parses(self):
        bad, seen = [], 0
        for page in pages():
            with open(page, encoding="utf-8") as f:
                text = f.read()
            for block in sh_blocks_all(text):
                for sub, flags in commands(block):
                    seen += 1
                    where = f"{os.path.relpath(page, ROOT)}: ffnlab {sub}"
                    helped = help_text(sub)
                    if helped is None:
                        bad.append(f"{where}: no such subcommand")
                        continue
                    for flag in flags:
                        if not re.search(re.escape(flag) + r"\b", helped):
                            bad.append(f"{where}: {flag} is not in its --help")
        self.assertGreater(seen, 10, "the sh blocks hold the guide's commands")
        self.assertEqual(bad, [], "commands the program does not take")

    def test_the_checker_sees_a_stale_flag(self):
        block = ["ffnlab evolve --quick \\", "    --no-such-flag 3  # a comment"]
        self.assertEqual(list(commands(block)), [("evolve", ["--quick", "--no-such-flag"])])
        self.assertIsNone(re.search(r"--no-such-flag\b", help_text("evolve")))
        self.assertEqual(list(relative_links("see [a](docs/x.md#y) and ![b](fig.png) "
                                             "and [c](https://example.org)")),
                         ["docs/x.md", "fig.png"])


def sh_blocks_all(text):
    """Every fenced sh block of the page, as its lines."""
    blocks, block, in_sh = [], [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            if in_sh:
                blocks.append(block)
                block = []
                in_sh = False
            else:
                in_sh = stripped in ("```sh", "```bash", "```shell")
            continue
        if in_sh:
            block.append(line)
    return blocks


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
