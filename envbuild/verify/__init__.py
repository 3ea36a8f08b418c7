"""`lock verify`: every pin of a lock checked against its upstream, one typed result each.

:mod:`.pins` runs the whole verify; :mod:`.sources` checks git source pins, :mod:`.submodules` their
submodules, :mod:`.packages` the package files on their index, :mod:`.closure` (from the core metadata
:mod:`.metadata` reads) that every requirement is met or waived, :mod:`.buildcheck` what a build needs
before it starts; :mod:`.results` are the typed verdicts and :mod:`.render` their table (pure).
"""
