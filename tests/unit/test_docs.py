"""The docs say only what the code does: every command line quoted in README.md and docs/*.md parses
with the real command line, every prompt command exists, every path and link resolves.

What is read: fenced and indented code blocks (a line at a time; a trailing backslash, or a synopsis
line that goes on with `[--option ...]`, continues it) and inline `code` spans (which may wrap).
A line that runs fabriclab (`fabriclab ...`, behind `sudo` and/or `.venv/bin/`) is parsed with
fabriclab.cli.main.build_parser(), with argparse's abbreviations off, so a flag that does not exist
fails. Synopsis notation is expanded first: `[...]` brackets are dropped (everything optional is
included), `a|b|c` becomes one command per alternative, `...` goes (or, after an option, stands for
a value), and UPPERCASE placeholders are replaced from PLACEHOLDERS below, each with its reason.
Inline spans are mentions, so they may leave out a required argument (`fabriclab collective`);
code blocks may not. `./lab.sh demo|test|bootstrap ...` lines are checked against lab.sh; prompt
lines (`fabriclab> ...`) against the prompt's commands.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import glob
import importlib
import importlib.util
import io
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README] + sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 200

# UPPERCASE words that stand for a value in a synopsis, and what the check puts in their place.
# None drops the word. A placeholder missing here fails the test: add it, saying what it stands for.
PLACEHOLDERS = {
    "SPEC": "default",                       # a spec file or shipped name (any string to argparse)
    "FILE": "examples/scenarios/flap_recovery.yaml",   # a scenario or script file
    "FOLDER": "results/a",                   # a results folder
    "DIR": "out",                            # an output folder
    "PNG": "cmp.png",                        # compare --plot's file
    "VMLINUZ": "/boot/vmlinuz",              # fullkernel --kernel's image
    "NAME": "pfc-incast",                    # an experiment's name (a choice)
    "APP": "ecmp",                           # a routing app
    "VERB": "run",                           # any verb
    "PYTEST_ARGS": None,                     # pytest's own arguments, after `fullkernel test`
    "RUN_OPTIONS": None,                     # demo takes run's options
    # numbers: seconds, counts, ranks, buffers, DSCPs, hash seeds, milliseconds, fractions
    **{name: "1" for name in ("S", "N", "Q", "C", "R", "B", "D", "T", "H", "MS", "F", "SECONDS")},
}

# Long options quoted on their own (`--flag`) that belong to other programs, not to fabriclab.
OTHER_TOOLS_FLAGS = {
    "--system-site-packages": "python -m venv, in lab.sh",
    "--keep-all": "examples/traces/record_trace.py (runs under PyTorch, not fabriclab)",
    "--et": "examples/traces/record_trace.py",
    "--chakra": "examples/traces/record_trace.py",
}

PREFIX = re.compile(r"^(?:sudo\s+)?(?:(?:\./)?\.venv/bin/|/opt/fabriclab/venv/bin/)?fabriclab(?=\s|$)(?!\s*>)")
PROMPT = re.compile(r"^fabriclab>\s*(.*)$")
LAB_SH = re.compile(r"^(?:sudo\s+)?(?:\./)?lab\.sh(?=\s|$)(.*)$")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
NODE = re.compile(r"^(p\d+)?[hls]\d+$")          # h1, l3, s2, p2l3: a node name starts a Mininet command
PATH = re.compile(r"(?<![\w./<>-])((?:fabriclab|examples|tests|topologies|playbooks|docs|apps|traffic)/"
                  r"[\w./*<>:-]*)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
SPAN = re.compile(r"(`+)(.+?)\1", re.S)


# -- reading the markdown ----------------------------------------------------------------------------
class Quote:
    """A piece of a doc: a code line (`code`) or an inline span (`span`), with where it is."""

    def __init__(self, doc, line, text, kind, lang=""):
        self.doc, self.line, self.text, self.kind, self.lang = doc, line, text, kind, lang

    @property
    def where(self):
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def _parse(doc):
    """(code lines, inline spans, prose lines) of one markdown file."""
    lines = doc.read_text().splitlines()
    code, spans, prose = [], [], []
    fence, lang = None, ""
    para, para_start = [], 0

    def flush():
        nonlocal para
        if para:
            text = "\n".join(para)
            for m in SPAN.finditer(text):
                content = m.group(2).replace("\n", " ").strip()
                if para[0].lstrip().startswith("|"):
                    content = content.replace("\\|", "|")
                line = para_start + text.count("\n", 0, m.start())
                spans.append(Quote(doc, line, content, "span"))
        para = []

    previous_blank = True
    indented = False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            else:
                code.append(Quote(doc, number, line, "code", lang))
            continue
        m = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", line)
        if m:
            flush()
            fence, lang = m.group(1), m.group(2)
            previous_blank, indented = False, False
            continue
        if line.startswith("    ") and (previous_blank or indented) and stripped:
            flush()
            indented = True
            code.append(Quote(doc, number, line, "code", "indented"))
            previous_blank = False
            continue
        if not stripped:
            flush()
            previous_blank = True
            continue
        indented = False
        previous_blank = False
        prose.append((number, line))
        if stripped.startswith("|"):
            flush()
            para, para_start = [line], number
            flush()
        else:
            if not para:
                para_start = number
            para.append(line)
    flush()
    return code, spans, prose


PARSED = {doc: _parse(doc) for doc in DOCS}


def _logical_lines(code):
    """Code lines joined where a backslash or a synopsis continuation (`[--opt ...]`) goes on."""
    out = []
    for quote in code:
        text = quote.text.strip()
        if text.startswith("$ "):
            text = text[2:]
        if out and out[-1][1] and out[-1][0].doc == quote.doc and out[-1][0].lang == quote.lang:
            head, _ = out.pop()
            head.text = head.text.rstrip("\\").rstrip() + " " + text
            head.line_end = quote.line
            out.append((head, text.endswith("\\")))
            continue
        if (out and text.startswith(("[", "--")) and out[-1][0].doc == quote.doc
                and PREFIX.match(out[-1][0].text) and out[-1][0].line_end == quote.line - 1):
            head, _ = out.pop()
            head.text += " " + text
            head.line_end = quote.line
            out.append((head, False))
            continue
        q = Quote(quote.doc, quote.line, text, "code", quote.lang)
        q.line_end = quote.line
        out.append((q, text.endswith("\\")))
    return [q for q, _ in out]


def _segments(text):
    """Shell commands of a line: split at &&, || and ;."""
    return [s.strip() for s in re.split(r"&&|\|\||;", text) if s.strip()]


def _quotes(kind):
    """Every (quote, command text after the prefix) of a kind: fabriclab, lab.sh or prompt."""
    found = []
    for doc in DOCS:
        code, spans, _prose = PARSED[doc]
        sources = [(q, False) for q in _logical_lines(code) if q.lang not in ("python", "yaml", "json")]
        sources += [(q, True) for q in spans]
        for quote, mention in sources:
            for segment in _segments(quote.text) if kind != "prompt" else [quote.text]:
                if kind == "fabriclab":
                    m = PREFIX.match(segment)
                    rest = segment[m.end():].strip() if m else ""
                    # `fabriclab RoCEv2 agent ...` is a row of the benchmark's output, not a command:
                    # a command goes on with a verb, a placeholder, an option, or nothing.
                    if m and re.match(r"^([a-z.][\w|.-]*|[A-Z][A-Z0-9_]*|-.*)?(\s|$)", rest):
                        found.append((quote, rest, mention))
                elif kind == "lab.sh":
                    m = LAB_SH.match(segment)
                    if m:
                        found.append((quote, m.group(1).strip(), mention))
                else:
                    m = PROMPT.match(segment.strip())
                    if m:
                        found.append((quote, m.group(1).strip(), mention))
    return found


# -- turning a quoted synopsis into argument lists ------------------------------------------------
class DocCommandError(Exception):
    pass


def _words(rest):
    """shlex words of a command, without comments, shell plumbing or synopsis brackets."""
    rest = re.sub(r"(^|\s)#.*$", "", rest)
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise DocCommandError(f"cannot split it as a shell line: {exc}") from None
    out = []
    for word in words:
        if word in ("|", "&", ">", ">>") or word.startswith((">", "2>", "<")):
            break                                  # a pipe or redirection: the command ended
        word = word.replace("[", "").replace("]", "")
        if word:
            out.append(word)
    return out


def _variants(words):
    """Argument lists for a synopsis: placeholders replaced, `...` handled, alternatives expanded."""
    resolved = []
    for i, word in enumerate(words):
        if word == "...":
            if i > 0 and resolved and resolved[-1] and resolved[-1][0].startswith("-"):
                resolved.append(["1"])           # `--routing ...`: some value
            continue
        base = word[:-3] if word.endswith("...") and PLACEHOLDER.match(word[:-3]) else word
        if PLACEHOLDER.match(base):
            if base not in PLACEHOLDERS:
                raise DocCommandError(f"unknown placeholder {base!r}: add it to PLACEHOLDERS in "
                                      f"tests/unit/test_docs.py, saying what it stands for")
            value = PLACEHOLDERS[base]
            if value is not None:
                resolved.append([value])
            continue
        if "|" in word and word != "|":
            resolved.append(word.split("|"))
        else:
            resolved.append([word])
    count = max((len(alts) for alts in resolved), default=1)
    return [[alts[min(i, len(alts) - 1)] for alts in resolved] for i in range(count)]


def _strict(parser):
    """The parser and every subparser, with abbreviations of long options refused."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _strict(sub)
    return parser


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.fixture
def raising_argparse(monkeypatch):
    """argparse errors raise DocCommandError instead of printing the usage and exiting."""
    def error(self, message):
        raise DocCommandError(f"{self.prog}: {message}")
    monkeypatch.setattr(argparse.ArgumentParser, "error", error)


