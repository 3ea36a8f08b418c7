"""The cache of built images: what answers a rebuild of a lock, and what keeps the engine and the disk tidy.

Apart from the build's stages (:mod:`envbuild.image`), above them: it imports the stages' types and
functions (the plan, the rendering, the record), and no stage imports it; :mod:`envbuild.image.build`
asks it first and tells it last.

- :mod:`.ledger`: ``built/<lock sha256>.json``, each lock built and checked, and the image it made
- :mod:`.answer`: a rebuild of such a lock answered from the ledger: tagged again, its record written,
  nothing assembled or sent (``noop``)
- :mod:`.normalised_map`: ``normalized.json``, the raw images that passed the in-image check and the
  normalised image made from each: a rebuild BuildKit answers from its own cache skips normalising and
  checking
- :mod:`.scratch`: ``work/``, each running build's scratch directory, and ``locks/``, one lock per lock
  name while a build of it uses the engine
- :mod:`.retention`: what stays in the engine after a build, and BuildKit's own cache bounded

Paths are under ``<cache_dir>/image``; beside them, the stages keep their own: ``trees/`` (each source's
tree exported once per commit, :mod:`envbuild.image.treestore`) and ``sync/`` (the docker CLI's copy of
each build's context, :func:`envbuild.image.stream.sync_dir`).
"""
