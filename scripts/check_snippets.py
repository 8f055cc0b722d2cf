#!/usr/bin/env python3
"""Compiles every C++ snippet of the docs, so that what a reader copies compiles as shown.

Each ```cpp block in the given Markdown files must follow a marker line that says how to compile it:

    <!-- snippet: MODE | name: NAME | with: NAME, NAME | before: CODE | after: CODE -->

MODE is one of:

- `prelude`: the page's #include and `using` lines (nothing else), shown once near the top. It
  is compiled alone, then put at the top of every later block of the same page. A page has at
  most one; a page without one shows its includes in each block.
- `function`: the block's statements go into a function; its #include and `using` lines (those
  that start a line) go above it, as they are.
- `file`: the block is a translation unit's top level.
- `skip`: not compiled (say why in the docs).

Everything after MODE is optional scaffolding for what a snippet takes as given without showing
it: `name` lets a later block of the same page put this `file` block above itself with
`with` (a `with` block brings its own `before` along); `before` is code at file scope
(declarations of what the snippet uses but does not show); `first` opens a function block (locals
the snippet takes as given); `after` is appended to the block (in a function block, to use what
it declared; in a file block, to close what `before` opened). A line that is only `...` stands for
elided code. Scaffolding declares; it never holds an #include or a using-directive, which the
reader would not see.

The checker adds nothing else: no header, no `using`. A block compiles from its page's prelude,
its marker's scaffolding and its own lines, as C++20 with -Wall -Wextra -Werror.

Usage: check_snippets.py --cxx COMPILER [--cxx-flags FLAGS] [-I DIR ...] FILE.md ...

FLAGS: the build's CMAKE_CXX_FLAGS, one string (e.g. -stdlib=libc++ in the libc++ lane).
"""
import argparse
import re
import shlex
import subprocess
import sys

MARKER = re.compile(r"^<!--\s*snippet:\s*(.*?)\s*-->\s*$")
PRELUDE_LINE = re.compile(r"^\s*(#include\s|using\s|//|$)")


class Snippet:
    def __init__(self, path, line, marker, lines):
        self.path, self.line, self.lines = path, line, lines
        parts = [part.strip() for part in marker.split("|")] if marker is not None else []
        self.mode = parts[0] if parts else None
        self.options = {}
        for part in parts[1:]:
            key, _, value = part.partition(":")
            self.options[key.strip()] = value.strip()

    def where(self):
        return f"{self.path}:{self.line}"


def read_snippets(path):
    snippets, marker, block, start = [], None, None, 0
    with open(path, encoding="utf-8") as markdown:
        previous = ""
        for number, text in enumerate(markdown, 1):
            line = text.rstrip("\n")
            if block is not None:
                if line.strip() == "```":
                    snippets.append(Snippet(path, start, marker, block))
                    block, marker = None, None
                else:
                    block.append(line)
            elif line.strip() == "```cpp":
                found = MARKER.match(previous.strip())
                marker = found.group(1) if found else None
                block, start = [], number
            previous = line if line.strip() else previous
    return snippets


def elided(lines):
    return ["// ..." if line.strip() == "..." else line for line in lines]


def source_of(snippet, prelude, named):
    for key in ("before", "first", "after"):
        if re.search(r"#include|using\s+namespace", snippet.options.get(key, "")):
            raise ValueError(f"{snippet.where()}: `{key}` holds an #include or a using-directive: "
                             "show it in the block or the page's prelude")
    body = elided(snippet.lines)
    hoisted = [line for line in body if line.startswith("#include") or line.startswith("using ")]
    rest = [line for line in body if line not in hoisted]
    parts = ["\n".join(prelude.lines)] if prelude is not None else []
    for name in filter(None, (n.strip() for n in snippet.options.get("with", "").split(","))):
        if name not in named:
            raise ValueError(f"{snippet.where()}: `with: {name}` names no earlier file snippet")
        parts.append(named[name].options.get("before", ""))
        parts.append("\n".join(elided(named[name].lines)))
    parts.append(snippet.options.get("before", ""))
    parts.append("\n".join(hoisted))
    if snippet.mode == "function":
        parts.append("void snippet() {\n" + snippet.options.get("first", "") + "\n" + "\n".join(rest) + "\n" +
                     snippet.options.get("after", "") + "\n}")
    else:
        parts.append("\n".join(rest) + "\n" + snippet.options.get("after", ""))
    return "\n".join(parts) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cxx", required=True)
    parser.add_argument("--cxx-flags", default="")
    parser.add_argument("-I", dest="includes", action="append", default=[])
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    failures, compiled, skipped = [], 0, 0
    for path in args.files:
        named, prelude = {}, None
        for snippet in read_snippets(path):
            if snippet.mode not in ("prelude", "function", "file", "skip"):
                failures.append(f"{snippet.where()}: a ```cpp block needs a marker line above it "
                                "(<!-- snippet: prelude | function | file | skip ... -->)")
                continue
            if snippet.mode == "skip":
                skipped += 1
                continue
            if snippet.mode == "prelude":
                if prelude is not None:
                    failures.append(f"{snippet.where()}: a second prelude (the first is at {prelude.where()})")
                    continue
                strays = [line for line in snippet.lines if not PRELUDE_LINE.match(line)]
                if strays or snippet.options:
                    failures.append(f"{snippet.where()}: a prelude holds only #include and using lines, "
                                    f"and its marker no options: {strays or snippet.options}")
                    continue
                source = "\n".join(snippet.lines) + "\n"
                prelude = snippet
            else:
                try:
                    source = source_of(snippet, prelude, named)
                except ValueError as error:
                    failures.append(str(error))
                    continue
            command = [args.cxx, *shlex.split(args.cxx_flags), "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra",
                       "-Werror"]
            command += [f"-I{include}" for include in args.includes] + ["-x", "c++", "-"]
            result = subprocess.run(command, input=source, capture_output=True, text=True)
            compiled += 1
            if result.returncode != 0:
                failures.append(f"{snippet.where()}: does not compile\n{result.stderr}\n--- as compiled:\n{source}")
            if snippet.mode == "file" and "name" in snippet.options:
                named[snippet.options["name"]] = snippet
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"check_snippets: {compiled} compiled, {skipped} skipped, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
