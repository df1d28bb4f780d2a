"""The optional parts of k7core say which pip extra they need when it is not installed, and
the extras ask for the versions the code needs."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

from tests._queuehelp import ROOT

# A module set to None in sys.modules is how Python itself reports it as not installed
# (the import raises ModuleNotFoundError): the real import machinery, one module taken away.
IMPORT_WITHOUT = """
import importlib, sys
sys.modules[sys.argv[1]] = None
importlib.import_module(sys.argv[2])
"""


def _import_without(missing: str, module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", IMPORT_WITHOUT, missing, module],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("missing", "module", "extra"), [
    ("pyarrow", "k7core.spark", "spark"),
    ("pyspark", "k7core.spark", "spark"),
    ("prometheus_client", "k7core.metrics", "metrics"),
    ("prometheus_client", "k7core.jobs.metrics", "metrics"),
])
def test_a_missing_extra_names_the_pip_install(missing: str, module: str, extra: str) -> None:
    r = _import_without(missing, module)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"k7core._errors.MissingExtraError: {module} needs the '{extra}' "
                           f"extra ("), r.stderr
    assert missing in last and last.endswith(f"): pip install 'k7py[{extra}]'"), r.stderr
    from k7core._errors import MissingExtraError

    assert issubclass(MissingExtraError, ModuleNotFoundError)


def test_the_command_line_without_its_extra_says_so_without_a_traceback() -> None:
    r = _import_without("click", "k7core.__main__")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "k7: the command line needs the 'cli' extra (import of click halted; None in "
        "sys.modules): pip install 'k7py[cli]'"
    )


def test_the_spark_extra_asks_for_the_pyspark_that_streaming_needs() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for name in ("spark", "test"):
        (spec,) = [Requirement(r).specifier for r in extras[name] if r.startswith("pyspark")]
        assert not spec.contains("4.1.4") and spec.contains("4.2.0"), (name, spec)
