#!/usr/bin/env python3
"""Checks what a shared build of tasklet exports: the public API and nothing of the engine.

Every dynamic symbol a library defines must be one of:
- tasklet's public API: in namespace tasklet (or tasklet::rules, tasklet::etcd, ...) outside
  tasklet::detail;
- a tasklet::detail name that a public header declares (what its templates and inline code call),
  or one that the rule backend's door (src/api/rule_backend_door.hpp) declares for tasklet::etcd;
- an instantiation of the standard library's templates (vague linkage: the compiler exports those
  whose arguments are exported types; nothing the library chooses).
Anything else (an engine class such as SchedulerImpl or RuleTable, oneTBB, Boost) fails the check.

    check_exports.py --source <tasklet source dir> <lib.so>...
"""
import argparse
import pathlib
import re
import subprocess
import sys

WRAPPERS = ("typeinfo name for ", "typeinfo for ", "vtable for ", "VTT for ", "construction vtable for ",
            "guard variable for ", "non-virtual thunk to ", "virtual thunk to ")


def declared_detail_names(source: pathlib.Path) -> set:
    """Names of the classes, structs and exported functions that the public headers (and the rule
    backend's door) declare."""
    headers = [*source.glob("include/**/*.hpp"), *source.glob("rules/include/**/*.hpp"),
               *source.glob("etcd/include/**/*.hpp"), source / "src/api/rule_backend_door.hpp"]
    names = set()
    for header in headers:
        text = header.read_text()
        names.update(re.findall(r"\b(?:class|struct)\s+(?:\[\[[^\]]*\]\]\s*)*(?:TASKLET_EXPORT\s+)?(\w+)\s*(?:final\b|:|\{)",
                                text))
        for declaration in re.findall(r"TASKLET_EXPORT\s+([^;{]*?)\(", text):
            names.add(declaration.split()[-1].lstrip("*&"))
    return names


def entity(symbol: str) -> str:
    for wrapper in WRAPPERS:
        if symbol.startswith(wrapper):
            return symbol[len(wrapper):]
    return symbol


def verdict(symbol: str, allowed_detail: set) -> str:
    """Empty when the symbol may be exported, else why not."""
    name = entity(symbol)
    # A function template's instantiation is written with its return type first.
    name = re.sub(r"^(?:void|bool|int|unsigned long|[\w:]+\*?) (?=(?:std|__gnu_cxx|tasklet)::)", "", name)
    if name.startswith(("std::", "__gnu_cxx::")):
        return ""
    if not name.startswith("tasklet::"):
        return "not tasklet's"
    qualified = re.split(r"[(<]", name, maxsplit=1)[0]
    if "(anonymous namespace)" in name.split("(")[0]:
        return "in an anonymous namespace"
    parts = qualified.split("::")
    if "detail" in parts:
        inner = parts[parts.index("detail") + 1] if parts.index("detail") + 1 < len(parts) else ""
        if inner not in allowed_detail:
            return f"tasklet::detail::{inner} is not declared in a public header or the rule backend's door"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, type=pathlib.Path)
    parser.add_argument("libraries", nargs="+", type=pathlib.Path)
    args = parser.parse_args()
    allowed_detail = declared_detail_names(args.source)
    failed = False
    for library in args.libraries:
        listing = subprocess.run(["nm", "-D", "--defined-only", "-C", str(library)], check=True,
                                 capture_output=True, text=True).stdout
        symbols = [line.split(" ", 2)[2] for line in listing.splitlines() if line.count(" ") >= 2]
        tasklet_symbols = [s for s in symbols if entity(s).startswith("tasklet::")]
        if not tasklet_symbols:
            print(f"{library}: exports nothing of tasklet (not a shared build with TASKLET_EXPORT?)")
            failed = True
        wrong = [(s, why) for s in symbols if (why := verdict(s, allowed_detail))]
        for symbol, why in wrong:
            print(f"{library.name}: {symbol}: {why}")
        failed |= bool(wrong)
        print(f"{library.name}: {len(symbols)} symbols exported, {len(tasklet_symbols)} of tasklet, "
              f"{len(wrong)} that should not be")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
