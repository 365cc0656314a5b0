"""Mine chat prompts for the drafter campaign from text this machine ships: Python functions and classes (the
standard library and the installed packages) and prose (Debian's /usr/share/doc, package READMEs and docstrings).

Each prompt pairs a passage with a task whose answer reuses it: rewrite, annotate, test, summarise, list, fix. The
target's answers to such prompts repeat earlier text, which is what the drafter has to learn to copy. Public
evaluation sets never enter: any file whose path or text names one is skipped.

The output is deterministic for a given set of installed files (sorted walk, seeded choices):

    python scripts/mine_prompts.py --out runs/campaign/prompts/mined.jsonl --count 40000
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import random
import re
import sys
import sysconfig
from pathlib import Path

EVAL_SETS = re.compile(r"humaneval|human_eval|mt[-_ ]?bench|gsm8k|alpaca|mbpp|hellaswag|mmlu|truthfulqa|arc[-_]challenge",
                       re.IGNORECASE)
CODE_TASKS = [
    "Add a docstring to this Python {kind} and return the whole {kind}.",
    "Add type hints to this Python {kind}. Return the updated code.",
    "Add short comments that explain each step of this code, and return the commented code.",
    "Rename the variables in this code to clearer names, without changing what it does.",
    "Explain what this {kind} does, line by line.",
    "Write pytest unit tests for this {kind}.",
    "Review this code: point out possible bugs or unclear parts, then show an improved version.",
    "Summarize what this code does in a few sentences, then list its inputs and outputs.",
    "Rewrite this {kind} so that it is easier to read.",
    "What does this {kind} return? Walk through an example call.",
]
PROSE_TASKS = [
    "Summarize the following text in a few sentences.",
    "Turn the following text into a bulleted list of its key points.",
    "Rewrite the following text in plain, simple English.",
    "Correct any spelling or grammar mistakes in the following text and return the corrected text.",
    "List every name, version number and date that appears in the following text.",
    "Write a short title for the following text, then a one-paragraph summary.",
    "Explain the following text to a beginner.",
    "Quote the most important sentence of the following text and explain why it matters.",
    "Rewrite the following text as a short email to a colleague.",
    "What questions does the following text answer? List them with their answers.",
]
SYSTEMS = [None, None, None, "You are a helpful assistant.", "You are a senior software engineer.",
           "You are a patient teacher.", "You answer concisely."]


def code_passages(files: list[Path], max_lines: int) -> list[tuple[str, str, str]]:
    """(source, kind, text) for each top-level function/class or method of 5..max_lines lines."""
    out = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, OSError):
            continue
        if EVAL_SETS.search(str(path)) or EVAL_SETS.search(text):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                n = node.end_lineno - node.lineno + 1
                if 5 <= n <= max_lines:
                    segment = ast.get_source_segment(text, node)
                    if segment and segment.isascii():
                        kind = "class" if isinstance(node, ast.ClassDef) else "function"
                        out.append((f"{path.name}:{node.name}", kind, segment))
    return out


def prose_passages(files: list[Path], min_words: int, max_words: int) -> list[tuple[str, str]]:
    """(source, text) paragraphs groups of min..max words from plain-text docs."""
    out = []
    for path in files:
        try:
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        if not text.isascii() or EVAL_SETS.search(text):
            continue
        chunk: list[str] = []
        for para in re.split(r"\n\s*\n", text):
            para = para.strip()
            if not para or sum(c.isalpha() for c in para) < 0.6 * len(para):
                continue  # tables, separators, code listings
            chunk.append(para)
            words = sum(len(p.split()) for p in chunk)
            if words >= min_words:
                if words <= max_words:
                    out.append((path.as_posix(), "\n\n".join(chunk)))
                chunk = []
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=40000)
    ap.add_argument("--code-share", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    py_files = sorted({p for r in roots if r.exists() for p in r.rglob("*.py") if "test" not in p.as_posix()})
    doc_root = Path("/usr/share/doc")
    doc_files = sorted(p for p in doc_root.rglob("*") if p.is_file() and re.search(
        r"(readme|news|changelog|changes|history|faq|copyright|\.txt)(\.gz)?$", p.name, re.IGNORECASE))
    doc_files += sorted(p for r in roots[1:] for p in r.rglob("*") if p.suffix in (".md", ".rst", ".txt")
                        and p.is_file() and p.stat().st_size < 200_000)
    code = code_passages(py_files, max_lines=45)
    prose = prose_passages(doc_files, min_words=60, max_words=220)
    print(f"{len(py_files)} Python files -> {len(code)} code passages; {len(doc_files)} docs -> "
          f"{len(prose)} prose passages", file=sys.stderr)

    rng = random.Random(args.seed)
    rng.shuffle(code)
    rng.shuffle(prose)
    n_code = min(len(code), round(args.count * args.code_share))
    n_prose = min(len(prose), args.count - n_code)
    prompts, seen = [], set()
    for i in range(n_code + n_prose):
        if i < n_code:
            source, kind, passage = code[i]
            task = rng.choice(CODE_TASKS).format(kind=kind)
            content = f"{task}\n\n```python\n{passage}\n```" if rng.random() < 0.8 else f"```python\n{passage}\n```\n\n{task}"
            category = "code"
        else:
            source, passage = prose[i - n_code]
            task = rng.choice(PROSE_TASKS)
            content = f"{task}\n\n{passage}"
            category = "prose"
        digest = hashlib.sha1(content.encode()).hexdigest()[:12]
        if digest in seen:
            continue
        seen.add(digest)
        system = rng.choice(SYSTEMS)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
        prompts.append({"id": f"mined-{category}-{digest}", "category": category, "source": source,
                        "messages": messages})
    rng.shuffle(prompts)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"{len(prompts)} prompts -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
