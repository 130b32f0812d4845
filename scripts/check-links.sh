#!/usr/bin/env bash
# Every relative link in the README and docs/ must resolve inside the repository, and the
# README must not send readers to the issue tracker. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import os, re, sys
repo = os.path.realpath(".")
files = ["README.md"] + sorted(
    os.path.join(d, f) for d, _, fs in os.walk("docs") for f in fs if f.endswith(".md"))
files += ["hardware-managers/PLUGINS.md"]
link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
bad = []
for f in files:
    text = open(f, encoding="utf-8").read()
    # Links inside fenced code blocks are examples, not links.
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in link.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        resolved = os.path.realpath(os.path.join(os.path.dirname(f), path))
        if not resolved.startswith(repo + os.sep) and resolved != repo:
            bad.append(f"{f}: {target} points outside the repository")
        elif not os.path.exists(resolved):
            bad.append(f"{f}: {target} does not exist")
readme = open("README.md", encoding="utf-8").read()
for m in re.finditer(r"(?i)\b(see )?issue #?\d+", readme):
    bad.append(f"README.md: refers to an issue ({m.group(0)!r}); say what is meant instead")
if bad:
    print("check-links: broken documentation links:", *bad, sep="\n  ")
    sys.exit(1)
print(f"check-links: {len(files)} files, every relative link resolves")
PY