def _parse_argv(parser, argv, mention):
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:                       # --help
        if exc.code not in (0, None):
            raise DocCommandError(f"argparse exited {exc.code}") from None
    except DocCommandError as exc:
        if mention and "the following arguments are required" in str(exc):
            return                                  # a mention of a verb, not a whole command
        raise


def _build_parser():
    from fabriclab.cli.main import build_parser

    return _strict(build_parser())


# -- the tests ---------------------------------------------------------------------------------------
FABRICLAB_LINES = _quotes("fabriclab")
LAB_SH_LINES = _quotes("lab.sh")
PROMPT_LINES = _quotes("prompt")


def test_the_docs_quote_commands_at_all():
    """The extraction works: the README and the CLI reference are full of commands."""
    assert len(FABRICLAB_LINES) > 50 and len(LAB_SH_LINES) >= 3 and len(PROMPT_LINES) >= 5
    assert any(q.doc == README for q, _rest, _m in FABRICLAB_LINES)


@pytest.mark.parametrize("quote, rest, mention", FABRICLAB_LINES,
                         ids=[f"{q.where}" for q, _r, _m in FABRICLAB_LINES])
def test_every_quoted_fabriclab_command_parses(quote, rest, mention, raising_argparse):
    parser = _build_parser()
    problem = None
    try:
        for argv in _variants(_words(rest)):
            _parse_argv(parser, argv, mention)
    except DocCommandError as exc:
        problem = str(exc)
    if problem:
        pytest.fail(f"{quote.where}: `fabriclab {rest}` does not parse: {problem}", pytrace=False)


