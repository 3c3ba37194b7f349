"""The Dockerfile's pip installs resolve, for every ACCELERATOR it offers, and the files it copies make an app that
starts (Docker itself cannot run here).

The image's files: `copy_image_files` copies what the Dockerfile's COPY lines take from the build context, less
.dockerignore, the way Docker does; `python app.py --help` runs from that copy here, and
tests/system/test_app_process.py serves a request from it and stops it with a signal (what `docker stop` sends).

Reads the `RUN pip install` lines from the Dockerfile (so the test follows edits to it). CI checks them from package
metadata only (`test_accelerator_pins_from_metadata`, a few hundred KB: the index's file lists, and each wheel's
METADATA read out of the wheel on the index with HTTP range requests, never the whole wheel), because pip itself
downloads every CUDA wheel (GBs) to read its metadata when the index serves no separate metadata files.
`python -m pytest -m downloads tests/system/test_docker_install.py` also runs pip's full `--dry-run` resolution, as
before. Needs PyPI; skipped when it is unreachable (outside CI).
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import venv
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository (also when run as a script)
DOCKERFILE = ROOT / "Dockerfile"

#: The index the Docker image installs from (a clean python:3.11-slim has no other).
INDEX = os.environ.get("SDXL_TEST_INDEX", "https://pypi.org/simple")
#: The platform the image runs on: CPython 3.11 on x86-64 Linux.
WHEEL_TAGS = ("py3-none-any", "cp311-cp311-manylinux", "py3-none-manylinux")
MARKER_ENV = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


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


# ---- the image's files, copied the way Docker copies them ----------------------------------------------------------


def dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    """.dockerignore as (is an exception "!", compiled pattern) pairs, in file order (the last match wins).

    Docker's rules (moby/patternmatcher): `*` and `?` stay inside one path element, `**` spans any number of them,
    a pattern matching a folder excludes everything in it, a leading `/` is dropped."""
    patterns = []
    for raw in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        text = line[1:].strip() if exception else line
        text = os.path.normpath(text).lstrip("/")
        regex, i = "", 0
        while i < len(text):
            if text.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif text.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif text[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif text[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif text[i] == "[":
                end = text.index("]", i)
                regex, i = regex + text[i : end + 1].replace("[!", "[^"), end + 1
            else:
                regex, i = regex + re.escape(text[i]), i + 1
        patterns.append((exception, re.compile(regex + r"\Z")))
    return patterns


def ignored(relative: str, patterns: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether Docker leaves this context path (posix, relative) out of the build context."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]  # the path and every folder above it
    verdict = False
    for exception, pattern in patterns:
        if any(pattern.match(candidate) for candidate in candidates):
            verdict = not exception
    return verdict


def copy_image_files(destination: pathlib.Path) -> list[str]:
    """Copy what the Dockerfile's COPY lines put under its WORKDIR into `destination`, from the build context less
    .dockerignore, as Docker does (a folder source copies its contents). The copied paths, relative."""
    import glob
    import shutil

    patterns = dockerignore_patterns()
    copied = []
    for keyword, rest in dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8")):
        if keyword != "COPY":
            continue
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        words = [w for w in words if not w.startswith("--")]  # --chown=..., --chmod=...
        *sources, target = words
        for source in sources:
            matches = sorted(glob.glob(source, root_dir=ROOT)) or [source]
            for match in matches:
                origin = ROOT / match
                assert origin.exists(), f"Dockerfile: COPY {source}: not in the build context"
                if origin.is_dir():  # its contents go into the target folder
                    files = [p for p in origin.rglob("*") if p.is_file()]
                    pairs = [(p, destination / target / p.relative_to(origin)) for p in files]
                else:  # into a folder ("dir/", "."), or as the target file
                    into = target.endswith(("/", "."))
                    pairs = [(origin, destination / target / origin.name if into else destination / target)]
                for path, out in pairs:
                    if ignored(path.relative_to(ROOT).as_posix(), patterns):
                        continue
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, out)
                    copied.append(out.relative_to(destination).as_posix())
    return copied


def test_dockerignore_rules_follow_docker():
    patterns = dockerignore_patterns()
    assert ignored("pipeline/__pycache__/x.pyc", patterns)
    assert ignored("tests/fixtures/tiny-pt/model_index.json", patterns)
    assert ignored("README.md", patterns) and not ignored("pipeline/README.md", patterns)  # "*.md": the root only
    assert not ignored("assets/header.md", patterns)  # the "!assets/*.md" exception
    assert not ignored("web/page/layout.py", patterns)


def test_the_image_files_start_the_app_and_the_cli(tmp_path):
    copied = copy_image_files(tmp_path)
    assert {"app.py", "requirements.txt"} <= set(copied)  # what is missing besides shows when the app starts
    assert not [p for p in copied if p.startswith(("tests/", "bench/")) or "__pycache__" in p]
    for command in (["app.py", "--help"], ["-m", "pipeline", "generate", "--help"]):
        done = subprocess.run(
            [sys.executable, *command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": ""},
            check=False,
        )
        assert done.returncode == 0 and "usage:" in done.stdout, (command, done.stderr[-2000:])


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
    offline = re.search(
        r"NewConnectionError|Name or service not known|ConnectTimeout|Network is unreachable", done.stderr
    )
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


@pytest.mark.slow
@pytest.mark.downloads
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
        assert versions.get("gradio") == "6.31.0", acc
        assert versions.get("flax") == "0.12.8", acc
        assert "diffusers" not in versions and "transformers" not in versions, acc  # requirements-reference.txt
    assert "libtpu" in resolved["tpu"]
    assert resolved["cuda12"].get("jax-cuda12-plugin") == "0.10.2"
    assert resolved["cuda12"].get("jax-cuda12-pjrt") == "0.10.2"
    assert not any(name.startswith(("libtpu", "jax-cuda")) for name in resolved["cpu"])
    assert "libtpu" in resolved["auto"] and resolved["auto"].get("jax-cuda12-plugin") == "0.10.2"


# ---- from metadata only --------------------------------------------------------------------------------------------


class _RangeFile(io.RawIOBase):
    """A file on the index read with HTTP range requests: zipfile reads a wheel's directory and METADATA only."""

    def __init__(self, client, url: str):
        self.client, self.url, self.pos, self.fetched = client, url, 0, 0
        head = client.head(url, follow_redirects=True)
        head.raise_for_status()
        self.size = int(head.headers["content-length"])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.size - self.pos)
        if count <= 0:
            return 0
        reply = self.client.get(
            self.url, headers={"Range": f"bytes={self.pos}-{self.pos + count - 1}"}, follow_redirects=True
        )
        assert reply.status_code == 206, f"{self.url}: the index does not serve byte ranges ({reply.status_code})"
        data = reply.content
        buffer[: len(data)] = data
        self.pos += len(data)
        self.fetched += len(data)
        return len(data)


