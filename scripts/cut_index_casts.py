#!/usr/bin/env python3
"""Cuts the index casts that trainyard's warning flags do not need, in place.

The flags are -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion: an int (or std::int64_t) used as
a subscript converts to std::size_t with only a sign conversion, which is not warned about. So

    v[static_cast<std::size_t>(EXPR)]        ->  v[EXPR]
    v.at(static_cast<std::size_t>(EXPR))     ->  v.at(EXPR)        (also p->at(...))

where EXPR is a balanced-parenthesis expression with no top-level comma (a comma would turn `v[a, b]` into the
comma operator and `.at(a, b)` into two arguments). Nested casts (`v[static_cast<std::size_t>(w[static_cast<
std::size_t>(i)])]`) are both cut. Nothing else is touched: other static_cast<std::size_t> uses (sizes passed to
constructors, arguments of other functions, arithmetic) are left as they are, and so are casts in comments and in
string or character literals.

Some casts are needed: a scoped enum (enum class) does not convert to an index by itself, and a floating-point
index would warn. Kept, without type information:
  - an enumerator of a scoped enum, `Enum::value` or `ns::Enum::value`, for every `enum class` declared in the
    repository's sources or the files given;
  - the casts named in KEEP below (file and expression text, found by building with -Werror), and any named with
    --keep FILE:EXPR or --keep FILE:LINE (FILE matches a path's tail: --keep sim/engine.cpp:kind);
  - any cast on a line that carries a `keep-index-cast` comment.

Usage: scripts/cut_index_casts.py [--dry-run] [--keep FILE:EXPR|FILE:LINE ...] FILE...
Prints the number of casts cut per file (and the total, and which were kept); with --dry-run writes nothing.
"""

import argparse
import os
import re
import sys

CAST = re.compile(r"static_cast\s*<\s*(?:std\s*::\s*)?size_t\s*>\s*\(")
KEEP_MARKER = "keep-index-cast"
SOURCE_DIRS = ("app", "backend", "benchmarks", "common", "gui", "hwprofiles", "kernels", "models", "planner", "sim", "stacks", "tests")
SOURCE_EXTENSIONS = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".cc")
ENUM_CLASS = re.compile(r"\benum\s+(?:class|struct)\s+(?:\[\[[^\]]*\]\]\s*)?([A-Za-z_]\w*)")

# Casts this tree needs, as (path tail, expression): indices of a scoped-enum type that is not spelled Enum::value.
KEEP = [
    ("sim/engine.cpp", "task.kind()"),  # TaskKind
    ("sim/engine.cpp", "kind"),         # const TaskKind kind
]


def skip_literal(text: str, i: int) -> int:
    """text[i] opens a string or character literal; returns the index just past it (raw strings included)."""
    quote = text[i]
    # Raw string: R"delim( ... )delim", with an optional encoding prefix already consumed by the caller's scan.
    if quote == '"' and i > 0 and text[i - 1] == "R":
        m = re.compile(r'"([^()\\ ]{0,16})\(').match(text, i)
        if m:
            end = text.find(")" + m.group(1) + '"', m.end())
            return len(text) if end < 0 else end + len(m.group(1)) + 2
    j = i + 1
    while j < len(text) and text[j] != quote:
        if text[j] == "\\":
            j += 1
        elif text[j] == "\n":
            break  # unterminated: give up on it at the line's end
        j += 1
    return j + 1


