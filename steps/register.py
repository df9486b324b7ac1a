"""Register a model version and its artifact in a Kubeflow model registry over its REST API.

Keyed by the image digest: the registered model and version are looked up by name and created
when missing. A version already registered with the same URI is left as it is (its description
and properties are updated when they differ): an unchanged re-run writes nothing. A version that
holds another image is never overwritten: the new image registers as `<version>-<digest12>` (the
first 12 hex digits of its digest), unless the caller bumps the version name. OCI URIs must pin a
digest (`oci://<registry>/<repo>@sha256:...`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .lib.runtime import EXIT_AUTH, EXIT_REMOTE, StepError, log, write_result

ARTIFACT_TYPE = "model-artifact"


def string_properties(values: dict[str, str]) -> dict[str, dict[str, str]]:
    return {k: {"metadataType": "MetadataStringValue", "string_value": v} for k, v in sorted(values.items())}


class RegistryApi:
    def __init__(self, args: argparse.Namespace, tls: ssl.SSLContext | None) -> None:
        self.base = f"{args.registry_url.rstrip('/')}/api/model_registry/{args.api_version}"
        self.token_file, self.tls, self.timeout = args.token_file, tls, args.timeout
        self.retries, self.retry_delay = args.retries, args.retry_delay

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, query: dict[str, str] | None = None) -> Any:
        """JSON request; returns the decoded body, or None for 404. Retries connection errors and 5xx."""
        url = self.base + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token_file:  # read at use time: service-account tokens rotate
            headers["Authorization"] = f"Bearer {self.token_file.read_text(encoding='utf-8').strip()}"
        data = json.dumps(body).encode() if body is not None else None
        attempt = 0
        while True:
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout, context=self.tls) as resp:
                    payload = resp.read()
                return json.loads(payload) if payload else {}
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:300]
                if exc.code == 404 and method == "GET":
                    return None
                if exc.code in (401, 403):
                    raise StepError(f"model registry refused {method} {path}: HTTP {exc.code} {detail}", EXIT_AUTH) from exc
                if exc.code < 500 or attempt >= self.retries:
                    raise StepError(f"model registry {method} {path}: HTTP {exc.code} {detail}", EXIT_REMOTE) from exc
            except (urllib.error.URLError, OSError) as exc:
                if isinstance(getattr(exc, "reason", exc), ssl.SSLCertVerificationError):
                    raise StepError(
                        f"model registry at {self.base}: TLS certificate not trusted ({getattr(exc, 'reason', exc)}); "
                        "give its CA with --ca-file (the service CA for an in-cluster registry)",
                        EXIT_REMOTE,
                    ) from exc
                if attempt >= self.retries:
                    raise StepError(f"model registry at {self.base} unreachable: {exc}", EXIT_REMOTE) from exc
            time.sleep(self.retry_delay * 2**attempt)
            attempt += 1


def ensure_model(api: RegistryApi, name: str, description: str) -> dict[str, Any]:
    model = api.call("GET", "/registered_model", query={"name": name})
    if model is None:
        model = api.call("POST", "/registered_models", {"name": name, "description": description})
        log(f"registered model {name!r} created (id {model['id']})")
    return dict(model)


def ensure_version(api: RegistryApi, model_id: str, name: str, fields: dict[str, Any]) -> dict[str, Any]:
    version = api.call("GET", "/model_version", query={"name": name, "parentResourceId": model_id})
    if version is None:
        version = api.call("POST", "/model_versions", {"name": name, "registeredModelId": model_id, **fields})
        log(f"version {name!r} created (id {version['id']})")
        return dict(version)
    changes = {k: v for k, v in fields.items() if k != "author" and version.get(k) != v}
    if changes:
        version = api.call("PATCH", f"/model_versions/{version['id']}", changes)
        log(f"version {name!r} exists (id {version['id']}); updated {', '.join(sorted(changes))}")
    else:
        log(f"version {name!r} exists (id {version['id']}) and is up to date")
    return dict(version)


def find_artifact(api: RegistryApi, version_id: str, name: str) -> dict[str, Any] | None:
    listing = api.call("GET", f"/model_versions/{version_id}/artifacts", query={"pageSize": "100"}) or {}
    same = [a for a in listing.get("items", []) if a.get("artifactType") == ARTIFACT_TYPE and a.get("name") == name]
    return dict(same[0]) if same else None


def ensure_artifact(api: RegistryApi, version_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    artifact = find_artifact(api, version_id, fields["name"])
    if artifact is None:
        artifact = api.call("POST", f"/model_versions/{version_id}/artifacts", {"artifactType": ARTIFACT_TYPE, **fields})
        log(f"model artifact created (id {artifact['id']}): {fields['uri']}")
        return dict(artifact)
    if artifact.get("uri") != fields["uri"]:
        raise StepError(f"version {version_id} already holds {artifact.get('uri')}; refusing to overwrite it with {fields['uri']}")
    changes = {k: v for k, v in fields.items() if artifact.get(k) != v}
    if changes:
        artifact = api.call("PATCH", f"/model_artifacts/{artifact['id']}", {"artifactType": ARTIFACT_TYPE, **changes})
        log(f"model artifact {artifact['id']} updated ({', '.join(sorted(changes))}): {fields['uri']}")
    else:
        log(f"model artifact {artifact['id']} already points at {fields['uri']}")
    return dict(artifact)


def uri_identity(uri: str) -> str:
    """12 hex digits naming the content: the image digest's, or a hash of a non-OCI URI."""
    match = re.search(r"@sha256:([0-9a-f]{64})$", uri)
    return match.group(1)[:12] if match else hashlib.sha256(uri.encode()).hexdigest()[:12]


