"""Render the kustomize tree under ``deploy/kustomize`` into Kubernetes documents.

Two engines give the same result:

* ``kubectl``: ``kubectl kustomize DIR`` (kustomize is built into kubectl), used when a kubectl
  binary is on ``PATH``.
* ``python``: a small renderer for **exactly** the kustomization features this tree uses, so CI
  can render and validate the manifests on a machine that has no kubectl or kustomize binary
  (none is installable from the package registries CI reaches).

The Python engine supports these kustomization fields and nothing else; any other field is a
:class:`RenderError`, never silently ignored:

* ``resources``: YAML files, or directories holding a ``kustomization.yaml`` (built recursively).
* ``patches``: strategic-merge patches given by ``path`` or inline ``patch``, without ``target``
  (the patch's own apiVersion/kind/name select the one resource it applies to). List merge keys
  follow the Kubernetes API for the lists used here (containers, env, volumes, ports, ...);
  ``null`` deletes a key and ``$patch: delete`` / ``$patch: replace`` are honoured.
* ``namespace``: set on every namespaced resource.
* ``replicas``: ``spec.replicas`` of the named Deployment or StatefulSet.
* ``images``: ``newName`` / ``newTag`` / ``digest`` for container and init-container images.

Transformers run in kustomize's order: patches, namespace, replicas, images.
``tests/deploy/test_manifests.py`` renders every kustomization with both engines and requires
identical output whenever kubectl is available.

Usage::

    python -m deploy.render deploy/kustomize/overlays/production [--engine python]
"""

from __future__ import annotations

import argparse
import copy
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

Document = dict[str, Any]
Engine = Literal["auto", "python", "kubectl"]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = frozenset(
    {"apiVersion", "kind", "resources", "patches", "namespace", "replicas", "images"}
)

# Kinds that are not namespaced, among those a kustomization here could plausibly hold.
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PersistentVolume",
        "PriorityClass",
        "StorageClass",
        "IngressClass",
        "RuntimeClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
)

# Strategic-merge list keys (``x-kubernetes-patch-merge-key`` in the Kubernetes API) for the
# list fields a patch here may touch. Lists not named here are replaced whole, as atomic lists
# are by kustomize.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
}

# Legacy output order of kustomize (kinds not listed sort after these, by kind name).
KIND_ORDER = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
)


class RenderError(Exception):
    """A kustomization cannot be rendered (unsupported feature, bad reference, tool failure)."""


def resource_id(doc: Document) -> tuple[str, str, str, str]:
    """Identify a resource the way kustomize does: group/version, kind, namespace, name.

    Args:
        doc: A Kubernetes object.

    Returns:
        ``(apiVersion, kind, namespace, name)``, namespace ``""`` when unset.
    """
    meta = doc.get("metadata") or {}
    return (
        str(doc.get("apiVersion", "")),
        str(doc.get("kind", "")),
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
    )


def find_kubectl() -> str | None:
    """Return the absolute path of a kubectl binary on ``PATH``, or ``None``."""
    return shutil.which("kubectl")


def render(path: Path, engine: Engine = "auto") -> list[Document]:
    """Render the kustomization in ``path``.

    Args:
        path: A directory holding a ``kustomization.yaml``.
        engine: ``"kubectl"``, ``"python"``, or ``"auto"`` (kubectl when present, else Python).

    Returns:
        The rendered documents.

    Raises:
        RenderError: The kustomization is invalid, uses an unsupported feature, or the
            requested kubectl is missing or fails.
    """
    if engine == "python":
        return render_python(path)
    kubectl = find_kubectl()
    if kubectl is None:
        if engine == "kubectl":
            raise RenderError("kubectl is not on PATH")
        return render_python(path)
    return render_kubectl(path, kubectl)


