"""The package index, and the files it serves: :mod:`.client` is the only code that talks to an index
(PEP 503/691 pages, PEP 658 metadata, range reads, downloads), :mod:`.pages` reads its pages into typed
values (pure), :mod:`.filecache` keeps the files it served by sha256."""
