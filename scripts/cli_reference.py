#!/usr/bin/env python3
"""The command reference, docs/cli.md, generated from the program's own --help, so that it
cannot drift from the flags.

The page holds `ffnlab --help` (the list of subcommands) and then, in their order there, every
subcommand's `ffnlab COMMAND --help` verbatim (but trailing spaces), each under a heading of
its own; the subcommands are read from the "Subcommands:" section of `ffnlab --help`, so that a
new one appears without anyone adding it here. The program runs as `ffnlab` (its usage lines
name argv[0]) in a fixed environment (LC_ALL=C, COLUMNS=100), and what depends on the machine
is written as a placeholder (MACHINE_VALUES below: NPROC, the processor count that bounds
--threads), so that every machine writes the same page.

    python3 scripts/cli_reference.py BINARY
        prints the page
    python3 scripts/cli_reference.py BINARY --write docs/cli.md
        writes it
    python3 scripts/cli_reference.py BINARY --check docs/cli.md
        checks that the file holds exactly it: exit status 1, and the first line that differs on
        stderr, when not

Standard library only. A bad argument, binary or file is one line on stderr and exit status 2.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = "python3 scripts/cli_reference.py build/release/ffnlab --write docs/cli.md"
TIMEOUT = 60  # seconds one --help may take

# The environment the program's --help runs in: nothing of the caller's but where its libraries
# are, so that no locale, terminal width or OpenMP setting of the caller shows in the page.
ENVIRONMENT = {"LC_ALL": "C", "LANG": "C", "COLUMNS": "100", "PATH": "/usr/bin:/bin"}
KEPT = ["LD_LIBRARY_PATH"]

# Values of the --help texts that are the machine's: (where, in a line of the help; its
# placeholder; what it is, in the page's words). The group `value` of the pattern is replaced,
# and the line's description column kept where CLI11 put it.
MACHINE_VALUES = [
    (re.compile(r"--threads INT:\[0, (?P<value>\d+)\]"), "NPROC",
     "the number of processors (what `nproc` prints), the most `--threads` takes"),
]
OPTION_LINE = re.compile(r"^(?P<name> +-\S.*?)(?P<gap>  +)(?P<text>\S.*)$")


class Refusal(Exception):
    pass


class Arguments(argparse.ArgumentParser):
    def error(self, message):  # one line and exit status 2, as every other refusal
        raise Refusal(message)


def help_text(binary, args):
    """`ffnlab ARGS --help` as the program prints it, run as `ffnlab` in ENVIRONMENT."""
    shown = " ".join([binary, *args, "--help"])
    env = dict(ENVIRONMENT)
    env.update({k: os.environ[k] for k in KEPT if k in os.environ})
    try:
        run = subprocess.run(["ffnlab", *args, "--help"], executable=binary, env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=TIMEOUT)
    except OSError as e:
        raise Refusal(f"{binary}: {e.strerror}")
    except subprocess.TimeoutExpired:
        raise Refusal(f"{shown}: no answer in {TIMEOUT} s")
    if run.returncode != 0 or not run.stdout.strip():
        why = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[0]
        raise Refusal(f"{shown} failed: {why}")
    return run.stdout


def subcommands(top_help):
    """The subcommands `ffnlab --help` lists, in its order: the names at the start of the
    "Subcommands:" section's lines (CLI11 indents a name by two spaces, a description's further
    lines by more)."""
    names, inside = [], False
    for line in top_help.splitlines():
        if re.match(r"^subcommands:\s*$", line, re.IGNORECASE):
            inside = True
            continue
        if not inside:
            continue
        if not line.strip() or not line.startswith(" "):
            break  # the section ends at a blank line or the next heading
        m = re.match(r"^  ([A-Za-z0-9][A-Za-z0-9_-]*)(?:\s|$)", line)
        if m:
            names.append(m.group(1))
    if not names:
        raise Refusal("ffnlab --help lists no subcommands (no \"Subcommands:\" section)")
    return names


def machine_independent(text):
    """The help with MACHINE_VALUES' values as their placeholders, every line without trailing
    spaces. An option's description stays in the column it started in, so that a value of more
    digits on another machine gives the same line."""
    out = []
    for line in text.splitlines():
        line = line.rstrip()
        for pattern, placeholder, _ in MACHINE_VALUES:
            m = pattern.search(line)
            if not m:
                continue
            option = OPTION_LINE.match(line)
            line = line[:m.start("value")] + placeholder + line[m.end("value"):]
            if option and m.end() <= option.end("name"):
                # CLI11's layout: the name padded to the description's column, or, when it
                # reaches that column, the description on a line of its own
                column, name = option.start("text"), OPTION_LINE.match(line).group("name")
                line = (name.ljust(column) if len(name) < column
                        else name + "\n" + " " * column) + option.group("text")
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)


def fenced(text):
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def page(binary):
    """The Markdown page, ending in a newline."""
    top = help_text(binary, [])
    names = subcommands(top)
    placeholders = "; ".join(f"{p} is {what}" for _, p, what in MACHINE_VALUES)
    out = ["# Command reference", "",
           f"This page is generated by `{COMMAND}` from each command's `--help`, and a test "
           "(`scripts.cli_reference`) checks that it is current, so change the help in "
           "tools/ffnlab/ and rerun that command rather than editing the page. Values that "
           f"depend on the machine are placeholders: {placeholders}.", "",
           fenced(machine_independent(top))]
    for name in names:
        out += ["", f"## ffnlab {name}", "", fenced(machine_independent(help_text(binary, [name])))]
    return "\n".join(out) + "\n"


def first_difference(old, new):
    """(line number, the file's line) of the first line where `old` is not `new`."""
    a, b = old.split("\n"), new.split("\n")
    for i in range(max(len(a), len(b))):
        if i >= len(a):
            return i + 1, "(the file ends here)"
        if i >= len(b) or a[i] != b[i]:
            return i + 1, a[i]
    return None


def main(argv):
    p = Arguments(prog="cli_reference.py", description=__doc__.split("\n\n")[0],
                  formatter_class=argparse.RawDescriptionHelpFormatter,
                  epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("binary", help="the ffnlab program")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PAGE", help="write the page into this file")
    group.add_argument("--check", metavar="PAGE", help="check that this file holds the page")
    try:
        args = p.parse_args(argv)
        if not os.path.isfile(args.binary) or not os.access(args.binary, os.X_OK):
            raise Refusal(f"{args.binary}: not an executable file (build ffnlab first)")
        text = page(args.binary)
        if args.check:
            try:
                with open(args.check, encoding="utf-8", newline="") as f:
                    old = f.read()
            except OSError as e:
                raise Refusal(f"{args.check}: {e.strerror}")
            where = first_difference(old, text)
            if where:
                line, held = where
                print(f"cli_reference.py: {args.check}:{line} is not what --help says "
                      f"(it holds {held[:80]!r}); run python3 scripts/cli_reference.py "
                      f"{args.binary} --write {args.check}", file=sys.stderr)
                return 1
            return 0
        if args.write:
            try:
                with open(args.write, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
            except OSError as e:
                raise Refusal(f"{args.write}: {e.strerror}")
            return 0
        sys.stdout.write(text)
        return 0
    except Refusal as e:
        print(f"cli_reference.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
