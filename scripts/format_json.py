#!/usr/bin/env python3
"""Rewrites trainyard's JSON data files in the house style: small objects and arrays on one line.
Usage: scripts/format_json.py FILE..."""
import json
import sys


def dump(value, indent=0):
    pad = "  " * indent
    one_line = json.dumps(value)
    if isinstance(value, dict):
        nested_big = any(isinstance(v, (dict, list)) and len(json.dumps(v)) > 60 for v in value.values())
        if len(one_line) + len(pad) < 110 and not nested_big:
            return one_line
        items = [f'{pad}  {json.dumps(k)}: {dump(v, indent + 1)}' for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list):
        if len(one_line) + len(pad) < 110:
            return one_line
        return "[\n" + ",\n".join(f"{pad}  {dump(v, indent + 1)}" for v in value) + "\n" + pad + "]"
    return one_line


for path in sys.argv[1:]:
    with open(path) as f:
        data = json.load(f)
    text = dump(data) + "\n"
    with open(path, "w") as f:
        f.write(text)