def render_kubectl(path: Path, kubectl: str) -> list[Document]:
    """Render with ``kubectl kustomize``.

    Args:
        path: A directory holding a ``kustomization.yaml``.
        kubectl: Absolute path of the kubectl binary.

    Returns:
        The rendered documents.

    Raises:
        RenderError: kubectl exits non-zero.
    """
    # Fixed argv (absolute binary path, a directory from this repository), no shell.
    result = subprocess.run(  # noqa: S603
        [kubectl, "kustomize", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        raise RenderError(f"kubectl kustomize {path} failed: {result.stderr.strip()}")
    return _load_documents(result.stdout, f"kubectl kustomize {path}")


def render_python(path: Path) -> list[Document]:
    """Render with the built-in renderer (see the module docstring for what it supports).

    Args:
        path: A directory holding a ``kustomization.yaml``.

    Returns:
        The rendered documents, in kustomize's legacy kind order.

    Raises:
        RenderError: The kustomization is invalid or uses an unsupported feature.
    """
    return sort_documents(_build(path.resolve(), ()))


def sort_documents(docs: Iterable[Document]) -> list[Document]:
    """Order documents like kustomize's legacy sort: by kind rank, then kind, namespace, name."""
    rank = {kind: index for index, kind in enumerate(KIND_ORDER)}

    def key(doc: Document) -> tuple[int, str, str, str]:
        _, kind, namespace, name = resource_id(doc)
        return (rank.get(kind, len(KIND_ORDER)), kind, namespace, name)

    return sorted(docs, key=key)


def _build(directory: Path, stack: tuple[Path, ...]) -> list[Document]:
    if directory in stack:
        raise RenderError(f"kustomization cycle through {directory}")
    kustomization = _read_kustomization(directory)
    unsupported = sorted(set(kustomization) - SUPPORTED_FIELDS)
    if unsupported:
        raise RenderError(
            f"{directory}: kustomization fields {unsupported} are not supported by "
            "deploy/render.py (use kubectl kustomize, or extend the renderer and its tests)"
        )

    docs: list[Document] = []
    for entry in kustomization.get("resources") or []:
        target = (directory / str(entry)).resolve()
        if target.is_dir():
            docs.extend(_build(target, (*stack, directory)))
        elif target.is_file():
            docs.extend(_load_documents(target.read_text(encoding="utf-8"), str(target)))
        else:
            raise RenderError(f"{directory}: resource {entry!r} does not exist")
    _check_unique(docs, directory)

    for patch in _load_patches(directory, kustomization.get("patches") or []):
        _apply_patch(docs, patch, directory)
    namespace = kustomization.get("namespace")
    if namespace is not None:
        for doc in docs:
            if doc.get("kind") not in CLUSTER_SCOPED_KINDS:
                doc.setdefault("metadata", {})["namespace"] = str(namespace)
    for replica in kustomization.get("replicas") or []:
        _apply_replicas(docs, replica, directory)
    for image in kustomization.get("images") or []:
        _apply_image(docs, image, directory)
    _check_unique(docs, directory)
    return docs


def _read_kustomization(directory: Path) -> dict[str, Any]:
    for name in KUSTOMIZATION_FILES:
        candidate = directory / name
        if candidate.is_file():
            loaded = yaml.safe_load(candidate.read_text(encoding="utf-8"))
            if not isinstance(loaded, dict):
                raise RenderError(f"{candidate}: not a mapping")
            kind = loaded.get("kind", "Kustomization")
            if kind != "Kustomization":
                raise RenderError(f"{candidate}: kind {kind!r} is not supported")
            return loaded
    raise RenderError(f"{directory}: no kustomization.yaml")


def _load_documents(text: str, origin: str) -> list[Document]:
    docs: list[Document] = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise RenderError(f"{origin}: every document needs apiVersion and kind")
        if doc["kind"] == "List":
            raise RenderError(f"{origin}: List documents are not supported")
        docs.append(doc)
    return docs


def _check_unique(docs: Sequence[Document], directory: Path) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for doc in docs:
        ident = resource_id(doc)
        if ident in seen:
            raise RenderError(f"{directory}: resource {ident} is defined more than once")
        seen.add(ident)


def _load_patches(directory: Path, entries: Sequence[Any]) -> list[Document]:
    patches: list[Document] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise RenderError(f"{directory}: a patch entry must be a mapping")
        unsupported = sorted(set(entry) - {"path", "patch"})
        if unsupported or len(entry) != 1:
            raise RenderError(
                f"{directory}: patch entry {entry!r} needs exactly one of path/patch "
                "(target and options are not supported by deploy/render.py)"
            )
        if "path" in entry:
            text = (directory / str(entry["path"])).read_text(encoding="utf-8")
            origin = str(directory / str(entry["path"]))
        else:
            text = str(entry["patch"])
            origin = f"{directory}: inline patch"
        patches.extend(_load_documents(text, origin))
    return patches


def _apply_patch(docs: list[Document], patch: Document, directory: Path) -> None:
    api_version, kind, namespace, name = resource_id(patch)
    matches = [
        index
        for index, doc in enumerate(docs)
        if resource_id(doc)[1] == kind
        and resource_id(doc)[3] == name
        and _same_group(resource_id(doc)[0], api_version)
        and (not namespace or resource_id(doc)[2] == namespace)
    ]
    if len(matches) != 1:
        raise RenderError(
            f"{directory}: patch for {kind}/{name} matches {len(matches)} resources, needs 1"
        )
    index = matches[0]
    merged = strategic_merge(docs[index], patch)
    if not isinstance(merged, dict):
        raise RenderError(f"{directory}: patch for {kind}/{name} does not yield an object")
    docs[index] = merged


def _same_group(left: str, right: str) -> bool:
    def group(api_version: str) -> str:
        return api_version.rpartition("/")[0]

    return group(left) == group(right)


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """Apply a strategic-merge ``patch`` to ``base`` and return the result (inputs unchanged).

    Args:
        base: The current value.
        patch: The patch value.
        field: The name of the field holding these values (selects the list merge key).

    Returns:
        The merged value.
    """
    if isinstance(base, dict) and isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            if key.startswith("$"):
                raise RenderError(f"patch directive {key!r} is not supported")
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = _strip_directives(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list):
        merge_key = _merge_key(field, base, patch)
        if merge_key is None:
            return _strip_directives(patch)
        return _merge_list(base, patch, merge_key)
    return _strip_directives(patch)


def _merge_key(field: str, base: list[Any], patch: list[Any]) -> str | None:
    items = [item for item in (*base, *patch) if isinstance(item, dict)]
    if len(items) != len(base) + len(patch):
        return None
    if field == "ports":
        # Container ports merge on containerPort, Service ports on port.
        return "containerPort" if any("containerPort" in item for item in items) else "port"
    return MERGE_KEYS.get(field)


def _merge_list(base: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    merged = copy.deepcopy(base)
    for item in patch:
        if merge_key not in item:
            raise RenderError(f"patch list item {item!r} lacks its merge key {merge_key!r}")
        positions = [i for i, old in enumerate(merged) if old.get(merge_key) == item[merge_key]]
        directive = item.get("$patch")
        if directive == "delete":
            for position in reversed(positions):
                del merged[position]
        elif positions:
            merged[positions[0]] = strategic_merge(merged[positions[0]], item)
        else:
            merged.append(_strip_directives(item))
    return merged


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        if "$patch" in value and value["$patch"] != "replace":
            raise RenderError(f"patch directive {value['$patch']!r} is not supported here")
        return {
            key: _strip_directives(item)
            for key, item in value.items()
            if key != "$patch" and item is not None
        }
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return copy.deepcopy(value)


def _apply_replicas(docs: list[Document], replica: Any, directory: Path) -> None:
    if not isinstance(replica, dict) or set(replica) != {"name", "count"}:
        raise RenderError(f"{directory}: replicas entry {replica!r} needs exactly name and count")
    matched = False
    for doc in docs:
        if doc.get("kind") in {"Deployment", "StatefulSet", "ReplicaSet"} and (
            resource_id(doc)[3] == replica["name"]
        ):
            doc.setdefault("spec", {})["replicas"] = int(replica["count"])
            matched = True
    if not matched:
        raise RenderError(f"{directory}: replicas entry {replica['name']!r} matches nothing")


def _apply_image(docs: list[Document], image: Any, directory: Path) -> None:
    allowed = {"name", "newName", "newTag", "digest"}
    if not isinstance(image, dict) or "name" not in image or set(image) - allowed:
        raise RenderError(f"{directory}: images entry {image!r} is not supported")
    for doc in docs:
        for container in _containers(doc):
            reference = container.get("image")
            if isinstance(reference, str):
                container["image"] = _retag(reference, image)


def _containers(node: Any) -> Iterable[dict[str, Any]]:
    """Yield every container and init container anywhere inside ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in {"containers", "initContainers"} and isinstance(value, list):
                yield from (item for item in value if isinstance(item, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def split_image(reference: str) -> tuple[str, str | None, str | None]:
    """Split an image reference into name, tag and digest.

    Args:
        reference: For example ``registry:5000/team/app:1.2@sha256:...``.

    Returns:
        ``(name, tag, digest)``; tag and digest ``None`` when absent.
    """
    name, _, digest = reference.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag: str | None = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest or None


def _retag(reference: str, image: dict[str, Any]) -> str:
    name, tag, digest = split_image(reference)
    if name != image["name"]:
        return reference
    if "newName" in image:
        name = str(image["newName"])
    if "digest" in image:
        return f"{name}@{image['digest']}"
    if "newTag" in image:
        tag, digest = str(image["newTag"]), None
    result = name
    if tag is not None:
        result += f":{tag}"
    if digest is not None:
        result += f"@{digest}"
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Print the rendered kustomization as a YAML stream.

    Args:
        argv: Command-line arguments (defaults to ``sys.argv[1:]``).

    Returns:
        The process exit status.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path", type=Path, help="directory holding a kustomization.yaml")
    parser.add_argument("--engine", choices=("auto", "python", "kubectl"), default="auto")
    args = parser.parse_args(argv)
    try:
        docs = render(args.path, args.engine)
    except RenderError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