class _Index:
    """Just enough of the simple API (PEP 691 JSON) to list a project's files and read a wheel's requirements."""

    def __init__(self, client):
        self.client = client
        self.fetched = 0  # bytes of wheels read (metadata only)

    def files(self, name: str) -> list[dict]:
        reply = self.client.get(
            f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}, follow_redirects=True
        )
        reply.raise_for_status()
        return reply.json()["files"]

    def versions(self, name: str) -> set:
        from packaging.utils import parse_wheel_filename

        found = set()
        for file in self.files(name):
            if file["filename"].endswith(".whl") and any(t in file["filename"] for t in WHEEL_TAGS + ("x86_64",)):
                found.add(parse_wheel_filename(file["filename"])[1])
        return found

    def requirements(self, name: str, version: str, extras: set[str]) -> list:
        """Requires-Dist of `name==version` (its wheel for the image's platform) that apply with `extras`."""
        from packaging.requirements import Requirement
        from packaging.utils import parse_wheel_filename

        wheels = [
            f
            for f in self.files(name)
            if f["filename"].endswith(".whl")
            and str(parse_wheel_filename(f["filename"])[1]) == version
            and any(t in f["filename"] for t in WHEEL_TAGS)
            and f["filename"].endswith(("any.whl", "x86_64.whl"))
        ]
        assert wheels, f"no {name} {version} wheel for CPython 3.11 on x86-64 Linux on {INDEX}"
        raw = _RangeFile(self.client, wheels[0]["url"])
        with zipfile.ZipFile(io.BufferedReader(raw, 64 * 1024)) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            text = wheel.read(member).decode("utf-8")
        self.fetched += raw.fetched
        wanted = []
        for line in text.splitlines():
            if line.startswith("Requires-Dist:"):
                requirement = Requirement(line.split(":", 1)[1].strip())
                marker = requirement.marker
                if marker is None or any(marker.evaluate({**MARKER_ENV, "extra": e}) for e in extras or {""}):
                    wanted.append(requirement)
        return wanted


