"""Git access for envbuild: :mod:`envbuild.git.process` starts git (hardened, bounded, tied to our
lifetime), :mod:`envbuild.git.remote` knows the commands, :mod:`envbuild.git.cache` keeps the bare
repositories that source verification reads; :mod:`.mirrors` rewrites their URLs, :mod:`.files` reads a
few files of a pinned tree, :mod:`.gitmodules` reads what a tree says about its submodules (pure),
:mod:`.treeexport` and :mod:`.treewriter` write a pinned tree into a directory."""
