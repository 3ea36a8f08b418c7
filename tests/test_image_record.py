"""The build record: SLSA provenance v1 and CycloneDX 1.5, complete and deterministic."""

from __future__ import annotations

import dataclasses
import json

from envbuild.image.plan import plan_context
from envbuild.image.record import build_record, provenance, sbom
from tests.lib.tinylock import DIGEST, LOCK_SHA, tiny_lock

IMAGE_ID = "sha256:" + "12" * 32


def plan():
    return plan_context(tiny_lock(), lock_sha256=LOCK_SHA)


def test_provenance_has_the_slsa_v1_shape_and_every_input() -> None:
    lock = tiny_lock()
    statement = provenance(
        plan(), image_id=IMAGE_ID, lock_path="locks/tiny.lock.yaml", tags=["reg/tiny:1"], trees={"core": "7" * 40}
    )
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [
        {"name": "reg/tiny", "digest": {"sha256": "12" * 32}, "annotations": {"tags": ["reg/tiny:1"]}}
    ]
    definition = statement["predicate"]["buildDefinition"]
    assert set(definition) == {"buildType", "externalParameters", "internalParameters", "resolvedDependencies"}
    assert definition["externalParameters"]["lock"] == {"path": "locks/tiny.lock.yaml", "sha256": LOCK_SHA}
    assert definition["internalParameters"]["source_date_epoch"] == 1700000000
    deps = definition["resolvedDependencies"]
    assert all(("uri" in d or "digest" in d) for d in deps)
    assert deps[0] == {
        "name": "base_image",
        "uri": "docker://127.0.0.1:5000/envbuild-test/base:bookworm-cann9.1.0",
        "digest": {"sha256": DIGEST.split(":")[1]},
    }
    sources = {d["name"]: d for d in deps if "gitCommit" in d.get("digest", {})}
    assert {s.name: s.commit for s in lock.sources} == {n: d["digest"]["gitCommit"] for n, d in sources.items()}
    assert sources["core"]["uri"] == "git+https://example.org/core.git@refs/tags/v1.0"
    assert sources["engine"]["uri"] == "git+https://example.org/engine.git@refs/heads/main"
    assert sources["core"]["annotations"]["gitTree"] == "7" * 40
    files = {
        d["name"]: d["digest"]["sha256"] for d in deps if "sha256" in d.get("digest", {}) and d["name"] != "base_image"
    }
    assert files == {f.filename: f.sha256 for p in lock.packages for f in p.files}
    builder = statement["predicate"]["runDetails"]["builder"]
    assert builder["id"] and "startedOn" not in statement["predicate"]["runDetails"]["metadata"]


def test_sbom_is_cyclonedx_1_5_with_packages_and_sources() -> None:
    bom = sbom(plan(), image_id=IMAGE_ID, image_name="reg/tiny:1")
    assert (bom["bomFormat"], bom["specVersion"], bom["version"]) == ("CycloneDX", "1.5", 1)
    assert bom["serialNumber"].startswith("urn:uuid:") and "timestamp" not in bom["metadata"]
    assert bom["metadata"]["component"]["type"] == "container"
    by_purl = {c["purl"]: c for c in bom["components"]}
    assert by_purl["pkg:pypi/tiny-pkg@1.0"]["hashes"] == [{"alg": "SHA-256", "content": "e" * 64}]
    assert [h["content"] for h in by_purl["pkg:pypi/another@2.0"]["hashes"]] == ["a" * 64, "f" * 64]
    sources = [c for c in bom["components"] if c["purl"].startswith("pkg:generic/")]
    assert {c["name"]: c["version"] for c in sources} == {s.name: s.commit for s in tiny_lock().sources}
    core = next(c for c in sources if c["name"] == "core")
    assert core["externalReferences"] == [
        {"type": "vcs", "url": f"git+https://example.org/core.git@{'1' * 40}", "comment": "tag v1.0"}
    ]
    assert len({c["bom-ref"] for c in bom["components"]}) == len(bom["components"])
    assert bom["dependencies"][0]["dependsOn"] == [c["bom-ref"] for c in bom["components"]]
    assert (
        sbom(plan(), image_id=IMAGE_ID, timestamp="2026-01-01T00:00:00Z")["metadata"]["timestamp"]
        == "2026-01-01T00:00:00Z"
    )


def test_record_is_deterministic_and_follows_the_inputs() -> None:
    first = build_record(plan(), image_id=IMAGE_ID, lock_path="tiny.lock.yaml", tags=["reg/tiny:1"]).files()
    second = build_record(plan(), image_id=IMAGE_ID, lock_path="tiny.lock.yaml", tags=["reg/tiny:1"]).files()
    assert first == second and set(first) == {"provenance.intoto.json", "sbom.cdx.json"}
    assert json.loads(first["sbom.cdx.json"])["specVersion"] == "1.5"
    other = build_record(
        plan(), image_id="sha256:" + "34" * 32, lock_path="tiny.lock.yaml", tags=["reg/tiny:1"]
    ).files()
    assert all(first[name] != other[name] for name in first)


def test_unpinned_base_is_recorded_as_such() -> None:
    lock = tiny_lock()
    unpinned = dataclasses.replace(lock, base_image=dataclasses.replace(lock.base_image, digest=None))
    statement = provenance(
        plan_context(unpinned, lock_sha256=LOCK_SHA, allow_unpinned=True), image_id=IMAGE_ID, lock_path="x"
    )
    base = statement["predicate"]["buildDefinition"]["resolvedDependencies"][0]
    assert base["annotations"] == {"unpinned": True} and "digest" not in base
