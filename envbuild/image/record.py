"""The build record: SLSA provenance v1 and a CycloneDX 1.5 SBOM. Pure; no clock unless given."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from packaging.utils import canonicalize_name

from envbuild import __version__
from envbuild.image.plan import ContextPlan, SourcePlan, SubmodulePlan

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/envbuild/envbuild/image/v1"
BUILDER_ID = "https://github.com/envbuild/envbuild/image@v1"
# uuid5 namespace for SBOM serial numbers: the same image always gets the same serial.
_SBOM_NAMESPACE = uuid.UUID("6f1d8a3e-3c55-5b8e-9d5a-0e6b2f9c7a41")


@dataclass(frozen=True)
class RecordedBuild:
    """What a build's record beside the lock is made of: the lock it was built from, its plan, the trees
    its sources were exported at, its Dockerfile, and the image as tagged (and pushed)."""

    lock_path: Path
    plan: ContextPlan
    trees: dict[str, str]  # source name -> git tree SHA of what was exported
    dockerfile_sha256: str
    image_id: str
    tags: tuple[str, ...]
    diff_ids: tuple[str, ...]  # the image's layers, base layers first
    pushed: tuple[tuple[str, str], ...]  # (tag, manifest digest)
    distro_removed: tuple[dict[str, Any], ...] = ()  # the base's distro distributions the lock's replace


@dataclass(frozen=True)
class BuildRecord:
    provenance: dict
    sbom: dict

    def files(self) -> dict[str, bytes]:
        """File name -> bytes, for writing next to the result."""
        return {
            "provenance.intoto.json": render_record_json(self.provenance),
            "sbom.cdx.json": render_record_json(self.sbom),
        }


def render_record_json(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1] if ":" in digest else digest


def package_purl(name: str, version: str) -> str:
    return f"pkg:pypi/{canonicalize_name(name)}@{quote(version, safe='.+!')}"


def written_submodules(source: SourcePlan) -> list[SubmodulePlan]:
    """The submodules whose files the image holds (skipped ones are the empty directories of their gitlinks)."""
    return [sub for sub in source.submodules if sub.skip is None]


def source_purl(source: SourcePlan) -> str:
    return f"pkg:generic/{source.name}@{source.commit}?vcs_url={quote('git+' + source.repo + '@' + source.commit, safe='')}"


def resolved_dependencies(plan: ContextPlan, trees: dict[str, str]) -> list[dict]:
    pin = {"digest": {"sha256": _hex(plan.base_digest)}} if plan.base_digest else {"annotations": {"unpinned": True}}
    deps: list[dict] = [{"name": "base_image", "uri": f"docker://{plan.base_name}", **pin}]
    for source in plan.sources:
        tree = trees.get(source.name) or source.tree
        deps.append(
            {
                "name": source.name,
                "uri": f"git+{source.repo}@refs/{'tags' if source.ref_type == 'tag' else 'heads'}/{source.ref}",
                "digest": {"gitCommit": source.commit},
                "annotations": {"install": source.mode, "ref_type": source.ref_type}
                | ({"gitTree": tree} if tree else {}),
            }
        )
        for sub in written_submodules(source):
            assert sub.repo is not None and sub.commit is not None
            deps.append(
                {
                    "name": f"{source.name}/{sub.path}",
                    "uri": f"git+{sub.repo}",
                    "digest": {"gitCommit": sub.commit},
                    "annotations": {"submodule_of": source.name, "path": sub.path}
                    | ({"gitTree": sub.tree} if sub.tree else {}),
                }
            )
    for file in (*plan.files, *((plan.installer,) if plan.installer else ())):
        deps.append(
            {"name": file.filename, "uri": package_purl(file.package, file.version), "digest": {"sha256": file.sha256}}
            # the installer: what installed the packages, a build tool, in no layer
            | ({"annotations": {"role": "installer"}} if file is plan.installer else {})
        )
    return deps


def provenance(
    plan: ContextPlan,
    *,
    image_id: str,
    lock_path: str,
    tags: Sequence[str] = (),
    trees: dict[str, str] | None = None,
    dockerfile_sha256: str | None = None,
) -> dict:
    """An in-toto Statement v1 with a SLSA provenance v1 predicate for the image *image_id*."""
    subject_name = (
        tags[0].rsplit(":", 1)[0]
        if tags and ":" in tags[0].rsplit("/", 1)[-1]
        else (tags[0] if tags else plan.lock_name)
    )
    internal: dict = {"source_date_epoch": plan.epoch, "layer_order": [s.name for s in plan.sources]}
    if dockerfile_sha256:
        internal["dockerfile_sha256"] = dockerfile_sha256
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {
                "name": subject_name,
                "digest": {"sha256": _hex(image_id)},
                **({"annotations": {"tags": sorted(tags)}} if tags else {}),
            }
        ],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"lock": {"path": lock_path, "sha256": plan.lock_sha256}, "tags": sorted(tags)},
                "internalParameters": internal,
                "resolvedDependencies": resolved_dependencies(plan, trees or {}),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"envbuild": __version__}},
                "metadata": {"invocationId": f"{plan.lock_sha256}:{_hex(image_id)}"},
            },
        },
    }


def sbom(plan: ContextPlan, *, image_id: str, image_name: str | None = None, timestamp: str | None = None) -> dict:
    """A CycloneDX 1.5 SBOM of the image: the lock's packages and sources."""
    by_package: dict[tuple[str, str], list[str]] = {}
    for file in plan.files:
        by_package.setdefault((canonicalize_name(file.package), file.version), []).append(file.sha256)
    components = [
        _component(package_purl(name, version), name, version, "SHA-256", *sorted(hashes))
        for (name, version), hashes in sorted(by_package.items())
    ]
    for source in sorted(plan.sources, key=lambda s: s.name):
        components.append(
            _component(
                source_purl(source),
                source.name,
                source.commit,
                "SHA-1",
                source.commit,
                externalReferences=[_vcs(source.repo, source.commit, f"{source.ref_type} {source.ref}")],
                properties=[{"name": "envbuild:install", "value": source.mode}],
            )
        )
        for sub in written_submodules(source):
            assert sub.repo is not None and sub.commit is not None
            name = f"{source.name}/{sub.path}"
            purl = f"pkg:generic/{quote(name, safe='')}@{sub.commit}?vcs_url={quote('git+' + sub.repo + '@' + sub.commit, safe='')}"
            components.append(
                _component(
                    purl,
                    name,
                    sub.commit,
                    "SHA-1",
                    sub.commit,
                    externalReferences=[_vcs(sub.repo, sub.commit, "submodule")],
                    properties=[{"name": "envbuild:submodule-of", "value": source.name}],
                )
            )
    metadata: dict = {
        "component": {
            "type": "container",
            "bom-ref": image_id,
            "name": image_name or plan.lock_name,
            "version": image_id,
        },
        "tools": {"components": [{"type": "application", "name": "envbuild", "version": __version__}]},
        "properties": [{"name": "envbuild:lock_sha256", "value": plan.lock_sha256}],
    }
    if timestamp:
        metadata["timestamp"] = timestamp
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid5(_SBOM_NAMESPACE, image_id + plan.lock_sha256)}",
        "version": 1,
        "metadata": metadata,
        "components": components,
        "dependencies": [{"ref": image_id, "dependsOn": [c["bom-ref"] for c in components]}],
    }