def is_digit_separator(text: str, i: int) -> bool:
    """Whether the ' at text[i] separates digits (1'000'000, 0xFF'FF) rather than opening a character literal (L'x')."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_'."):
        j -= 1
    return j < i and text[j].isdigit()


def code_mask(text: str) -> list:
    """True for each character that is code (not in a comment or a string/character literal)."""
    mask = [True] * len(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            mask[i:end] = [False] * (end - i)
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            mask[i:end] = [False] * (end - i)
            i = end
        elif c == '"' or (c == "'" and not is_digit_separator(text, i)):
            end = skip_literal(text, i)
            mask[i:end] = [False] * (end - i)
            i = end
        else:
            i += 1
    return mask


def matching_paren(text: str, mask: list, open_index: int):
    """Index of the ')' closing the '(' at open_index, and whether a ',' sits at the top level between them."""
    depth, top_comma = 0, False
    for j in range(open_index, len(text)):
        if not mask[j]:
            continue
        c = text[j]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return j, top_comma
        elif c == "," and depth == 1:
            top_comma = True
    return None, top_comma


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def path_matches(path: str, tail: str) -> bool:
    path, tail = os.path.normpath(path), os.path.normpath(tail)
    return path == tail or path.endswith(os.sep + tail)


def scoped_enums(paths) -> set:
    """Names of the scoped enums declared in the repository's sources and in `paths`."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = set(os.path.abspath(p) for p in paths)
    for d in SOURCE_DIRS:
        for folder, subfolders, names in os.walk(os.path.join(root, d)):
            subfolders[:] = [s for s in subfolders if not s.startswith("build") and not s.startswith(".")]
            files.update(os.path.join(folder, n) for n in names if n.endswith(SOURCE_EXTENSIONS))
    enums = set()
    for f in files:
        try:
            with open(f, encoding="utf-8", errors="replace") as handle:
                enums.update(ENUM_CLASS.findall(handle.read()))
        except OSError:
            pass
    return enums


def is_kept(path: str, line: int, line_text: str, expr: str, keeps, enums: set) -> bool:
    if KEEP_MARKER in line_text:
        return True
    m = re.fullmatch(r"(?:::)?(?:\w+\s*::\s*)*(\w+)\s*::\s*\w+", expr)
    if m and m.group(1) in enums:
        return True
    for tail, what in keeps:
        if path_matches(path, tail) and (what == str(line) or what == re.sub(r"\s+", " ", expr)):
            return True
    return False


def cut(text: str, path: str, keeps, enums: set):
    """Returns (new text, number cut, lines of the casts kept)."""
    count, kept = 0, []
    pos = 0
    mask = code_mask(text)
    while True:
        m = CAST.search(text, pos)
        if not m:
            break
        start, open_index = m.start(), m.end() - 1
        pos = m.end()
        if not mask[start]:
            continue
        # What comes before the cast: '[' (a subscript) or '.at(' / '->at(' (a checked subscript).
        k = start - 1
        while k >= 0 and text[k] in " \t\n":
            k -= 1
        if k < 0:
            continue
        kind = None
        if text[k] == "[" and mask[k]:
            kind = "["
        elif text[k] == "(" and mask[k]:
            before = text[:k].rstrip()
            if re.search(r"(?:\.|->)\s*at$", before):
                kind = "at("
        if kind is None:
            continue
        close, top_comma = matching_paren(text, mask, open_index)
        if close is None or top_comma:
            continue
        # After the cast's ')' must come the subscript's ']' or the at's ')' (whitespace allowed).
        after = close + 1
        while after < len(text) and text[after] in " \t\n":
            after += 1
        if after >= len(text) or text[after] != ("]" if kind == "[" else ")"):
            continue
        line = line_of(text, start)
        line_text = text[text.rfind("\n", 0, start) + 1: text.find("\n", start) if text.find("\n", start) >= 0 else len(text)]
        expr = text[open_index + 1: close].strip(" \t")
        if is_kept(path, line, line_text, expr, keeps, enums):
            kept.append(line)
            continue
        text = text[:start] + expr + text[close + 1:]
        count += 1
        mask = code_mask(text)
        pos = start  # rescan the expression: it may hold casts of its own
    return text, count, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--dry-run", action="store_true", help="count, write nothing")
    parser.add_argument("--keep", action="append", default=[], metavar="FILE:EXPR|FILE:LINE",
                        help="keep the cast of this expression (or the casts on this line) in the files whose path ends so")
    args = parser.parse_args()
    keeps = list(KEEP)
    for k in args.keep:
        file, sep, what = k.partition(":")
        if not sep or not file or not what:
            parser.error(f"--keep wants FILE:EXPR or FILE:LINE, got {k!r}")
        keeps.append((file, re.sub(r"\s+", " ", what.strip())))
    enums = scoped_enums(args.files)
    total = 0
    for path in args.files:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        new, count, kept = cut(text, path, keeps, enums)
        if count and not args.dry_run:
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(new)
        if count or kept:
            note = f" (kept on line{'s' if len(kept) > 1 else ''} {', '.join(map(str, kept))})" if kept else ""
            print(f"{count:5d}  {path}{note}")
        total += count
    print(f"{total:5d}  in all{' (dry run: nothing written)' if args.dry_run else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
