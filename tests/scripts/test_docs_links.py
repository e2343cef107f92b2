"""The docs stay navigable: every page (but the generated ablations.md) is at most 300 lines, and
every docs link or `docs/....md` mention in the README, the docs and the code names a page that
exists and, with `#anchor`, a heading of that page (so splitting a page cannot leave stale links)."""

import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True))
# Markdown links relative to the file, and repo-relative mentions such as docs/benchmarks/gpu.md#x.
LINK = re.compile(r"\]\(([^)\s#]+\.md)(#[\w-]+)?\)")
MENTION = re.compile(r"(?<![\w/.])(docs/[\w/.-]+?\.md)(#[\w-]+)?")


def _anchors(path):
  """GitHub's heading slugs: lower case, punctuation dropped, spaces to hyphens."""
  with open(path, encoding="utf-8") as f:
    headings = [line.lstrip("#").strip() for line in f if re.match(r"#{1,6} ", line)]
  return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_docs_pages_are_at_most_300_lines():
  long = {}
  for path in PAGES:
    if os.path.basename(path) == "ablations.md":
      continue
    with open(path, encoding="utf-8") as f:
      n = sum(1 for _ in f)
    if n > 300:
      long[os.path.relpath(path, REPO)] = n
  assert long == {}


def test_docs_links_and_mentions_resolve():
  sources = [os.path.join(REPO, "README.md")] + PAGES
  for folder in ("tfjax", "configs", "experiments", "scripts", "tests"):
    sources += glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True)
  sources.remove(os.path.abspath(__file__))  # its docstring's examples are not links
  broken = []
  for source in sources:
    with open(source, encoding="utf-8") as f:
      text = f.read()
    targets = [(os.path.join(REPO, m.group(1)), m.group(2)) for m in MENTION.finditer(text)]
    if source.endswith(".md"):
      targets += [(os.path.join(os.path.dirname(source), m.group(1)), m.group(2))
                  for m in LINK.finditer(text) if "://" not in m.group(1)]
    for target, anchor in targets:
      target = os.path.normpath(target)
      if not os.path.exists(target):
        broken.append((os.path.relpath(source, REPO), os.path.relpath(target, REPO)))
      elif anchor and anchor[1:] not in _anchors(target):
        broken.append((os.path.relpath(source, REPO), os.path.relpath(target, REPO) + anchor))
  assert broken == []