def version_for(api: RegistryApi, model_id: str, name: str, artifact_name: str, uri: str) -> str:
    """The version name this URI registers under: `name`, unless that version holds another URI."""
    version = api.call("GET", "/model_version", query={"name": name, "parentResourceId": model_id})
    if version is None:
        return name
    artifact = find_artifact(api, str(version["id"]), artifact_name)
    if artifact is None or artifact.get("uri") == uri:
        return name
    suffixed = f"{name}-{uri_identity(uri)}"
    log(f"version {name!r} holds {artifact.get('uri')}; this image registers as version {suffixed!r} (never overwritten)")
    return suffixed


def model_uri(args: argparse.Namespace) -> str:
    uri = f"oci://{args.image}" if args.image else args.uri
    scheme = uri.partition("://")[0] if "://" in uri else ""
    if not scheme:
        raise StepError(f"model URI needs a scheme (oci://, s3://, ...): {uri}")
    if scheme == "oci" and not re.search(r"@sha256:[0-9a-f]{64}$", uri):
        raise StepError(f"OCI model URI must pin a digest (…@sha256:<64 hex>): {uri}")
    return uri


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--registry-url", required=True, help="model registry REST base, e.g. http://registry.ns.svc:8080")
    p.add_argument("--api-version", choices=("v1alpha3", "v1"), default="v1alpha3")
    p.add_argument("--token-file", type=Path, help="bearer token file, read at use time (service-account token)")
    p.add_argument("--tls-verify", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--ca-file", help="CA bundle for the registry (e.g. the service CA)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    p.add_argument("--retries", type=int, default=3, help="retries after connection errors and 5xx")
    p.add_argument("--retry-delay", type=float, default=2.0, help="first retry delay in seconds (doubles)")
    p.add_argument("--model-name", required=True)
    p.add_argument("--version", required=True, help="version name, unique within the model")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--image", help="registry/repo@sha256:... (registered as oci://...)")
    where.add_argument("--uri", help="full model URI, e.g. s3://bucket/prefix/")
    p.add_argument("--model-format-name", default="ModelCar")
    p.add_argument("--model-format-version", default="1")
    p.add_argument("--description", default="", help="registered model description")
    p.add_argument("--version-description", default="")
    p.add_argument("--author", default="ml-dev-env-pipeline")
    p.add_argument("--base-model", default="", help="e.g. mistralai/Mistral-Small-24B-Instruct-2501")
    p.add_argument("--quantization", default="none", help="quantization scheme, e.g. w4a16 or none")
    p.add_argument("--source", default="", help="where the weights came from, e.g. hf://org/name or s3://bucket/prefix")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE", help="extra version metadata (repeatable)")
    p.add_argument("--result-model-id", help="file to write the registered model id to (Tekton result)")
    p.add_argument("--result-version-id", help="file to write the model version id to (Tekton result)")
    p.add_argument("--result-version-name", help="file to write the version name registered under to (Tekton result)")
    args = p.parse_args(argv)
    for item in args.property:
        if "=" not in item or not item.partition("=")[0]:
            p.error(f"--property needs KEY=VALUE, got {item!r}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    uri = model_uri(args)
    tls = None
    if args.registry_url.startswith("https://"):
        # A secured RHOAI registry serves HTTPS (kube-rbac-proxy) with an OpenShift service-serving
        # certificate: --ca-file is then the pod's service-ca.crt. Empty: the system trust store.
        if args.ca_file and not Path(args.ca_file).is_file():
            raise StepError(f"--ca-file {args.ca_file}: no such file", EXIT_AUTH)
        tls = ssl.create_default_context(cafile=args.ca_file or None)
        if not args.tls_verify:
            tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    api = RegistryApi(args, tls)
    metadata = {"base_model": args.base_model, "quantization": args.quantization, "source": args.source, "format": args.model_format_name}
    metadata.update(item.split("=", 1) for item in args.property)
    properties = string_properties({k: v for k, v in metadata.items() if v})
    model = ensure_model(api, args.model_name, args.description)
    version_fields = {"author": args.author, "description": args.version_description, "customProperties": properties}
    version_name = version_for(api, str(model["id"]), args.version, args.model_name, uri)
    version = ensure_version(api, str(model["id"]), version_name, version_fields)
    artifact_fields = {
        "name": args.model_name,
        "uri": uri,
        "modelFormatName": args.model_format_name,
        "modelFormatVersion": args.model_format_version,
        "customProperties": properties,
    }
    ensure_artifact(api, str(version["id"]), artifact_fields)
    log(f"{args.model_name} {version_name} registered: {uri}")
    write_result(args.result_model_id, str(model["id"]))
    write_result(args.result_version_id, str(version["id"]))
    write_result(args.result_version_name, version_name)
