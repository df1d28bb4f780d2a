"""Every ```python block of README.md and docs/*.md runs as written: each in a fresh
interpreter, in an empty temporary working directory, with a time limit.

A block that is not meant to run (a shell session, output, a diagram) has another fence
language (```sh, ```console, ```text); a fence without a language is refused, so no Python
hides from this test. The blocks that use Spark (they import ``k7core.spark``) run one
after another in one interpreter, so that they share one JVM: each with its own globals (it
brings its own imports and setup), all in one working directory, the one Spark started in
(its Python workers resolve relative paths there), so they use paths of their own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._queuehelp import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
TIMEOUT = 60
SPARK_TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def spark(self) -> bool:
        return "k7core.spark" in self.code


def blocks() -> list[Block]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(Block(doc, line, m[1].strip(), m[2]))
    return out


PYTHON = [b for b in blocks() if b.lang == "python"]


def test_every_fence_names_its_language() -> None:
    bare = [b.where for b in blocks() if not b.lang]
    assert not bare, f"fences without a language (python, sh, console or text): {bare}"


def test_there_are_blocks_of_each_kind() -> None:
    assert [b for b in PYTHON if b.spark] and [b for b in PYTHON if not b.spark]


def _python(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.parametrize("block", [b for b in PYTHON if not b.spark], ids=lambda b: b.where)
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    (tmp_path / "block.py").write_text(block.code)
    r = _python(["block.py"], tmp_path, TIMEOUT)
    assert r.returncode == 0, f"{block.where} failed:\n{r.stdout}\n{r.stderr}"


# Runs each block (argv: a JSON list of [where, code]) with fresh globals; prints the
# places of the blocks that raised, their tracebacks on stderr.
SPARK_RUNNER = """
import json, sys, traceback
failed = []
for where, code in json.loads(sys.argv[1]):
    try:
        exec(compile(code, where, "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        failed.append(where)
print(json.dumps(failed))
"""


@pytest.mark.spark
def test_spark_blocks_run(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    spark = [[b.where, b.code] for b in PYTHON if b.spark]
    r = _python(["-c", SPARK_RUNNER, json.dumps(spark)], tmp_path, SPARK_TIMEOUT)
    assert r.returncode == 0, r.stderr
    failed = json.loads(r.stdout.strip().splitlines()[-1])
    assert not failed, f"{failed} failed:\n{r.stderr}"
