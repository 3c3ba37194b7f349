"""The deployment files (deploy/): every manifest parses, its field names are Kubernetes' own (checked against the
object models of the `kubernetes` package), kustomize finds every resource, the engines' probes point at the
engine's endpoints, selectors select the pods they are meant to, and the page finds the engines and the Secret's
keys. No cluster here (no kubectl, no TPU): docs/kubernetes.md says what this does not cover.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from pipeline.options import OPTIONS
from web.options import SERVER_OPTIONS

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes package (requirements-dev.txt)")
models = kubernetes.client

DEPLOY = REPO / "deploy"
KUSTOMIZATIONS = [DEPLOY / "kubernetes", DEPLOY / "kubernetes" / "multihost"]
#: Models of the kinds shipped (the LeaderWorkerSet is a custom resource: checked by `_check_leaderworkerset`).
MODELS = {
    ("apps/v1", "Deployment"): models.V1Deployment,
    ("v1", "Service"): models.V1Service,
    ("v1", "Secret"): models.V1Secret,
    ("v1", "PersistentVolumeClaim"): models.V1PersistentVolumeClaim,
}
#: The engine service's endpoints (`python -m pipeline serve`): what the probes may point at.
ENGINE_PROBES = {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
#: The flags of the page-in-front and of the engine service (built beside this in pipeline/service and app.py's
#: --engine); the rest must be options the programs declare.
SERVICE_FLAGS = {"--engine", "--engine-token", "--host", "--port", "--distributed"}
TPU_SELECTORS = {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"}


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _resources() -> dict[Path, dict]:
    """Every object the kustomizations list, by file (each file one object)."""
    objects = {}
    for folder in KUSTOMIZATIONS:
        for name in _documents(folder / "kustomization.yaml")[0]["resources"]:
            path = (folder / name).resolve()
            if path.is_file():
                (doc,) = _documents(path)
                objects[path] = doc
    return objects


def _check_fields(value, model: str | type, where: str) -> None:
    """`value` has only the fields `model` declares (recursively): a misspelt or misplaced key fails."""
    if isinstance(model, type):
        assert isinstance(value, dict), f"{where}: expected an object, got {value!r}"
        fields = {json: model.openapi_types[name] for name, json in model.attribute_map.items()}
        for key, item in value.items():
            assert key in fields, f"{where}: {model.__name__} has no field {key!r}"
            _check_fields(item, fields[key], f"{where}.{key}")
    elif model.lower().startswith("list["):  # "list[V1Container]" (older releases of the package: "List[...]")
        assert isinstance(value, list), f"{where}: expected a list"
        for index, item in enumerate(value):
            _check_fields(item, model[5:-1], f"{where}[{index}]")
    elif model.lower().startswith(("dict(", "dict[")):
        assert isinstance(value, dict), f"{where}: expected a mapping"
    elif model == "int":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: expected a whole number"
    elif model == "bool":
        assert isinstance(value, bool), f"{where}: expected true or false"
    elif model == "str":
        assert isinstance(value, str), f"{where}: expected a string, got {value!r}"
    elif hasattr(models, model):
        _check_fields(value, getattr(models, model), where)


def _pod_specs(doc: dict) -> list[tuple[dict, str]]:
    """(pod template, name) of a Deployment or of a LeaderWorkerSet's leader and workers."""
    if doc["kind"] == "Deployment":
        return [(doc["spec"]["template"], doc["metadata"]["name"])]
    if doc["kind"] == "LeaderWorkerSet":
        template = doc["spec"]["leaderWorkerTemplate"]
        return [(template[key], f"{doc['metadata']['name']}.{key}") for key in ("leaderTemplate", "workerTemplate")]
    return []


