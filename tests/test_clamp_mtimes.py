"""images/clamp-mtimes.sh.in, the tools' clamp every build step ends with, run in real BuildKit steps on the
engine's overlay storage: after it, a walk of the whole file system finds nothing the step changed still
at the clock's time, whatever way the step changed it, although the clamp itself walked only the
directories the step touched."""

from __future__ import annotations

import docker
import pytest

from envbuild.engine.client import Engine
from envbuild.image.render import load_template
from tests.lib.baseimage import BaseImage

EPOCH = 1_000_000_000

# Every way a step changes the file system: files and directories made deep below old ones, old files
# written in place (no directory above /usr/lib/os-release changes its mtime), a mode changed, old files removed and
# renamed, a symlink, an empty directory; then the clamp, then a full walk of what is still newer than
# the step's start (the clamp leaves out the mount points and the engine's own files, and so does the walk).
STEP = f"""
set -eu
since=$(($(date +%s) - 1))
stat -f -c 'root %T' /
mkdir -p /var/lib/envbuild-new/a/b && echo new > /var/lib/envbuild-new/a/b/file
echo appended >> /etc/debian_version
chmod 600 /etc/issue.net
rm /etc/issue
mv /etc/motd /etc/motd.moved
ln -s /nowhere /usr/local/bin/envbuild-link
mkdir /usr/local/share/envbuild-empty
echo '# deep, in place: no directory above it changes its mtime' >> /usr/lib/os-release
sh /mnt/in/clamp-mtimes {EPOCH} "$since"
set -- -e /.dockerenv -e /etc/mtab
while read -r _ _ _ _ point _; do set -- "$@" -e "$point"; done </proc/self/mountinfo
find / -xdev -newermt "@$since" -print0 | grep -zvxF "$@" | tr '\\0' '\\n' | sed 's/^/left /' || true
for path in /var/lib/envbuild-new/a/b/file /var/lib/envbuild-new /etc/debian_version /etc /usr/local/bin/envbuild-link \\
  /usr/local/share/envbuild-empty /usr/local/bin /usr/lib/os-release; do
  echo "clamped $(stat -c %Y "$path") $path"
done
"""


@pytest.mark.docker
def test_after_the_clamp_nothing_the_step_changed_keeps_the_clock_s_time(
    docker_client: docker.DockerClient, base_image: BaseImage
) -> None:
    engine = Engine(docker_client)
    out = engine.run_step(
        base_image.tag,
        ["sh", "-c", STEP],
        {"clamp-mtimes": load_template("clamp-mtimes.sh.in").encode()},
        mount="/mnt/in",
    )
    assert out.exit_code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "root overlayfs"  # the walk that enters only the directories the step changed
    assert [line for line in lines if line.startswith("left ")] == []
    clamped = [line.split(" ", 2) for line in lines if line.startswith("clamped ")]
    assert len(clamped) == 8 and all(int(mtime) == EPOCH for _, mtime, _ in clamped), clamped
