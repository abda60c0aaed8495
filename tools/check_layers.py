#!/usr/bin/env python3
"""Checks the layer order of include/edl/ (docs/architecture.md, the ctest test `layers`).

    python3 tools/check_layers.py include/edl

Every header under include/edl/<layer>/ (detail/, backends/ and other subfolders too) is read
and three rules are checked:
  1. layer order: `#include <edl/X/...>` must name a layer that ALLOWED lists for the header's
     own layer (or its own layer);
  2. detail/ is private: no header includes another layer's `detail/` headers;
  3. SIMD lives in kernels/: headers of NO_SIMD layers use neither xsimd nor intrinsics.
Prints each violation (file:line, the rule, the offending line) and exits 1 if there is any.
The top-level edl.hpp (includes everything) and version.hpp (macros only) are exempt.
"""

import re
import sys
from pathlib import Path

# The order of the layers: each may include the layers before it, with the exceptions below.
ORDER = ["core", "quant", "mesh", "tensor", "kernels", "nn", "io", "tokenizer", "chat", "optim", "lora", "models"]
ALLOWED = {layer: set(ORDER[:i]) for i, layer in enumerate(ORDER)}
# kernels work on raw pointers, so they need core (threads, dtypes, errors) and the block
# formats of quantized weights (quant), nothing else.
ALLOWED["kernels"] = {"core", "quant"}
# generate (serving) and train are peers: each may include every layer before them, not each other.
ALLOWED["generate"] = set(ORDER)
ALLOWED["train"] = set(ORDER)
# serve (HTTP over the continuous batching engine) sits on generate.
ALLOWED["serve"] = set(ORDER) | {"generate"}

# Layers whose headers must leave SIMD to kernels/ (rule 3): all but kernels and core, whose
# exec helpers need _mm_setcsr / _mm_pause.
NO_SIMD = set(ALLOWED) - {"kernels", "core"}

# Top-level headers: not checked themselves; version.hpp may be included by anyone.
EXEMPT_FILES = {"edl.hpp", "version.hpp"}
INCLUDABLE_TOP = {"version.hpp"}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](edl/[^>"]+)[>"]')
SIMD = [
    (re.compile(r'#\s*include\s*[<"]xsimd'), "#include <xsimd"),
    (re.compile(r'#\s*include\s*[<"](immintrin|x86intrin|arm_neon)\.h'), "an intrinsics header"),
    (re.compile(r"\bxsimd::"), "xsimd::"),
    (re.compile(r"\b_mm\w*"), "_mm intrinsic"),
    (re.compile(r"\b__m(128|256|512)\w*"), "__m vector type"),
]


def strip_comments(lines):
    """The lines with // and /* */ comments blanked (string literals are not parsed: a
    "//" inside one only hides the rest of its line, which is harmless here)."""
    out, in_block = [], False
    for line in lines:
        s, i = "", 0
        while i < len(line):
            if in_block:
                end = line.find("*/", i)
                if end < 0:
                    i = len(line)
                else:
                    in_block, i = False, end + 2
            elif line.startswith("//", i):
                break
            elif line.startswith("/*", i):
                in_block, i = True, i + 2
            else:
                s += line[i]
                i += 1
        out.append(s)
    return out


def check_header(root, path):
    """The violations of one header, as (line number, text, rule) tuples."""
    rel = path.relative_to(root)
    layer = rel.parts[0]
    found = []
    raw = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for n, line in enumerate(strip_comments(raw), start=1):
        m = INCLUDE.match(line)
        if m:
            parts = Path(m.group(1)).parts  # ("edl", "io", "detail", "atomic_file.hpp")
            if len(parts) == 2:
                if parts[1] not in INCLUDABLE_TOP:
                    found.append((n, m.group(0).strip(), f"rule 1: {layer}/ may not include edl/{parts[1]}"))
                continue
            target = parts[1]
            if target != layer and target not in ALLOWED.get(layer, set()):
                allowed = ", ".join(x for x in ORDER if x in ALLOWED.get(layer, set())) or "nothing"
                found.append((n, m.group(0).strip(),
                              f"rule 1: {layer}/ may include {allowed}; not {target}/"))
            if target != layer and "detail" in parts[2:-1]:
                found.append((n, m.group(0).strip(),
                              f"rule 2: {layer}/ may not include {target}/'s detail/ (private to {target}/)"))
        if layer in NO_SIMD:
            for pattern, what in SIMD:
                if pattern.search(line):
                    found.append((n, raw[n - 1].strip(), f"rule 3: {layer}/ may not use {what} (SIMD lives in kernels/)"))
                    break
    return found


def main(argv):
    if len(argv) != 2:
        print("usage: check_layers.py <include/edl>", file=sys.stderr)
        return 2
    root = Path(argv[1])
    if not root.is_dir():
        print(f"check_layers.py: {root} is not a folder", file=sys.stderr)
        return 2
    known = set(ALLOWED)
    violations = 0
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in (".hpp", ".h"):
            continue
        rel = path.relative_to(root)
        if len(rel.parts) == 1:
            if rel.name not in EXEMPT_FILES:
                print(f"{path}: a top-level header outside every layer (add it to a layer folder)")
                violations += 1
            continue
        if rel.parts[0] not in known:
            # A new folder must get a place in the order before it can hold headers.
            print(f"{path}: folder {rel.parts[0]}/ is not a layer in tools/check_layers.py")
            violations += 1
            continue
        for n, text, rule in check_header(root, path):
            print(f"{path}:{n}: {rule}\n    {text}")
            violations += 1
    if violations:
        print(f"{violations} layer violation(s); the order is in docs/architecture.md")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
