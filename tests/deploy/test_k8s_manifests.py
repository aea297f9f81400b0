"""deploy/k8s rendered with ``kubectl kustomize`` and checked: every built-in object against
the Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields fail), the
ServiceMonitors (a CRD it has no schema for) by their required structure here, and the
parts that must agree with each other and with kvgate itself (the gateway config, the
commands, the ports, the RBAC discovery needs, the tokenizer the gateway shares with the
engines, the images docs/deploy.md and the Dockerfiles build, the network policies)."""

from __future__ import annotations

import argparse
import json
import posixpath
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest
import yaml

from engine import cli as engine_cli
from gateway.discovery.config import KubernetesSourceConfig
from gateway.peer_config import split_address
from tests.deploy.builds import (
    DEPLOY_DOC,
    builds_in,
    dockerfile_builds,
    dockerfile_user,
    split_image,
)
from tests.deploy.k8s_bundle import (
    ROOT,
    Obj,
    container,
    gateway_config,
    gateway_config_text,
    needs_kubectl,
)

# the oldest Kubernetes the manifests claim to fit, and the newest schemas known
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())

pytestmark = needs_kubectl


def by_kind(objects: dict[tuple[str, str], Obj], kind: str) -> dict[str, Obj]:
    return {name: obj for (k, name), obj in objects.items() if k == kind}


def test_the_bundle_holds_what_a_fleet_needs(objects: dict[tuple[str, str], Obj]) -> None:
    kinds = sorted(k for k, _ in objects)
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "NetworkPolicy",
                     "NetworkPolicy", "PodDisruptionBudget", "PodDisruptionBudget", "Role",
                     "RoleBinding", "Service", "Service", "Service", "ServiceAccount",
                     "ServiceMonitor", "ServiceMonitor"]
    assert {o["metadata"].get("namespace") for o in objects.values()} == {"llm"}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_builtin_object_matches_the_schema(objects: dict[tuple[str, str], Obj],
                                                 version: str) -> None:
    checked = 0
    for obj in objects.values():
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: kubernetes-validate has no schema (see the next test)
        check_schema(obj, version)
        checked += 1
    assert checked == len(objects) - 2


