"""`lock update`: move pins to what their refs name upstream now, and re-resolve the package closure.

:mod:`.update` runs the whole update and :mod:`.rewrite` writes it over a lock file (with its change report);
:mod:`.read_requirements` reads what each source declares it needs from its pinned tree (:mod:`.declared`,
:mod:`.reqfile`: no upstream code runs), :mod:`.read_submodules` its submodules, :mod:`.roots` turns those
requirements into the resolver's roots and :mod:`.resolve` resolves the closure with uv and lists every
installable file with its sha256.
"""
