"""Whether a registered env can run on this machine: the requirements its spec names, checked cheaply.

A spec's `requires` is a tuple of plain strings, so adapters can keep them in their cached id lists:

| requirement | met when |
|---|---|
| `nltk:<resource>` | the NLTK data is installed (`nltk:words`) |
| `java` | a `java` binary is on PATH (ScienceWorld's simulator runs in a JVM) |
| `platform:<machine>` | `platform.machine()` is that (`platform:x86_64`: TextWorld's bundled Inform 7 compilers) |
| `python>=3.12` | the interpreter is at least that version |
| `hf-dataset:<name>` | the Hugging Face dataset is in the local hub cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`) |
| `network:<service>` | never: the env calls a hosted service, and envhub makes no network calls at run time |
| `download:<what>` | never: the env downloads data at run time, which envhub does not do |
| `broken:<why>` | never: the installed package cannot run this env (e.g. files missing from its wheel) |

`envhub list --available` hides ids with an unmet requirement, `envhub list` marks them, `envhub info`
gives the reason, and `envhub.make` refuses them with one line (`EnvUnavailable`) instead of failing
somewhere inside the other package.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import sys
from typing import Any

_HINTS = {
    "nltk": "install the data once where the internet is reachable: python -m nltk.downloader {arg}",
    "java": "install a Java runtime: apt-get install default-jre-headless",
    "platform": "run it on a {arg} machine",
    "python": "run it with a newer Python",
    "hf-dataset": "fetch it once where the internet is reachable: huggingface-cli download --repo-type dataset {arg}",
    "network": "pick another env",
    "download": "pick another env",
    "broken": "pick another env",
}


@functools.cache
def problem(requirement: str) -> str:
    """Why `requirement` is not met here ("" when it is)."""
    kind, _, arg = requirement.partition(":")
    if kind == "nltk":
        return _nltk_problem(arg)
    if kind == "java":
        return "" if shutil.which("java") else "needs a Java runtime (no `java` on PATH)"
    if kind == "platform":
        machine = platform.machine()
        return "" if machine == arg else f"needs a {arg} machine (this is {machine})"
    if kind == "hf-dataset":
        return "" if _hf_cached(arg) else f"needs the Hugging Face dataset {arg!r}, which is not in the local cache"
    if requirement.startswith("python>="):
        wanted = tuple(int(x) for x in requirement.removeprefix("python>=").split("."))
        here = ".".join(map(str, sys.version_info[:2]))
        return "" if sys.version_info[: len(wanted)] >= wanted else f"needs {requirement} (this is {here})"
    if kind == "network":
        return f"calls {arg} over the network; envhub makes no network calls at run time"
    if kind == "download":
        return f"downloads {arg} at run time, which envhub does not do"
    if kind == "broken":
        return arg or "the installed package cannot run it"
    return f"unknown requirement {requirement!r}"


def hint(requirement: str) -> str:
    """What to do about an unmet requirement."""
    kind, _, arg = requirement.partition(":")
    kind = "python" if requirement.startswith("python>=") else kind
    return _HINTS.get(kind, "pick another env").format(arg=arg)


def unmet(requires: tuple[str, ...] | list[str]) -> tuple[str, str] | None:
    """The first unmet requirement as (why, what to do), or None when all are met."""
    for requirement in requires:
        why = problem(requirement)
        if why:
            return why, hint(requirement)
    return None


def unavailable(spec: Any) -> str:
    """Why the env of `spec` cannot run here ("" when it can)."""
    found = unmet(getattr(spec, "requires", ()))
    return found[0] if found else ""


def _hf_cached(name: str) -> bool:
    """Whether the Hugging Face hub cache holds dataset `name` (envhub never fetches it)."""
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")
    return os.path.isdir(os.path.join(hub, "datasets--" + name.replace("/", "--")))


def _nltk_problem(resource: str) -> str:
    paths = {"words": "corpora/words", "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng"}
    try:
        import nltk
    except ImportError:
        return f"needs NLTK and its data {resource!r}"
    try:
        nltk.data.find(paths.get(resource, resource))
    except LookupError:
        return f"needs the NLTK data {resource!r}, which is not installed"
    return ""
