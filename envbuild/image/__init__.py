"""`envbuild image`: a verified lock → a checked, normalised image, in two parts.

The build's stages, here, in the order a build runs them; each hands the next a typed value, and only
the engine (:mod:`envbuild.engine`, not here) talks to a daemon:

1. :mod:`.plan`: the lock → where everything goes in the image, a :class:`ContextPlan` (pure)
2. :mod:`.render`: the plan → the Dockerfiles and scripts the engine's BuildKit runs, as text (pure)
3. :mod:`.assemble`: the context on disk, every file and tree checked (the trees kept by :mod:`.treestore`)
4. :mod:`.stream`: what BuildKit receives for each of its builds (the lock's uv: :mod:`.installer`)
5. :mod:`.base`: the base image on the engine, for the lock's platform
6. :mod:`.packages_image`: the base with the lock's packages installed, in no layer a package file; or reused
7. :mod:`.inimage_probe` + :mod:`.inimage_verdict`: the built image checked from inside, judged on the host
8. :mod:`.normalise` + :mod:`.normalised_config`: only the config rewritten (:mod:`.checked`: 7, then 8)
9. :mod:`.record`: the image's provenance, SBOM and ``build.json`` (pure)
10. :mod:`.result`: what a build returns, and its record written beside the lock

The cache of built images, :mod:`envbuild.image.cache`: what answers a rebuild and keeps the engine and
the disk tidy. It imports the stages; no stage imports it. :mod:`.build` runs the stages in this order
(the engine builds the image from 4's stream on 6), asks the cache first and tells it last.
"""