def test_every_kustomization_resource_exists_and_parses():
    for folder in KUSTOMIZATIONS:
        (kustomization,) = _documents(folder / "kustomization.yaml")
        assert kustomization["kind"] == "Kustomization"
        for name in kustomization["resources"]:
            path = folder / name
            assert path.is_file() or (path / "kustomization.yaml").is_file(), f"{folder.name}: {name} is missing"
    shipped = {p.resolve() for p in (DEPLOY / "kubernetes").rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert shipped == set(_resources()), "a manifest no kustomization lists (or the other way round)"
    images = {entry["name"] for entry in _documents(KUSTOMIZATIONS[0] / "kustomization.yaml")[0]["images"]}
    used = {c["image"] for doc in _resources().values() for t, _ in _pod_specs(doc) for c in t["spec"]["containers"]}
    assert used == images  # every image is one kustomize rewrites


def test_field_names_are_kubernetes_own():
    for path, doc in _resources().items():
        key = (doc["apiVersion"], doc["kind"])
        if key in MODELS:
            _check_fields(doc, MODELS[key], path.name)
        else:
            assert key == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"), f"{path.name}: unexpected {key}"
            _check_leaderworkerset(doc, path.name)


def _check_leaderworkerset(doc: dict, where: str) -> None:
    """LeaderWorkerSet v1's fields (kubernetes-sigs/lws api/leaderworkerset/v1); its pod templates are core's."""
    assert set(doc) <= {"apiVersion", "kind", "metadata", "spec"}
    _check_fields(doc["metadata"], models.V1ObjectMeta, f"{where}.metadata")
    spec = doc["spec"]
    assert set(spec) <= {"replicas", "leaderWorkerTemplate", "rolloutStrategy", "startupPolicy", "networkConfig"}
    assert spec.get("startupPolicy", "LeaderCreated") in ("LeaderCreated", "LeaderReady")
    template = spec["leaderWorkerTemplate"]
    assert set(template) <= {"leaderTemplate", "workerTemplate", "size", "restartPolicy", "subGroupPolicy"}
    assert template["restartPolicy"] in ("RecreateGroupOnPodRestart", "None")
    assert template["size"] == 4  # v5e 4x4: 16 chips, 4 per host
    for key in ("leaderTemplate", "workerTemplate"):
        _check_fields(template[key], models.V1PodTemplateSpec, f"{where}.{key}")


def test_selectors_select_their_pods():
    objects = list(_resources().values())
    pods = [template["metadata"]["labels"] for doc in objects for template, _ in _pod_specs(doc)]
    for doc in objects:
        if doc["kind"] == "Deployment":
            labels, selector = doc["spec"]["template"]["metadata"]["labels"], doc["spec"]["selector"]["matchLabels"]
            assert selector.items() <= labels.items(), doc["metadata"]["name"]
        if doc["kind"] == "Service":
            selector = doc["spec"]["selector"]
            assert any(selector.items() <= labels.items() for labels in pods), doc["metadata"]["name"]
    services = {doc["metadata"]["name"]: doc for doc in objects if doc["kind"] == "Service"}
    page = services["sdxl-page"]["spec"]
    assert page["sessionAffinity"] == "ClientIP" and page["selector"]["app.kubernetes.io/component"] == "page"
    engines = services["sdxl-engine-headless"]["spec"]
    assert engines["clusterIP"] == "None"  # headless: its name resolves to every ready engine
    serving = [labels for labels in pods if engines["selector"].items() <= labels.items()]
    workers = [
        t["metadata"]["labels"]
        for d in objects
        if d["kind"] == "LeaderWorkerSet"
        for t in [d["spec"]["leaderWorkerTemplate"]["workerTemplate"]]
    ]
    assert len(serving) == 2 and workers and not any(engines["selector"].items() <= w.items() for w in workers)


def _containers():
    for doc in _resources().values():
        for template, name in _pod_specs(doc):
            for container in template["spec"]["containers"]:
                yield doc, template, name, container


def test_engines_probe_the_engine_endpoints_on_tpu_hosts():
    engines = [(doc, t, name, c) for doc, t, name, c in _containers() if c["command"][-1] == "serve"]
    assert len(engines) == 3  # the v5e-4 Deployment, the slice's leader and its workers
    for doc, template, name, container in engines:
        spec = template["spec"]
        assert spec["nodeSelector"].items() >= TPU_SELECTORS.items(), name
        topology = spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
        assert topology == ("2x2" if doc["kind"] == "Deployment" else "4x4"), name
        assert container["resources"]["limits"]["google.com/tpu"] == 4, name
        assert any(m["mountPath"] == "/precompiled" for m in container["volumeMounts"]), name
        assert "--precompiled=/precompiled" in container["args"]
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        if name.endswith("workerTemplate"):
            assert not set(ENGINE_PROBES) & set(container), "a worker serves no HTTP: nothing to probe"
            continue
        assert f"--port={ports['http']}" in container["args"], name
        for probe, path in ENGINE_PROBES.items():
            assert container[probe]["httpGet"] == {"path": path, "port": "http"}, f"{name}: {probe}"
        if doc["kind"] == "LeaderWorkerSet":
            assert "--distributed" in container["args"]  # JAX reads the slice from GKE's TPU environment


def test_the_page_finds_engines_database_and_logins():
    secrets = {d["metadata"]["name"]: d for d in _resources().values() if d["kind"] == "Secret"}
    (page,) = [c for _, _, _, c in _containers() if c["name"] == "page"]
    env = {item["name"]: item for item in page["env"]}
    assert env["SDXL_ENGINES"]["value"] == "http://sdxl-engine-headless:8000"
    assert env["SDXL_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "database-url"
    for _, _, name, container in _containers():
        for item in container.get("env", []):
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets[ref["name"]]["stringData"], f"{name}: {ref}"
        _check_flags(container["args"], name)
    assert re.match(r"postgresql://", secrets["sdxl-secrets"]["stringData"]["database-url"])


def _check_flags(args: list[str], where: str) -> None:
    """Every flag a manifest passes is one the programs declare (or one of the service's own)."""
    declared = {option.flag for option in (*OPTIONS, *SERVER_OPTIONS)} | SERVICE_FLAGS
    for arg in args:
        flag = arg.split("=", 1)[0]
        assert flag in declared, f"{where}: {flag} is no option of app.py or python -m pipeline serve"


def test_compose_runs_the_same_shape_on_one_machine():
    compose = _documents(DEPLOY / "compose.yaml")[0]
    services = compose["services"]
    assert {"postgres", "engine", "page1", "page2", "proxy"} <= set(services)
    for name, service in services.items():
        for needed in service.get("depends_on", {}):
            assert needed in services, f"{name} depends on {needed}, which is no service"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source in compose["volumes"] or (DEPLOY / source).exists(), f"{name}: {source}"
        if "command" in service:
            _check_flags([a for a in service["command"] if a.startswith("--")], name)
    for page in ("page1", "page2"):
        environment = services[page]["environment"]
        assert environment["SDXL_ENGINES"] == "http://engine:8000"
        assert (
            environment["SDXL_DATABASE_URL"].startswith("postgresql://")
            and "@postgres:5432/" in environment["SDXL_DATABASE_URL"]
        )
    proxy = services["proxy"]["environment"]
    assert {proxy["SDXL_PAGE_1"], proxy["SDXL_PAGE_2"]} == {"page1:7860", "page2:7860"}
    config = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    assert "cookie SDXL_PAGE insert" in config and '"${SDXL_PAGE_1}"' in config and '"${SDXL_PAGE_2}"' in config