def check_schema(obj: Obj, version: str) -> None:
    """``obj`` against Kubernetes ``version``'s schema of its kind, strictly."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']} (Kubernetes "
                             f"{version}): {exc.message} at {list(exc.path)}") from None


DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")


def test_service_monitors_by_structure(objects: dict[tuple[str, str], Obj]) -> None:
    """What the Prometheus Operator's CRD requires and uses, checked by hand: each selects
    a Service by its labels and scrapes a port that Service names."""
    services = by_kind(objects, "Service")
    for name, monitor in by_kind(objects, "ServiceMonitor").items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
        spec = monitor["spec"]
        assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
        wanted = spec["selector"]["matchLabels"]
        assert isinstance(wanted, dict) and wanted, name
        matching = [s for s in services.values()
                    if wanted.items() <= s["metadata"].get("labels", {}).items()]
        assert len(matching) == 1, f"ServiceMonitor {name} selects {len(matching)} Services"
        port_names = {p["name"] for p in matching[0]["spec"]["ports"]}
        assert spec["endpoints"], name
        for ep in spec["endpoints"]:
            assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
            assert ep["port"] in port_names, f"{name}: no port {ep['port']!r}"
            assert ep["path"] == "/metrics"
            assert DURATION.match(ep["interval"]), ep["interval"]


def probes_use_named_ports(c: Obj) -> None:
    names = {p["name"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in c:
            assert c[probe]["httpGet"]["port"] in names, probe


def test_gateway(objects: dict[tuple[str, str], Obj], monkeypatch: pytest.MonkeyPatch,
                 tmp_path: Path) -> None:
    deployment = objects[("Deployment", "kvgate-gateway")]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    probes_use_named_ports(c)
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    # the command parses with kvgate serve's own arguments; its config is the ConfigMap's
    env = {e["name"]: e for e in c["env"]}
    raw = yaml.safe_load(gateway_config_text(objects))
    # the admin token comes from a Secret, through the variable the config names
    token_env = raw["admin"]["token_env"]
    assert env[token_env]["valueFrom"]["secretKeyRef"]["name"] == "kvgate-admin"
    # so does the peers' secret (and the engines' key: test_s31h_engine_api_key.py)
    peer_env = raw["peers"]["secret_env"]
    assert env[peer_env]["valueFrom"]["secretKeyRef"]["name"] == "kvgate-peers"
    config = gateway_config(objects, monkeypatch, tmp_path)
    assert config.admin.host == "127.0.0.1"
    assert pod["terminationGracePeriodSeconds"] > config.shutdown.timeout_s
    # the Service carries the OpenAI port only, never the admin listener's
    service = objects[("Service", "kvgate-gateway")]
    (port,) = service["spec"]["ports"]
    by_name = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert by_name[port["targetPort"]] == config.port
    assert config.admin.port not in by_name.values()
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    # the copies find each other on a headless Service of every gateway pod, ready or not,
    # on the port their peers listen on
    (address,) = config.peers.addresses
    peer_host, peer_port = split_address(address, "peers.addresses")
    peers = objects[("Service", peer_host)]
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    assert peers["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    (peer_service_port,) = peers["spec"]["ports"]
    assert config.peers.listen is not None
    assert peer_service_port["port"] == peer_port
    assert by_name[peer_service_port["targetPort"]] == \
        split_address(config.peers.listen, "peers.listen", any_port=True)[1]
    # discovery finds the engines' headless Service by name and port name
    (source,) = config.discovery
    assert isinstance(source, KubernetesSourceConfig)
    engines = objects[("Service", str(source.service))]
    assert engines["spec"]["clusterIP"] == "None"
    engine_ports = {p["name"] for p in engines["spec"]["ports"]}
    assert {source.port_name, source.kv_events_port_name,
            source.replay_port_name} <= engine_ports


def test_discovery_rbac(objects: dict[tuple[str, str], Obj],
                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The gateway's account reads exactly what its discovery source lists and watches
    (gateway.discovery.kube_source: a LIST, then WATCHes, never a GET): EndpointSlices for
    a Service, pods for a label selector; nothing else, no other verb."""
    deployment = objects[("Deployment", "kvgate-gateway")]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert ("ServiceAccount", account) in objects
    (binding,) = by_kind(objects, "RoleBinding").values()
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": "llm"}]
    role = objects[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    (source,) = gateway_config(objects, monkeypatch, tmp_path).discovery
    assert isinstance(source, KubernetesSourceConfig)
    group, resource = ("discovery.k8s.io", "endpointslices") if source.service \
        else ("", "pods")
    assert granted == {(group, resource, "list"), (group, resource, "watch")}


def test_engine(objects: dict[tuple[str, str], Obj]) -> None:
    deployment = objects[("Deployment", "kvgate-engine")]
    c = container(deployment)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    probes_use_named_ports(c)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    args = parser.parse_args(c["args"])
    assert args.executor == "torch" and args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == args.port
    # the Service's port names (what discovery reads) target the container's ports
    service = objects[("Service", "kvgate-engine")]
    target = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert args.kv_events_endpoint == f"tcp://*:{ports[target['kv-events']]}"
    assert args.kv_events_replay_endpoint == f"tcp://*:{ports[target['kv-events-replay']]}"
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)


def on_claim(deployment: Obj, path: str) -> tuple[str, PurePosixPath, Obj, Obj]:
    """Where ``path`` in the deployment's container lies: (claim name, path inside the
    claim, the volume mount, the volume). Fails when no PersistentVolumeClaim holds it."""
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    for mount in sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
        root = PurePosixPath(mount["mountPath"])
        target = PurePosixPath(path)
        if target != root and root not in target.parents:
            continue
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        claim = volume.get("persistentVolumeClaim")
        assert claim, f"{path} lies on volume {mount['name']!r}, which is no claim"
        inside = PurePosixPath("/", mount.get("subPath", ""), target.relative_to(root))
        return claim["claimName"], inside, mount, volume
    raise AssertionError(f"{path} lies on no volume of {deployment['metadata']['name']}")