def _lab_sh_verbs():
    text = (ROOT / "lab.sh").read_text()
    m = re.search(r'case "\$cmd" in\s*\n\s*([a-z|]+)\)\s*shift', text)
    assert m, "lab.sh's verb list moved: update test_docs.py"
    return set(m.group(1).split("|"))


@pytest.mark.parametrize("quote, rest, mention", LAB_SH_LINES, ids=[q.where for q, _r, _m in LAB_SH_LINES])
def test_every_quoted_lab_sh_line_is_a_lab_sh_verb(quote, rest, mention, raising_argparse):
    try:
        words = _words(rest)
        verbs = _lab_sh_verbs()
        if not words:
            return                                  # `./lab.sh` on its own: a mention
        alternatives = words[0].split("|")
        for verb in alternatives:
            assert verb in verbs, f"lab.sh has no verb {verb!r} (it has {', '.join(sorted(verbs))})"
        args = words[1:]
        if "demo" in alternatives and args:
            for argv in _variants(args):
                _parse_argv(_build_parser(), ["demo", *argv], mention)
        if "test" in alternatives:
            skip_next = False
            for arg in args:
                if skip_next:
                    skip_next = False
                    continue
                if arg in ("-k", "-m", "-p"):
                    skip_next = True
                    continue
                if arg.startswith("-") or not ("/" in arg or arg.endswith(".py")):
                    continue
                path = arg.split("::")[0]
                assert (ROOT / path).exists(), f"no test path {path}"
        if alternatives == ["bootstrap"]:
            assert not args, "bootstrap takes no arguments"
    except (AssertionError, DocCommandError) as exc:
        problem = str(exc)
    else:
        return
    pytest.fail(f"{quote.where}: `./lab.sh {rest}`: {problem}", pytrace=False)


