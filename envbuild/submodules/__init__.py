"""Git submodules as pins: what a pinned tree says about them (gitmodules), `lock update`'s reading of
them (reading), and `lock verify`'s checking of them (verify)."""