def tokenizer_file(path: PurePosixPath) -> PurePosixPath:
    """The tokenizer.json that kvwire.tokenizer.load_tokenizer reads for ``path`` (a
    directory, or the file itself)."""
    return path if path.suffix == ".json" else path / "tokenizer.json"


def test_gateway_tokenizes_with_the_engines_model(objects: dict[tuple[str, str], Obj],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """The engines publish KV events in their tokenizer's ids and the cost policy matches
    prompts against them: the gateway must read the very tokenizer.json the engines read,
    from the same claim, mounted read-only (its root filesystem stays read-only)."""
    engine = objects[("Deployment", "kvgate-engine")]
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    args = parser.parse_args(container(engine)["args"])
    # engine.cli: --tokenizer, else the torch executor's model directory
    engine_path = args.tokenizer or (args.model if args.executor == "torch" else None)
    assert engine_path is not None, "the engines tokenize with the project's tokenizer"
    engine_claim, engine_inside, _, _ = on_claim(engine, engine_path)

    config = gateway_config(objects, monkeypatch, tmp_path)
    assert config.tokenizer is not None, \
        "gateway.yaml names no tokenizer: the gateway's token ids are not the engines'"
    gateway = objects[("Deployment", "kvgate-gateway")]
    claim, inside, mount, volume = on_claim(gateway, config.tokenizer)
    assert claim == engine_claim
    assert tokenizer_file(inside) == tokenizer_file(engine_inside)
    assert mount.get("readOnly") is True
    assert volume["persistentVolumeClaim"].get("readOnly") is True
    pod = gateway["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = container(gateway)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]


def doc_section(title: str) -> str:
    text = DEPLOY_DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_images_are_the_documented_builds(objects: dict[tuple[str, str], Obj]) -> None:
    """Each Deployment runs the image (name and tag; a registry in front of it is the
    operator's newName) that its Dockerfile's header and docs/deploy.md's Kubernetes section
    build, never an implicit ``latest``."""
    documented = dockerfile_builds()
    doc = builds_in(doc_section("On Kubernetes"))
    for name, dockerfile in (("kvgate-gateway", "deploy/gateway/Dockerfile"),
                             ("kvgate-engine", "deploy/engine/Dockerfile")):
        image = container(objects[("Deployment", name)])["image"]
        built = documented[dockerfile]
        assert doc.get(dockerfile) == built, \
            f"docs/deploy.md builds {doc.get(dockerfile)!r} from {dockerfile}, not {built!r}"
        assert split_image(built)[1] is not None, f"{dockerfile} builds {built}: no tag"
        assert split_image(image) == split_image(built), \
            f"{name} runs {image}, but {dockerfile} builds {built}"


def container_port(c: Obj, port: int | str) -> int:
    """A NetworkPolicy's port (a number, or a name the container gives one) as a number."""
    if isinstance(port, int):
        return port
    by_name = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert port in by_name, f"no container port named {port!r}"
    return int(by_name[port])


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "matchExpressions: not checked here"
    return bool(selector.get("matchLabels", {}).items() <= labels.items())


def policies_for(objects: dict[tuple[str, str], Obj], deployment: Obj) -> list[Obj]:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return [p for p in by_kind(objects, "NetworkPolicy").values()
            if selects(p["spec"]["podSelector"], labels)]


def ingress_rules(policies: list[Obj]) -> list[Obj]:
    assert policies, "no NetworkPolicy selects these pods: any pod may connect"
    for policy in policies:
        assert "Ingress" in policy["spec"]["policyTypes"], policy["metadata"]["name"]
    return [rule for policy in policies for rule in policy["spec"].get("ingress", [])]


def test_engines_take_only_the_gateway_and_monitoring(objects: dict[tuple[str, str], Obj],
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """The engines' API (with POST /reset_prefix_cache) and KV event ports answer the
    gateway's pods, in their namespace; their metrics port Prometheus too, picked by a
    namespace and pod selector (the operator adjusts both); no other source, no other port.
    Their pods mount no service account token."""
    engine = objects[("Deployment", "kvgate-engine")]
    gateway = objects[("Deployment", "kvgate-gateway")]
    gateway_labels = gateway["spec"]["template"]["metadata"]["labels"]
    c = container(engine)
    # what the gateway's discovery connects to, and what the ServiceMonitor scrapes
    (source,) = gateway_config(objects, monkeypatch, tmp_path).discovery
    assert isinstance(source, KubernetesSourceConfig)
    service_ports = {p["name"]: p["targetPort"]
                     for p in objects[("Service", "kvgate-engine")]["spec"]["ports"]}
    gateway_needs = {container_port(c, service_ports[name]) for name in
                     (source.port_name, source.kv_events_port_name,
                      source.replay_port_name)}
    (scraped,) = objects[("ServiceMonitor", "kvgate-engine")]["spec"]["endpoints"]
    metrics_port = container_port(c, service_ports[scraped["port"]])

    from_gateway: set[int] = set()
    from_monitoring: set[int] = set()
    for rule in ingress_rules(policies_for(objects, engine)):
        assert rule.get("from"), "an ingress rule admits every source"
        assert rule.get("ports"), "an ingress rule admits every port"
        ports = {container_port(c, p["port"]) for p in rule["ports"]}
        assert all(p.get("protocol", "TCP") == "TCP" for p in rule["ports"])
        for peer in rule["from"]:
            assert "ipBlock" not in peer, "an address range reaches the engines"
            assert peer.get("podSelector", {}).get("matchLabels"), \
                "a rule admits every pod of a namespace"
            if "namespaceSelector" not in peer:  # the engines' namespace: the gateway only
                assert selects(peer["podSelector"], gateway_labels), peer
                from_gateway |= ports
            else:  # another namespace: monitoring, named, on the metrics port only
                assert peer["namespaceSelector"].get("matchLabels"), \
                    "a rule admits pods of every namespace"
                assert not selects(peer["podSelector"], gateway_labels)
                from_monitoring |= ports
    assert from_gateway == gateway_needs
    assert from_monitoring == {metrics_port}
    pod = engine["spec"]["template"]["spec"]
    assert pod.get("automountServiceAccountToken") is False, "engine pods mount an API token"
    # the gateway keeps its token: discovery reads the API with it
    account = objects[("ServiceAccount", gateway["spec"]["template"]["spec"]
                       ["serviceAccountName"])]
    assert gateway["spec"]["template"]["spec"].get("automountServiceAccountToken", True)
    assert account.get("automountServiceAccountToken", True)


def test_gateway_network_policy_keeps_clients(objects: dict[tuple[str, str], Obj],
                                              monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """Clients reach the gateway's OpenAI port from anywhere (as its Service promises);
    its peers port takes only the other copies; nothing admits the admin port."""
    gateway = objects[("Deployment", "kvgate-gateway")]
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    c = container(gateway)
    config = gateway_config(objects, monkeypatch, tmp_path)
    assert config.peers.listen is not None
    peers_port = split_address(config.peers.listen, "peers.listen", any_port=True)[1]
    (service_port,) = objects[("Service", "kvgate-gateway")]["spec"]["ports"]
    open_to_all: set[int] = set()
    from_copies: set[int] = set()
    for rule in ingress_rules(policies_for(objects, gateway)):
        assert rule.get("ports"), "an ingress rule admits every port"
        ports = {container_port(c, p["port"]) for p in rule["ports"]}
        assert config.admin.port not in ports
        if not rule.get("from"):
            open_to_all |= ports
            continue
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"} and selects(peer["podSelector"], labels), peer
            from_copies |= ports
    assert open_to_all == {config.port, container_port(c, service_port["targetPort"])}
    assert peers_port in from_copies and peers_port not in open_to_all


def test_pods_run_as_the_user_their_image_was_built_for(objects: dict[tuple[str, str], Obj]
                                                        ) -> None:
    """Each image runs as a non-root user it creates, named by its number (the kubelet
    cannot check a user name against runAsNonRoot), and each Deployment runs its pods as
    that very uid: the engine's CUDA base (Ubuntu 24.04) already holds a user 1000, so a
    user added there without --uid is 1001 and a pod run as 1000 was someone else."""
    for name, dockerfile in (("kvgate-gateway", "deploy/gateway/Dockerfile"),
                             ("kvgate-engine", "deploy/engine/Dockerfile")):
        user, created = dockerfile_user(dockerfile)
        uid, _, gid = user.partition(":")
        assert uid.isdigit(), f"{dockerfile}: USER {user} is not a number"
        assert int(uid) in created.values() and int(uid) != 0, \
            f"{dockerfile}: USER {user} is not a user it adds with --uid ({created})"
        pod = objects[("Deployment", name)]["spec"]["template"]["spec"]
        security = {**pod.get("securityContext", {}),
                    **container(objects[("Deployment", name)]).get("securityContext", {})}
        assert security.get("runAsNonRoot") is True, name
        assert security.get("runAsUser") == int(uid), \
            f"{name} runs as {security.get('runAsUser')}, its image as {uid}"
        if gid:
            assert security.get("runAsGroup") == int(gid), name
    # the simulated engine compose runs: the same rule
    user, created = dockerfile_user("deploy/engine/Dockerfile.cpu")
    assert user.partition(":")[0].isdigit() and int(user.partition(":")[0]) in created.values()


def test_root_filesystems_are_read_only(objects: dict[tuple[str, str], Obj]) -> None:
    """Every container runs with a read-only root filesystem, no privilege escalation and
    no capability; what it writes lies on emptyDir volumes: /tmp (the engine's Triton
    compiles its launchers there) and, for the engine, its user's home (~/.triton keeps the
    compiled kernels)."""
    for name, writes in (("kvgate-gateway", ["/tmp"]),
                         ("kvgate-engine", ["/tmp", "/home/kvgate/.triton/cache"])):
        deployment = objects[("Deployment", name)]
        pod = deployment["spec"]["template"]["spec"]
        c = container(deployment)
        security = c.get("securityContext", {})
        assert security.get("readOnlyRootFilesystem") is True, name
        assert security.get("allowPrivilegeEscalation") is False, name
        assert security.get("capabilities", {}).get("drop") == ["ALL"], name
        for path in writes:
            mounts = [m for m in c["volumeMounts"] if path == m["mountPath"]
                      or PurePosixPath(m["mountPath"]) in PurePosixPath(path).parents]
            assert mounts, f"{name} writes {path}, on its read-only root filesystem"
            mount = max(mounts, key=lambda m: len(m["mountPath"]))
            assert not mount.get("readOnly"), (name, path)
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            assert "emptyDir" in volume, (name, path, volume)


def rollout_bounds(deployment: Obj) -> tuple[int, int]:
    """(pods above ``replicas``, pods below it) a rolling update may take, as the
    Deployment controller scales them: maxSurge rounds up, maxUnavailable down (25% each
    when unset), and when both come to 0 one pod may be unavailable."""
    spec = deployment["spec"]
    replicas = spec.get("replicas", 1)
    strategy = spec.get("strategy", {})
    if strategy.get("type") == "Recreate":
        return 0, replicas

    def scaled(value: int | str, round_up: bool) -> int:
        if isinstance(value, int):
            return value
        percent = int(value.rstrip("%"))
        return -(-replicas * percent // 100) if round_up else replicas * percent // 100

    rolling = strategy.get("rollingUpdate", {})
    surge = scaled(rolling.get("maxSurge", "25%"), round_up=True)
    unavailable = scaled(rolling.get("maxUnavailable", "25%"), round_up=False)
    return surge, (1 if surge == unavailable == 0 else unavailable)


def test_rollout_bounds() -> None:
    def deployment(replicas: int, **rolling: int | str) -> Obj:
        return {"spec": {"replicas": replicas, "strategy": {"rollingUpdate": rolling}}}
    assert rollout_bounds(deployment(2)) == (1, 0)
    assert rollout_bounds(deployment(8)) == (2, 2)
    assert rollout_bounds(deployment(2, maxSurge=0, maxUnavailable=0)) == (0, 1)
    assert rollout_bounds(deployment(3, maxSurge="50%", maxUnavailable="50%")) == (2, 1)


def test_engine_rollout_needs_no_spare_gpu(objects: dict[tuple[str, str], Obj]) -> None:
    """A new engine image (or any change to the pod) rolls out on the GPUs the engines
    hold: a surge pod would ask for a GPU beyond them, and on a fleet with none spare it
    stays Pending while no old pod is taken down for it, so the rollout never moves."""
    engine = objects[("Deployment", "kvgate-engine")]
    assert container(engine)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    surge, unavailable = rollout_bounds(engine)
    assert surge == 0, f"a rollout of the engines asks for {surge} GPU(s) beyond theirs"
    assert unavailable >= 1


def probe_budget_s(probe: Obj) -> int:
    """How long a probe may go on failing before the kubelet gives up on the container."""
    return int(probe.get("initialDelaySeconds", 0)
               + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


def test_rollouts_outlast_the_slowest_start_they_allow(objects: dict[tuple[str, str], Obj]
                                                       ) -> None:
    """A pod that takes as long to start as its startup probe allows (the engine loading
    its model) still counts as progress: past progressDeadlineSeconds (600 s when unset)
    without a new pod available, the Deployment is marked failed (ProgressDeadlineExceeded)
    and ``kubectl rollout status`` exits with an error while the pod is only loading."""
    checked = 0
    for name, deployment in by_kind(objects, "Deployment").items():
        c = container(deployment)
        if "startupProbe" not in c:
            continue
        slowest = (probe_budget_s(c["startupProbe"])
                   + c["readinessProbe"].get("periodSeconds", 10)  # then ready
                   + deployment["spec"].get("minReadySeconds", 0))  # then available
        deadline = deployment["spec"].get("progressDeadlineSeconds", 600)
        assert deadline > slowest, \
            f"{name}: a pod may take {slowest} s to become available, the deadline is {deadline} s"
        checked += 1
    assert checked, "no Deployment has a startup probe"


def test_docs_name_the_custom_kinds_apply_needs(objects: dict[tuple[str, str], Obj]) -> None:
    """``kubectl apply -k deploy/k8s`` on a cluster without a kind's CustomResourceDefinition
    (kind or minikube, as docs/deploy.md suggests, without the Prometheus Operator) creates
    the rest and then fails on it (no matches for kind): the Kubernetes section says so for
    every such kind, and names the file to leave out of the kustomization."""
    section = doc_section("On Kubernetes")
    custom: dict[str, str] = {}
    for (kind, _), obj in objects.items():
        try:
            kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            custom[kind] = obj["apiVersion"].split("/")[0]
    assert custom, "the bundle holds no custom kind: drop this test"
    listed = yaml.safe_load((ROOT / "deploy" / "k8s" / "kustomization.yaml").read_text())
    for kind, group in custom.items():
        files = [f for f in listed["resources"] if re.search(
            rf"^kind:\s*{kind}\s*$", (ROOT / "deploy" / "k8s" / f).read_text(), re.MULTILINE)]
        assert files, kind
        for needed in (kind, group, "CustomResourceDefinition", *files):
            assert needed in section, f"docs/deploy.md's Kubernetes section: no {needed!r}"


def pods_kept(budget: Obj, replicas: int) -> int:
    """The pods a PodDisruptionBudget keeps through voluntary evictions, of ``replicas``:
    the disruption controller scales a percentage of either bound rounding up."""
    spec = budget["spec"]
    assert ("minAvailable" in spec) != ("maxUnavailable" in spec), budget["metadata"]["name"]
    key = "minAvailable" if "minAvailable" in spec else "maxUnavailable"
    value = spec[key]
    scaled = value if isinstance(value, int) else -(-replicas * int(value.rstrip("%")) // 100)
    return scaled if key == "minAvailable" else replicas - scaled


def test_pods_kept() -> None:
    def budget(**bound: int | str) -> Obj:
        return {"metadata": {"name": "b"}, "spec": bound}
    assert pods_kept(budget(maxUnavailable=1), 2) == 1
    assert pods_kept(budget(minAvailable=1), 2) == 1
    assert pods_kept(budget(maxUnavailable="50%"), 3) == 1
    assert pods_kept(budget(minAvailable="50%"), 3) == 2


def test_drains_keep_one_pod_of_each_deployment(objects: dict[tuple[str, str], Obj]) -> None:
    """Draining nodes one after another never evicts every gateway copy or every engine:
    each Deployment's pods (and no other's) have one PodDisruptionBudget, which keeps at
    least one of them and still lets a drain evict one."""
    budgets = by_kind(objects, "PodDisruptionBudget")
    deployments = by_kind(objects, "Deployment")
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets.values() if selects(b["spec"]["selector"], labels)]
        # two budgets on one pod make the eviction API refuse every eviction of it
        assert len(covering) == 1, f"{name}: {len(covering)} PodDisruptionBudgets"
        (budget,) = covering
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["selector"] == deployment["spec"]["selector"], name
        for other, other_deployment in deployments.items():
            if other != name:
                assert not selects(budget["spec"]["selector"],
                                   other_deployment["spec"]["template"]["metadata"]["labels"])
        replicas = deployment["spec"].get("replicas", 1)
        kept = pods_kept(budget, replicas)
        assert kept >= 1, f"{name}: its budget lets every one of {replicas} pods go"
        assert kept < replicas, f"{name}: its budget keeps all {replicas} pods, no drain ends"
        for version in VERSIONS:
            check_schema(budget, version)
    assert len(budgets) == len(deployments)


def stall_outlasted_s(probe: Obj) -> int:
    """The longest a container may stop answering without ``failureThreshold`` probes in a
    row failing: the last one's answer is waited for ``timeoutSeconds``."""
    return int(probe.get("periodSeconds", 10) * (probe.get("failureThreshold", 3) - 1)
               + probe.get("timeoutSeconds", 1))


def test_liveness_outlasts_a_stall_readiness_does_not(objects: dict[tuple[str, str], Obj]
                                                      ) -> None:
    """A liveness probe restarts the container, cutting every request it serves: it only
    catches a process that stays silent, never one whose event loop stalled for a few
    seconds (a big /metrics parse, a GC pass), and each of its probes waits seconds for an
    answer, not the default 1 s. Readiness takes a silent pod out of its Service sooner."""
    for name, deployment in by_kind(objects, "Deployment").items():
        c = container(deployment)
        liveness, readiness = c["livenessProbe"], c["readinessProbe"]
        assert liveness.get("timeoutSeconds", 1) >= 3, \
            f"{name}: a liveness probe fails after {liveness.get('timeoutSeconds', 1)} s"
        assert stall_outlasted_s(liveness) >= 20, \
            f"{name}: a stall of {stall_outlasted_s(liveness)} s restarts it"
        assert stall_outlasted_s(readiness) < stall_outlasted_s(liveness), name


def test_every_empty_dir_is_bounded(objects: dict[tuple[str, str], Obj]) -> None:
    """An emptyDir without a sizeLimit fills the node's disk (or, in memory, its RAM)
    until the kubelet evicts pods: the gateway's /tmp holds prometheus-client's
    multiprocess files with --workers, the engine's Triton's caches."""
    for name, deployment in by_kind(objects, "Deployment").items():
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        empty_dirs = [v for v in volumes if "emptyDir" in v]
        assert empty_dirs, f"{name}: no emptyDir (its /tmp, at least)"
        for volume in empty_dirs:
            assert volume["emptyDir"].get("sizeLimit"), \
                f"{name}: emptyDir {volume['name']!r} has no sizeLimit"


def dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker's patternmatcher compiles it: ``*`` and ``?`` stop
    at ``/``, ``**`` (and ``**/``) spans any number of directories, ``[...]`` is a class."""
    out, i = "^", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 3 if pattern.startswith("**/", i) else 2
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "[":
            end = pattern.index("]", i + 1)
            out += pattern[i:end + 1]
            i = end
        elif ch == "\\":
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out + "$")


def dockerignore(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(re-includes, regex) for each pattern of a .dockerignore, in order: comments and
    blank lines skipped, ``!`` re-includes, each cleaned and stripped of a leading ``/``."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = posixpath.normpath(line[1:].strip() if include else line)
        patterns.append((include, dockerignore_regex(pattern.lstrip("/") or "/")))
    return patterns


def ignored(patterns: list[tuple[bool, re.Pattern[str]]], path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the context) out of it: the last pattern
    that matches the path or one of its parent directories decides."""
    path = posixpath.normpath(path)
    parts = path.split("/")
    candidates = [path, *("/".join(parts[:n]) for n in range(1, len(parts)))]
    left_out = False
    for include, regex in patterns:
        if any(regex.match(c) for c in candidates):
            left_out = not include
    return left_out


def test_dockerignore_matching() -> None:
    patterns = dockerignore("# a comment\n.venv\n/build\n*.log\n**/*.py[cod]\n"
                            "docs/**\n!docs/keep.md\n")
    assert ignored(patterns, ".venv") and ignored(patterns, ".venv/bin/python")
    assert not ignored(patterns, "a/.venv")  # a pattern is anchored at the context's root
    assert ignored(patterns, "build/lib/x.py") and not ignored(patterns, "builds")
    assert ignored(patterns, "x.log") and not ignored(patterns, "logs/x.log")  # * stops at /
    assert ignored(patterns, "x.pyc") and ignored(patterns, "a/b/x.pyo")
    assert not ignored(patterns, "a/b/x.py")
    assert ignored(patterns, "docs/a.md") and not ignored(patterns, "docs/keep.md")


def dockerfile_copies(dockerfile: Path) -> list[str]:
    """The context paths a Dockerfile's COPY and ADD instructions take (sources from
    another stage, --from, and URLs left out)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    sources: list[str] = []
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if len(words) < 2 or words[0].upper() not in ("COPY", "ADD"):
            continue
        rest = words[1].strip()
        flags = []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.strip()
        if any(f.startswith("--from=") for f in flags):
            continue
        args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        assert len(args) >= 2, f"{dockerfile}: {line!r}"
        sources += [a for a in args[:-1] if "://" not in a]
    return sources


def test_dockerignore_keeps_what_the_images_copy() -> None:
    """``docker build -f deploy/... .`` sends the repository root to the daemon (without
    BuildKit, all of it first): .dockerignore leaves out the virtual environment, .git and
    the caches, and nothing a Dockerfile COPYs, none of the tracked files under it."""
    git = shutil.which("git")
    assert git is not None, "git is not installed: the tracked files are not known"
    assert (ROOT / ".dockerignore").is_file(), "no .dockerignore: every file is sent"
    patterns = dockerignore((ROOT / ".dockerignore").read_text())
    for path in (".venv", ".venv/lib/python3.11/site-packages/x.py", ".git", ".git/HEAD",
                 "gateway/__pycache__/app.cpython-311.pyc", "kvgate.egg-info/PKG-INFO"):
        assert ignored(patterns, path), f".dockerignore sends {path}"
    dockerfiles = sorted((ROOT / "deploy").rglob("Dockerfile*"))
    assert len(dockerfiles) >= 3, dockerfiles
    for dockerfile in dockerfiles:
        sources = dockerfile_copies(dockerfile)
        assert sources, f"{dockerfile} copies nothing from the context"
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile} copies {source}: not there"
            assert not ignored(patterns, source), \
                f"{dockerfile} copies {source}, which .dockerignore leaves out"
            tracked = subprocess.run([git, "ls-files", "-z", "--", source], cwd=ROOT,
                                     capture_output=True, text=True, check=True).stdout
            left_out = [f for f in tracked.split("\0") if f and ignored(patterns, f)]
            assert not left_out, f"{dockerfile} copies {source}, but not {left_out[:5]}"