def accelerator_closure(index: _Index, requirement_text: str) -> dict:
    """{name: specifier set} of everything `jax[...]==V` adds for its extras, following the accelerator plugins'
    own extras (jax-cuda12-plugin[with-cuda]); each leaf is checked to have a satisfying release on the index."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    root = Requirement(requirement_text)
    (version,) = [spec.version for spec in root.specifier]
    found: dict = {}
    queue = [(canonicalize_name(root.name), version, set(root.extras))]
    while queue:
        name, exact, extras = queue.pop()
        for requirement in index.requirements(name, exact, extras):
            child = canonicalize_name(requirement.name)
            found[child] = found.get(child, requirement.specifier) & requirement.specifier
            if child.startswith("jax-cuda") and child.endswith("-plugin"):  # the plugin's own [with-cuda] extra
                pinned = max(v for v in index.versions(child) if v in requirement.specifier)
                queue.append((child, str(pinned), set(requirement.extras)))
    return found


def test_accelerator_pins_from_metadata():
    """Each ACCELERATOR's `jax[...]==0.10.2` keeps jaxlib at requirements.txt's 0.10.2, brings libtpu 0.0.42.* (TPU)
    or the CUDA 12 plugin and PJRT at 0.10.2 with the CUDA wheels (GPU), and every one of those exists on the index:
    read from metadata only (well under 5 MB in all, no wheel downloaded whole)."""
    import httpx
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"python_version": "3.11"}):
                continue  # the Dockerfile's Python is 3.11 (requirements.txt pins the jax 0.11 line for >= 3.12)
            pinned[canonicalize_name(requirement.name)] = requirement.specifier
    assert str(pinned["jax"]) == str(pinned["jaxlib"]) == "==0.10.2"
    try:
        client = httpx.Client(timeout=60)
        index = _Index(client)
        index.files("jax")
    except httpx.HTTPError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"package index unreachable: {exc.__class__.__name__}")
    closures = {}
    try:
        for accelerator in ("cpu", "tpu", "cuda12", "auto"):
            extra = [args for args in install_plan(accelerator) if args != ["-r", "requirements.txt"]]
            closures[accelerator] = accelerator_closure(index, extra[0][0]) if extra else {}
        for accelerator, closure in closures.items():
            if accelerator == "cpu":
                assert closure == {}
                continue
            assert "0.10.2" in closure["jaxlib"], (accelerator, closure["jaxlib"])  # requirements.txt's jaxlib stays
            for name, specifier in closure.items():
                if name in pinned:
                    continue
                assert any(v in specifier for v in index.versions(name)), f"{accelerator}: no {name}{specifier}"
        assert str(closures["tpu"]["libtpu"]) == "==0.0.42.*"
        assert "0.10.2" in closures["cuda12"]["jax-cuda12-plugin"] and "0.10.2" in closures["cuda12"]["jax-cuda12-pjrt"]
        assert any(name.startswith("nvidia-cudnn") for name in closures["cuda12"])  # CUDA comes as wheels
        assert "libtpu" not in closures["cuda12"] and not any(name.startswith("nvidia") for name in closures["tpu"])
        assert set(closures["tpu"]) | set(closures["cuda12"]) == set(closures["auto"])
        assert index.fetched < 5_000_000, index.fetched
    finally:
        client.close()


if __name__ == "__main__":  # python tests/system/test_docker_install.py prints the plans
    for acc in ("cpu", "tpu", "cuda12", "auto"):
        print(acc, install_plan(acc), file=sys.stdout)