def _prompt_commands():
    """The lab prompt's own commands (read from its source), and Mininet's."""
    tree = ast.parse((ROOT / "fabriclab" / "cli" / "prompt.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LabPrompt")
    own = {f.name[3:] for f in cls.body if isinstance(f, ast.FunctionDef) and f.name.startswith("do_")}
    try:
        from mininet.cli import CLI
        mininet = {name[3:] for name in dir(CLI) if name.startswith("do_")}
    except ImportError:                             # the unit tier runs without Mininet too
        mininet = {"EOF", "dpctl", "dump", "exit", "gterm", "help", "intfs", "iperf", "iperfudp", "link",
                   "links", "net", "nodes", "noecho", "pingall", "pingallfull", "pingpair", "pingpairfull",
                   "ports", "px", "py", "quit", "sh", "source", "switch", "time", "wait", "x", "xterm"}
    return own, mininet


@pytest.mark.parametrize("quote, rest, mention", PROMPT_LINES, ids=[q.where for q, _r, _m in PROMPT_LINES])
def test_every_quoted_prompt_line_is_a_prompt_command(quote, rest, mention, raising_argparse):
    own, mininet = _prompt_commands()
    words = rest.split()
    if not words or words[0] == "...":
        return                                      # `fabriclab> ...`: the prompt itself, mentioned
    word = words[0]
    if word not in own | mininet and not NODE.match(word):
        pytest.fail(f"{quote.where}: `fabriclab> {rest}`: the prompt has no command {word!r} (no do_{word} "
                    f"in fabriclab/cli/prompt.py or Mininet's CLI, and it is not a node name)", pytrace=False)
    if word == "collective":
        from fabriclab.cli.collective import prompt_parser

        args = words[1:]
        if args and args[-1] == "&":
            args = args[:-1]
        parser = _strict(prompt_parser())
        parser.exit_on_error = True
        problem = None
        try:
            for argv in _variants(_words(" ".join(args))):
                _parse_argv(parser, argv, mention)
        except DocCommandError as exc:
            problem = str(exc)
        if problem:
            pytest.fail(f"{quote.where}: `fabriclab> {rest}`: {problem}", pytrace=False)


def _cells(row):
    """A markdown table row's cells (an escaped pipe, `\\|`, stays in its cell)."""
    return re.split(r"(?<!\\)\|", row)


def _section(doc, heading):
    text = doc.read_text()
    start = text.index(heading)
    nxt = re.search(r"^## ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + nxt.start()] if nxt else text[start:]


def test_every_prompt_command_has_a_row_in_the_cli_reference():
    own, _mininet = _prompt_commands()
    section = _section(ROOT / "docs" / "cli.md", "## The lab prompt")
    documented = set()
    for line in section.splitlines():
        if line.startswith("|"):
            first_cell = _cells(line)[1]
            documented |= {span.split()[0] for _ticks, span in SPAN.findall(first_cell) if span.split()}
    missing = sorted(own - documented - {"help"})
    assert not missing, f"docs/cli.md's prompt table lacks: {', '.join(missing)}"


def test_every_verb_is_in_the_readme_table_and_the_cli_reference():
    verbs = set(next(a for a in _build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)
    table = [line for line in README.read_text().splitlines() if line.startswith("| `")]
    listed = {span for line in table for _ticks, span in SPAN.findall(_cells(line)[1])}
    assert not verbs - listed, f"README's verb table lacks: {', '.join(sorted(verbs - listed))}"
    in_cli = {rest.split()[0] for q, rest, _m in FABRICLAB_LINES
              if q.doc.name == "cli.md" and q.kind == "code" and rest.split()}
    assert not verbs - in_cli, f"docs/cli.md shows no command line for: {', '.join(sorted(verbs - in_cli))}"


def test_every_quoted_long_option_exists():
    """`--flag` quoted on its own in prose is an option of some fabriclab verb (or of the prompt)."""
    from fabriclab.cli.collective import prompt_parser

    known = {opt for p in [*_parsers(_build_parser()), prompt_parser()] for a in p._actions for opt in a.option_strings}
    bad = []
    for doc in DOCS:
        for span in PARSED[doc][1]:
            m = re.match(r"^(--[a-z][a-z0-9-]*)", span.text)
            if m and m.group(1) not in known and m.group(1) not in OTHER_TOOLS_FLAGS:
                bad.append(f"{span.where}: {m.group(1)}")
    assert not bad, "options no fabriclab verb has: " + "; ".join(bad)


def test_every_quoted_repository_path_exists():
    bad = []
    for doc in DOCS:
        code, spans, _prose = PARSED[doc]
        for quote in [*code, *spans]:
            for m in PATH.finditer(quote.text):
                path = m.group(1).rstrip(".,:;)").split("::")[0]
                path = re.sub(r"(\.py):[A-Za-z_]\w*$", r"\1", path)     # a routing class: FILE.py:Class
                if "<" in path or ">" in path:
                    continue                        # a pattern such as links-<run>.csv
                hits = glob.glob(str(ROOT / path)) if "*" in path else [p for p in [ROOT / path] if p.exists()]
                if not hits:
                    bad.append(f"{quote.where}: {path}")
    assert not bad, "paths that do not exist: " + "; ".join(sorted(set(bad)))


def _slugs(doc):
    """GitHub's anchors for a markdown file's headings."""
    seen, out = {}, set()
    fence = False
    for line in doc.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        if fence or not re.match(r"^#{1,6} ", line):
            continue
        title = re.sub(r"^#+ ", "", line).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_and_anchor_resolves():
    bad = []
    for doc in DOCS:
        for number, line in PARSED[doc][2]:
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue                        # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                if not dest.exists():
                    bad.append(f"{doc.relative_to(ROOT)}:{number}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _slugs(dest):
                    bad.append(f"{doc.relative_to(ROOT)}:{number}: {target} (no such heading)")
    assert not bad, "broken links: " + "; ".join(bad)


def test_the_readme_is_a_front_page_that_links_its_docs():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the reference belongs in docs/"
    linked = {m for _n, line in PARSED[README][2] for m in LINK.findall(line)}
    docs_linked = {t.partition("#")[0] for t in linked if t.startswith("docs/")}
    for target in docs_linked:
        assert (ROOT / target).is_file(), f"README links {target}, which does not exist"
    unlinked = sorted(d.relative_to(ROOT).as_posix() for d in DOCS[1:]
                      if d.relative_to(ROOT).as_posix() not in docs_linked)
    assert not unlinked, f"README's index does not link: {', '.join(unlinked)}"


def _python_blocks():
    blocks = []
    for doc in DOCS:
        code = PARSED[doc][0]
        current = []
        for quote in code + [None]:
            if current and (quote is None or quote.lang != "python" or quote.line != current[-1].line + 1):
                blocks.append((current[0], "\n".join(q.text for q in current)))
                current = []
            if quote is not None and quote.lang == "python":
                current.append(quote)
    return blocks


@pytest.mark.parametrize("first, source", _python_blocks(), ids=[q.where for q, _s in _python_blocks()])
def test_python_blocks_compile_and_their_imports_resolve(first, source):
    tree = compile(source, first.where, "exec", ast.PyCF_ONLY_AST)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                    f"{first.where}: {node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


def test_the_readme_pytest_snippet_is_one_test():
    """tests/lab/test_examples.py runs this block with pytest and expects `1 passed`."""
    text = README.read_text()
    section = text.split("### Your own experiment in pytest", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    tree = ast.parse(code)
    tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    assert len(tests) == 1, tests


def test_every_registered_app_experiment_fault_and_job_kind_is_documented():
    """The registries are the lists: whatever is registered has its place in the docs."""
    from fabriclab.apps import APPS
    from fabriclab import jobs
    from fabriclab.workflows import faults
    from fabriclab.workflows.experiments import EXPERIMENTS

    docs = {path.name: path.read_text() for path in (ROOT / "docs").glob("*.md")}
    missing = [f"routing app {n} (docs/routing.md)" for n in APPS if f"`{n}`" not in docs["routing.md"]]
    missing += [f"experiment {n}" for n in EXPERIMENTS
                if not any(f"fabriclab experiment {n}" in text or re.search(rf"^#+ .*\b{re.escape(n)}\b", text, re.M)
                           for text in docs.values())]
    missing += [f"fault kind {k} (docs/scenarios.md)" for k in faults.KINDS if k not in docs["scenarios.md"]]
    missing += [f"job kind {k} (docs/scenarios.md)" for k in jobs.KINDS
                if f"kind: {k}" not in docs["scenarios.md"] and f"`{k}`" not in docs["scenarios.md"]]
    assert missing == []