def _component(purl: str, name: str, version: str, alg: str, *hashes: str, **more: Any) -> dict[str, Any]:
    """A library of the SBOM, referred to by its purl; ``more``: its other fields."""
    hashed = [{"alg": alg, "content": content} for content in hashes]
    return {
        "type": "library",
        "bom-ref": purl,
        "name": name,
        "version": version,
        "purl": purl,
        "hashes": hashed,
        **more,
    }


def _vcs(repo: str, commit: str, comment: str) -> dict[str, str]:
    return {"type": "vcs", "url": f"git+{repo}@{commit}", "comment": comment}


def build_record(
    plan: ContextPlan,
    *,
    image_id: str,
    lock_path: str,
    tags: Sequence[str] = (),
    trees: dict[str, str] | None = None,
    dockerfile_sha256: str | None = None,
) -> BuildRecord:
    return BuildRecord(
        provenance(
            plan, image_id=image_id, lock_path=lock_path, tags=tags, trees=trees, dockerfile_sha256=dockerfile_sha256
        ),
        sbom(plan, image_id=image_id, image_name=tags[0] if tags else None),
    )


def build_summary(build: RecordedBuild) -> dict:
    """build.json: the lock, the image and every input it was built from."""
    plan, trees = build.plan, build.trees
    inputs: list[dict[str, Any]] = [{"kind": "base_image", "name": plan.base_name, "digest": plan.base_digest}]
    inputs += [
        {
            "kind": "source",
            "name": s.name,
            "repo": s.repo,
            "ref": s.ref,
            "ref_type": s.ref_type,
            "commit": s.commit,
            "tree": trees.get(s.name, s.tree),
            "install": s.mode,
        }
        for s in plan.sources
    ]
    inputs += [
        {"kind": "submodule", "name": f"{s.name}/{sub.path}", "repo": sub.repo, "commit": sub.commit, "tree": sub.tree}
        for s in plan.sources
        for sub in written_submodules(s)
    ]
    inputs += [
        {"kind": "package_file", "name": f.package, "version": f.version, "filename": f.filename, "sha256": f.sha256}
        for f in plan.files
    ]
    if (i := plan.installer) is not None:
        inputs.append(
            {"kind": "installer", "name": i.package, "version": i.version, "filename": i.filename, "sha256": i.sha256}
        )
    inputs.append({"kind": "dockerfile", "name": "Dockerfile", "sha256": build.dockerfile_sha256})
    return {
        "lock": {"path": str(build.lock_path), "sha256": plan.lock_sha256, "name": plan.lock_name},
        "image_id": build.image_id,
        "tags": sorted(build.tags),
        "diff_ids": list(build.diff_ids),
        "source_date_epoch": plan.epoch,
        "inputs": inputs,
        "pushed": [{"tag": tag, "digest": digest} for tag, digest in sorted(build.pushed)],
        # The base's distro-managed distributions (a Debian-family /usr/lib/python3/dist-packages) that the
        # lock pins too: removed by envbuild's layer, so that Python finds one copy, the lock's.
        "base_distributions_removed": [dict(d) for d in build.distro_removed],
    }
