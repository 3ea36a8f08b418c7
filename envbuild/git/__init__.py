"""Git access for envbuild: :mod:`envbuild.git.process` starts git (hardened, bounded, tied to our
lifetime), :mod:`envbuild.git.remote` knows the commands, :mod:`envbuild.git.cache` keeps the bare
repositories that source verification reads."""

from envbuild.git.cache import GitCache
from envbuild.git.remote import GitError, GitRunner, RefListing

__all__ = ["GitCache", "GitError", "GitRunner", "RefListing"]
