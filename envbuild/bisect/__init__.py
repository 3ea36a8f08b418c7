"""`envbuild bisect GOOD BAD`: which change from a lock that passed to one that fails breaks it, and for a
source, its first bad commit. :mod:`.steps` (the changes, the states between, the search; pure),
:mod:`.history` (a source's commits between its pins, from the git cache), :mod:`.run` (each state built and
judged), :mod:`.result` (the typed result) and :mod:`.report` (text and Markdown; pure)."""
