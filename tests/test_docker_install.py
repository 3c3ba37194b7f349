"""The Dockerfile's pip installs resolve, for every ACCELERATOR it offers (Docker itself cannot run here).

Reads the `RUN pip install` lines from the Dockerfile (so the test follows edits to it), then asks a fresh virtual
environment's pip to resolve them with `--dry-run --report` against PyPI, ignoring this machine's pip config (local
wheel folders, constraints) the way a clean python:3.11-slim image would. Needs PyPI; skipped when it is unreachable.
About a minute: the three resolutions run side by side.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"

pytestmark = pytest.mark.slow


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current)
        current = ""
    pairs = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        pairs.append((keyword.upper(), rest.strip()))
    return pairs


def install_plan(accelerator: str) -> list[list[str]]:
    """The pip argument lists the Dockerfile runs for this ACCELERATOR build arg, ${VARS} filled from ARG defaults."""
    instructions = dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))
    args = {}
    for keyword, rest in instructions:
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name.strip()] = value.strip()
    args["ACCELERATOR"] = accelerator

    def expand(text: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)

    plan = []
    for keyword, rest in instructions:
        if keyword != "RUN" or "pip install" not in rest:
            continue
        case = re.search(r"case\s+\"?\$\{?ACCELERATOR\}?\"?\s+in(.*)esac", rest)
        if case:
            branches = dict(re.findall(r"(\w+)\)\s*([^;]*);;", case.group(1)))
            assert accelerator in branches, f"Dockerfile has no ACCELERATOR={accelerator} branch"
            command = branches[accelerator].strip()
            if "pip install" not in command:
                continue
        else:
            command = rest
        for part in command.split("&&"):
            words = shlex.split(expand(part))
            if words[:2] == ["pip", "install"]:
                plan.append(words[2:])
    return plan


@pytest.fixture(scope="module")
def fresh_pip(tmp_path_factory) -> list[str]:
    env_dir = tmp_path_factory.mktemp("docker-venv")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    return [str(env_dir / "bin" / "python"), "-m", "pip"]


def resolve(pip: list[str], plan: list[list[str]], report: pathlib.Path) -> dict[str, str]:
    """Resolve all of the plan's installs together (later layers may upgrade earlier ones) -> {name: version}."""
    requirements = [arg for step in plan for arg in step]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_DEFAULT_TIMEOUT="60")
    if "PIP_CERT" in os.environ:
        env["PIP_CERT"] = os.environ["PIP_CERT"]
    command = [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), *requirements]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    offline = re.search(r"NewConnectionError|Name or service not known|ConnectTimeout|Network is unreachable",
                        done.stderr)  # fmt: skip
    if done.returncode != 0 and offline and not os.environ.get("CI"):  # in CI an unreachable PyPI is a failure
        pytest.skip(f"PyPI unreachable: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, f"{shlex.join(command)}\n{done.stderr[-3000:]}"
    data = json.loads(report.read_text())
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in data["install"]}


def test_plan_is_read_from_the_dockerfile():
    assert install_plan("cpu") == [["-r", "requirements.txt"]]
    assert install_plan("tpu") == [["-r", "requirements.txt"], ["jax[tpu]==0.10.2"]]
    assert install_plan("cuda12") == [["-r", "requirements.txt"], ["jax[cuda12]==0.10.2"]]
    assert install_plan("auto") == [["-r", "requirements.txt"], ["jax[tpu,cuda12]==0.10.2"]]
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.MULTILINE)
    assert re.search(r"^ARG ACCELERATOR=auto$", text, re.MULTILINE)
    assert re.search(r"useradd .*--uid 1000", text)
    assert 'CMD ["python", "app.py"]' in text
    # requirements are installed before the code is copied (dependency layer survives code edits)
    assert text.index("pip install -r requirements.txt") < text.index("COPY --chown=user:user app.py")


def test_every_accelerator_resolves_with_jaxlib_0_10_2(fresh_pip, tmp_path):
    accelerators = ["cpu", "tpu", "cuda12", "auto"]
    with concurrent.futures.ThreadPoolExecutor(len(accelerators)) as pool:
        futures = {
            acc: pool.submit(resolve, fresh_pip, install_plan(acc), tmp_path / f"{acc}.json") for acc in accelerators
        }
        resolved = {acc: future.result() for acc, future in futures.items()}
    for acc, versions in resolved.items():
        assert versions.get("jax") == "0.10.2", (acc, versions.get("jax"))
        assert versions.get("jaxlib") == "0.10.2", (acc, versions.get("jaxlib"))
        assert versions.get("gradio") == "6.17.3", acc
        assert versions.get("flax") == "0.12.8", acc
        assert versions.get("diffusers") == "0.39.0", acc
    assert "libtpu" in resolved["tpu"]
    assert resolved["cuda12"].get("jax-cuda12-plugin") == "0.10.2"
    assert resolved["cuda12"].get("jax-cuda12-pjrt") == "0.10.2"
    assert not any(name.startswith(("libtpu", "jax-cuda")) for name in resolved["cpu"])
    assert "libtpu" in resolved["auto"] and resolved["auto"].get("jax-cuda12-plugin") == "0.10.2"


if __name__ == "__main__":  # python tests/test_docker_install.py prints the plans
    for acc in ("cpu", "tpu", "cuda12", "auto"):
        print(acc, install_plan(acc), file=sys.stdout)
