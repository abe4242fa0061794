"""The deployment files: Kubernetes manifests valid against the API schema
(offline, kubernetes-validate), and what the probes and the server expect of
each other."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))


def test_manifests_validate_against_the_kubernetes_schema():
    assert MANIFESTS
    validate = Path(sys.executable).with_name("kubernetes-validate")
    p = subprocess.run(
        [str(validate), "--strict", *map(str, MANIFESTS)], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_statefulset_probes_grpc_health_and_mounts_a_memory_backed_dev_shm():
    docs = [d for f in MANIFESTS for d in yaml.safe_load_all(f.read_text())]
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["clusterIP"] == "None", "Fleet resolves every pod through DNS"
    pod = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"]["port"] == 50051
    shm = next(m for m in server["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["volumes"] if v["name"] == shm["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    # every flag the manifest passes is one the server takes
    from rollout_service.cli import build_serve_parser

    known = {o for a in build_serve_parser()._actions for o in a.option_strings}
    for arg in server["args"]:
        assert arg.split("=")[0] in known, arg
    entry = (ROOT / "deploy" / "Dockerfile").read_text()
    assert '"rollout-service", "serve"' in entry


def test_the_http_port_is_served_exposed_and_named_by_a_resolvable_host():
    """The OpenAI front's port: passed as --http-port, declared by the
    container, published by the Service and the image; and the pods' host
    names are FQDNs, since a session's base URL names the pod by it."""
    docs = [d for f in MANIFESTS for d in yaml.safe_load_all(f.read_text())]
    service = next(d for d in docs if d["kind"] == "Service")
    pod = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    [port] = [int(a.split("=")[1]) for a in server["args"] if a.startswith("--http-port=")]
    declared = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert declared["http"] == port
    published = {p["targetPort"]: p["port"] for p in service["spec"]["ports"]}
    assert published["http"] == port
    exposed = next(
        line
        for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
        if line.startswith("EXPOSE")
    )
    assert str(port) in exposed.split()
    assert pod["setHostnameAsFQDN"] is True
